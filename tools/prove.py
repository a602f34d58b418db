"""An SMT proof, for every ring size and every ring of the family, of the schedule and its invariants.

``make prove`` runs this.  The schedule family (``ring_ref.schedule.RingSchedule``:
direction ``d = ±1``, offset ``k``), the closed-form invariants and one round of
the core's update are restated here as *linear integer arithmetic* over
symbolic ``n >= 2``, an offset ``0 <= k < n``, a direction ``d`` in ``{+1, -1}``,
a round ``r``, a worker ``i`` and a chunk slot ``c``, with no bound on ``n``; Z3
proves each obligation by showing its negation unsatisfiable (spec clause
``proof-all-n``).  The spec's ring is the member ``d = +1, k = 0``.  Three devices
keep every query decidable:

* ``d * x`` is written ``ite(d = 1, x, -x)``, so no product of two unknowns occurs.
* ``x mod n`` is only taken of operands known to lie in ``[lo*n, hi*n)`` for
  small constants ``lo, hi``, and is encoded as the case split
  ``ite(x < (lo+1) n, x - lo n, ite(...))``.  Each such range claim is recorded
  and proved alongside the obligation that uses it.
* Every slot of every state the closed forms describe holds a *d-arc*: the
  contributions ``s, s+d, ..., s+(l-1)d (mod n)``.  A slot is therefore a pair
  ``(start, length)`` plus a flag ``arc`` that says whether the value really is
  that d-arc.  The reduce-scatter update concatenates the incoming value with
  the receiver's own; the concatenation of two d-arcs is the d-arc
  ``(s1, l1 + l2)`` exactly when the second starts where the first ends,
  ``s2 = (s1 + d l1) mod n`` (contiguity); otherwise it is no d-arc at all (a
  prefix and a suffix of a d-arc are d-arcs).  Equality with an expected d-arc
  is then equality of the pairs, which is exact: no over-approximation, so
  every counterexample is a real one.

The same functions build Z3 terms (:class:`Z3Ops`) and evaluate numpy arrays
(:class:`NumpyOps`): ``tests/cover/test_proof.py`` evaluates every encoded
closed form against ``ring_ref.schedule`` and ``ring_ref.invariants``, which
ties this restatement to the code.  This module imports nothing from
``ring_ref``.

The core is modelled in two flavours: *buffered* (every send reads the state at
the start of the round, which is what ``ring_ref.core.exchange`` does) and
*in-place* (workers update one buffer in the order ``0 .. n-1``, so a sender may
already have written this round); both are proved.  :data:`FAULTS` plants
schedule faults (the four of the stateful tests, and three of the family); the
prover must refute each with a concrete counterexample ``(n, k, d, r, i, c)``.

Usage::

    python tools/prove.py                  # prove every obligation; prints times
    python tools/prove.py --fault NAME     # show the counterexamples for a planted fault
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, NamedTuple

import numpy as np
import z3

Term = Any
"""A Z3 expression, a numpy array or a plain int/bool: whatever the :class:`Ops` in use builds."""

Phase = Literal["reduce-scatter", "all-gather"]
RS: Final = "reduce-scatter"
AG: Final = "all-gather"


class Ops:
    """Boolean and case-split operations over one kind of term; records range claims."""

    true: Term = True

    def __init__(self) -> None:
        self.claims: list[Term] = []

    def ite(self, cond: Term, a: Term, b: Term) -> Term:
        raise NotImplementedError

    def and_(self, *conds: Term) -> Term:
        raise NotImplementedError

    def or_(self, *conds: Term) -> Term:
        raise NotImplementedError

    def not_(self, cond: Term) -> Term:
        raise NotImplementedError

    def claim(self, cond: Term, what: str) -> None:
        """Record a fact the encoding relies on (a mod operand's range, an exactness guard)."""
        raise NotImplementedError

    def mod(self, x: Term, n: Term, lo: int, hi: int) -> Term:
        """``x mod n`` for ``lo*n <= x < hi*n``, as a linear case split (the range is claimed)."""
        self.claim(self.and_(lo * n <= x, x < hi * n), f"{lo}n <= x < {hi}n")
        result = x - (hi - 1) * n
        for k in range(hi - 2, lo - 1, -1):
            result = self.ite(x < (k + 1) * n, x - k * n, result)
        return result

    def times(self, d: Term, x: Term) -> Term:
        """``d * x`` for a direction ``d`` in ``{+1, -1}``, without multiplying two unknowns."""
        return self.ite(d == 1, x, -x)


class Z3Ops(Ops):
    """Builds Z3 terms; claims become extra proof goals."""

    true: Term = z3.BoolVal(True)

    def ite(self, cond: Term, a: Term, b: Term) -> Term:
        return z3.If(cond, a, b)

    def and_(self, *conds: Term) -> Term:
        return z3.And(*conds)

    def or_(self, *conds: Term) -> Term:
        return z3.Or(*conds)

    def not_(self, cond: Term) -> Term:
        return z3.Not(cond)

    def claim(self, cond: Term, what: str) -> None:
        self.claims.append(cond)


class NumpyOps(Ops):
    """Evaluates the same encoding on numpy arrays (the Python twin); claims are checked at once."""

    true: Term = np.bool_(True)

    def ite(self, cond: Term, a: Term, b: Term) -> Term:
        return np.where(cond, a, b)

    def and_(self, *conds: Term) -> Term:
        return np.logical_and.reduce(np.broadcast_arrays(*conds))

    def or_(self, *conds: Term) -> Term:
        return np.logical_or.reduce(np.broadcast_arrays(*conds))

    def not_(self, cond: Term) -> Term:
        return np.logical_not(cond)

    def claim(self, cond: Term, what: str) -> None:
        if not np.all(cond):
            raise AssertionError(f"encoding claim violated: {what}")


class Ring(NamedTuple):
    """One ring of the family for ``n`` workers: direction ``d`` (``±1``) and offset ``k`` (``0 .. n-1``)."""

    n: Term
    d: Term
    k: Term


class Value(NamedTuple):
    """A slot's provenance: ``arc`` says it is the d-arc of ``length`` workers from ``start``.

    ``start`` is its first contribution and ``length`` its number of
    contributions in every case; when ``arc`` is false the value is some other
    sequence (never equal to a d-arc).
    """

    start: Term
    length: Term
    arc: Term


def arc_value(o: Ops, start: Term, length: Term) -> Value:
    """The d-arc ``start, start+d, ... (mod n)`` of ``length`` workers; ``start`` in ``0..n-1``."""
    return Value(start, length, o.true)


def select(o: Ops, cond: Term, a: Value, b: Value) -> Value:
    """``a`` if ``cond`` else ``b``, field by field."""
    return Value(o.ite(cond, a.start, b.start), o.ite(cond, a.length, b.length), o.ite(cond, a.arc, b.arc))


def same(o: Ops, v: Value, w: Value) -> Term:
    """``v == w`` as sequences, exact whenever ``w`` is a d-arc (the expected side always is)."""
    return o.and_(v.arc, w.arc, v.start == w.start, v.length == w.length)


def concat(o: Ops, g: Ring, v: Value, w: Value) -> Value:
    """``v + w`` (``core.fold``): a d-arc iff both are and ``w`` starts where ``v`` ends.

    Lengths in the modelled states stay at most ``2n``, so ``start + d length`` lies in ``[-2n, 3n)``.
    """
    contiguous = w.start == o.mod(v.start + o.times(g.d, v.length), g.n, -2, 3)
    return Value(v.start, v.length + w.length, o.and_(v.arc, w.arc, contiguous))


def is_complete(o: Ops, n: Term, v: Value) -> Term:
    """``invariants.is_complete`` of a d-arc: every worker exactly once iff its length is ``n``."""
    return o.and_(v.arc, v.length == n)


class Symbols(NamedTuple):
    """The ring size, offset, direction, round, worker and slot: symbolic (Z3) or arrays (numpy)."""

    n: Term
    k: Term
    d: Term
    r: Term
    i: Term
    c: Term

    @property
    def ring(self) -> Ring:
        """The ring ``(n, d, k)``."""
        return Ring(self.n, self.d, self.k)


# --- The schedule (ring_ref/schedule.py, RingSchedule) ---------------------------------------------------


def right(o: Ops, g: Ring, i: Term) -> Term:
    """``(i + d) mod n``: the worker ``i`` sends to."""
    return o.mod(i + g.d, g.n, -1, 2)


def left(o: Ops, g: Ring, i: Term) -> Term:
    """``(i - d) mod n``: the worker ``i`` receives from."""
    return o.mod(i - g.d, g.n, -1, 2)


def fold_start(o: Ops, g: Ring, c: Term) -> Term:
    """``(c + k) mod n``: the worker whose chunk ``c`` starts the fold."""
    return o.mod(c + g.k, g.n, 0, 2)


def position(o: Ops, g: Ring, i: Term, c: Term) -> Term:
    """``((i - c - k) d) mod n``: how many steps along chunk ``c``'s fold worker ``i`` stands."""
    return o.mod(o.times(g.d, i - c - g.k), g.n, -2, 2)


def owned_chunk(o: Ops, g: Ring, i: Term) -> Term:
    """``(i - k - (n - 1) d) mod n``: the chunk worker ``i`` holds complete after reduce-scatter."""
    return o.mod(i - g.k - o.times(g.d, g.n - 1), g.n, -2, 2)


def rs_send_chunk(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    """``(i - k - r d) mod n`` for ``0 <= r <= n - 1``."""
    return o.mod(i - g.k - o.times(g.d, r), g.n, -2, 2)


def ag_send_chunk(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    """The chunk owned by worker ``(i - r d) mod n``, for ``0 <= r <= n - 1``."""
    return owned_chunk(o, g, o.mod(i - o.times(g.d, r), g.n, -1, 2))


def rs_recv_chunk(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    """The core writes the slot its left neighbour sends: ``rs_send_chunk(left(i))``."""
    return rs_send_chunk(o, g, left(o, g, i), r)


def ag_recv_chunk(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    """``ag_send_chunk(left(i))``."""
    return ag_send_chunk(o, g, left(o, g, i), r)


def changed_slot(o: Ops, phase: Phase, g: Ring, r: Term, i: Term) -> Term:
    """``invariants.changed_slot`` as the slot whose position is ``r + 1`` (RS) or ``r`` (AG).

    ``(i - k - (r + 1) d) mod n`` and ``(i - k - r d) mod n``: for the spec's ring
    ``(i - r - 1) mod n`` and ``(i - r) mod n``.
    """
    return o.mod(i - g.k - o.times(g.d, r + 1 if phase == RS else r), g.n, -2, 2)


# --- The closed forms (ring_ref/invariants.py) ---------------------------------------------------------


def rs_expected(o: Ops, g: Ring, r: Term, i: Term, c: Term) -> Value:
    """``inv-rs-provenance``: the first ``t + 1`` workers of the fold if ``t <= r + 1``, else ``(i,)``."""
    t = position(o, g, i, c)
    inside = t <= r + 1
    return arc_value(o, o.ite(inside, fold_start(o, g, c), i), o.ite(inside, t + 1, 1))


def ag_expected(o: Ops, g: Ring, r: Term, i: Term, c: Term) -> Value:
    """``inv-ag-provenance``: chunk ``c``'s whole fold when ``(t + 1) mod n <= r + 1``, else the RS result."""
    complete = o.mod(position(o, g, i, c) + 1, g.n, 0, 2) <= r + 1
    return select(o, complete, arc_value(o, fold_start(o, g, c), g.n), rs_expected(o, g, g.n - 2, i, c))


def expected(o: Ops, phase: Phase, s: Symbols) -> Value:
    """The closed form of slot ``c`` of worker ``i`` after round ``r`` of ``phase``."""
    slot = rs_expected if phase == RS else ag_expected
    return slot(o, s.ring, s.r, s.i, s.c)


def expected_finished(o: Ops, phase: Phase, s: Symbols) -> Term:
    """``inv-finished-chunks``: whether worker ``i`` has finished chunk ``c`` after round ``r``."""
    n, r = s.n, s.r
    reach = r + 1 if phase == AG else o.ite(r == n - 2, 0, -1)
    return o.mod(position(o, s.ring, s.i, s.c) + 1, n, 0, 2) <= reach


# --- The core's round (ring_ref/core.py) and planted faults --------------------------------------------

SlotFn = Callable[[Ops, Ring, Term, Term], Term]
"""``(ops, ring, i, r) -> chunk``: a send index, or the slot a receiver writes."""

WorkerFn = Callable[[Ops, Ring, Term], Term]
"""``(ops, ring, i) -> worker``: whom ``i`` sends to or receives from."""

OwnedFn = Callable[[Ops, Ring, Term], Term]
"""``(ops, ring, i) -> chunk``: the chunk worker ``i`` is taken to own after reduce-scatter."""


@dataclass(frozen=True)
class Model:
    """A schedule and a core update: the real ones, or a planted fault."""

    name: str
    send: dict[str, SlotFn]
    write: dict[str, SlotFn]
    source: dict[str, WorkerFn] = field(default_factory=lambda: {RS: left, AG: left})
    dest: dict[str, WorkerFn] = field(default_factory=lambda: {RS: right, AG: right})
    owned: OwnedFn = owned_chunk
    ag_adds: bool = False
    extra_rounds: int = 0
    in_place: bool = False
    description: str = ""

    def rounds(self, n: Term) -> Term:
        """Rounds per phase."""
        return n - 1 + self.extra_rounds


CORE: Final = Model(
    "core",
    send={RS: rs_send_chunk, AG: ag_send_chunk},
    write={RS: rs_recv_chunk, AG: ag_recv_chunk},
    description="ring_ref.core: every send reads the state at the start of the round",
)
IN_PLACE: Final = replace(
    CORE, name="in-place", in_place=True, description="one buffer per worker, updated in the order 0 .. n-1"
)


def _wrong_rs_send(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    return o.mod(i - g.k - o.times(g.d, r) + 1, g.n, -2, 2)


def _forwarded_rs_write(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    # tests/common/faults.forwarding_reduce_scatter: a worker whose sender was updated earlier in the
    # order 0 .. n-1 stores the slot that sender received this round.
    sender = left(o, g, i)
    return o.ite(sender < i, rs_recv_chunk(o, g, sender, r), rs_recv_chunk(o, g, i, r))


def _forwarded_rs_send(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    # What the right neighbour reads from worker i in that fault.
    return _forwarded_rs_write(o, g, right(o, g, i), r)


def _shifted_ag_send(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    return ag_send_chunk(o, g._replace(k=g.k + 1), i, r)


def _flipped(g: Ring) -> Ring:
    return g._replace(d=-g.d)


def _flipped_ag_send(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    return ag_send_chunk(o, _flipped(g), i, r)


def _off_by_one_owned(o: Ops, g: Ring, i: Term) -> Term:
    # For d = -1 the owned chunk taken as (i - k) mod n instead of (i - k - 1) mod n.
    return o.ite(g.d == 1, owned_chunk(o, g, i), o.mod(i - g.k, g.n, -1, 1))


def _off_by_one_ag_send(o: Ops, g: Ring, i: Term, r: Term) -> Term:
    return _off_by_one_owned(o, g, o.mod(i - o.times(g.d, r), g.n, -1, 2))


def _follows(send: SlotFn, source: WorkerFn = left) -> SlotFn:
    """The slot a receiver writes when it writes what its ``source`` sends."""
    return lambda o, g, i, r: send(o, g, source(o, g, i), r)


def _flipped_left(o: Ops, g: Ring, i: Term) -> Term:
    return left(o, _flipped(g), i)


def _flipped_right(o: Ops, g: Ring, i: Term) -> Term:
    return right(o, _flipped(g), i)


FAULTS: Final[dict[str, Model]] = {
    "wrong-send-index": replace(
        CORE,
        name="wrong-send-index",
        send={RS: _wrong_rs_send, AG: ag_send_chunk},
        write={RS: _follows(_wrong_rs_send), AG: ag_recv_chunk},
        description="reduce-scatter sends chunk (i - k - r d + 1) mod n; receivers follow the sends",
    ),
    "adding-all-gather": replace(
        CORE, name="adding-all-gather", ag_adds=True, description="all-gather adds instead of copying"
    ),
    "extra-round": replace(CORE, name="extra-round", extra_rounds=1, description="n rounds per phase"),
    "forwarding": replace(
        IN_PLACE,
        name="forwarding",
        send={RS: _forwarded_rs_send, AG: ag_send_chunk},
        write={RS: _forwarded_rs_write, AG: ag_recv_chunk},
        description="in-place reduce-scatter in which a worker forwards the chunk it has just received",
    ),
    "ag-offset": replace(
        CORE,
        name="ag-offset",
        send={RS: rs_send_chunk, AG: _shifted_ag_send},
        write={RS: rs_recv_chunk, AG: _follows(_shifted_ag_send)},
        description="all-gather runs the ring of offset k + 1, reduce-scatter that of offset k",
    ),
    "ag-flipped": replace(
        CORE,
        name="ag-flipped",
        send={RS: rs_send_chunk, AG: _flipped_ag_send},
        write={RS: rs_recv_chunk, AG: _follows(_flipped_ag_send, _flipped_left)},
        source={RS: left, AG: _flipped_left},
        dest={RS: right, AG: _flipped_right},
        description="all-gather runs in direction -d, reduce-scatter in direction d",
    ),
    "owned-off-by-one": replace(
        CORE,
        name="owned-off-by-one",
        send={RS: rs_send_chunk, AG: _off_by_one_ag_send},
        write={RS: rs_recv_chunk, AG: _follows(_off_by_one_ag_send)},
        owned=_off_by_one_owned,
        description="for d = -1 the completed chunk is taken as (i - k) mod n, one off",
    ),
}


def round_value(o: Ops, model: Model, phase: Phase, s: Symbols) -> Value:
    """Slot ``c`` of worker ``i`` after the model's round ``r`` of ``phase``, from the closed form before it.

    Buffered: ``new[i][W(i)] = combine(old[src(i)][W(i)], old[i][W(i)])``, other
    slots kept (``core.exchange``).  In place (order ``0 .. n-1``): a worker whose
    sender comes earlier in that order reads the sender's buffer after the
    sender's own update, so it sees the new value when both wrote the same slot;
    the encoding unfolds that one step and claims (proves) that no longer chain
    occurs.
    """
    g, r, i, c = s.ring, s.r, s.i, s.c

    def before(j: Term, slot: Term) -> Value:
        return expected(o, phase, s._replace(r=r - 1, i=j, c=slot))

    def combine(incoming: Value, own: Value) -> Value:
        return concat(o, g, incoming, own) if phase == RS or model.ag_adds else incoming

    def written(j: Term) -> Term:
        return model.write[phase](o, g, j, r)

    def source(j: Term) -> Term:
        return model.source[phase](o, g, j)

    sender = source(i)
    slot = written(i)
    incoming = before(sender, slot)
    if model.in_place:
        forwarded = o.and_(sender < i, written(sender) == slot)
        grand = source(sender)
        o.claim(
            o.not_(o.and_(forwarded, grand < sender, written(grand) == written(sender))),
            "in-place chains are at most one hop long",
        )
        updated = combine(before(grand, written(sender)), before(sender, written(sender)))
        incoming = select(o, forwarded, updated, incoming)
    own = before(i, c)
    return select(o, c == slot, combine(incoming, own), own)


# --- Obligations ---------------------------------------------------------------------------------------

Build = Callable[[Ops, Model, Symbols], tuple[Term, Term]]


@dataclass(frozen=True)
class Obligation:
    """One proof goal: ``hyps(...) -> goal(...)`` for all ``n, k, d, r, i, c``."""

    name: str
    property: str
    build: Build
    r_range: Literal["none", "initial", "rounds", "rounds-or-initial", "last"] = "rounds"


def domain(
    o: Ops,
    model: Model,
    s: Symbols,
    r_range: str,
    *,
    min_n: int = 2,
    directions: Sequence[int] = (1, -1),
    min_k: int = 0,
) -> Term:
    """``n >= min_n``, ``min_k <= k < n``, ``d`` in ``directions``, ``0 <= i, c < n``, and the rounds."""
    n, k, d, r, i, c = s
    ring = o.and_(k >= min_k, k < n, o.or_(*(d == x for x in directions)))
    base = o.and_(n >= min_n, ring, i >= 0, i < n, c >= 0, c < n)
    ranges = {
        "none": r == 0,
        "initial": r == -1,
        "rounds": o.and_(r >= 0, r <= model.rounds(n) - 1),
        "rounds-or-initial": o.and_(r >= -1, r <= model.rounds(n) - 1),
        "last": r == model.rounds(n) - 1,
    }
    return o.and_(base, ranges[r_range])


def _send_is_receive(phase: Phase) -> Build:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        g, r, i, c = s.ring, s.r, s.i, s.c
        dst = m.dest[phase](o, g, i)
        sent = m.send[phase](o, g, i, r)
        return c == sent, o.and_(m.source[phase](o, g, dst) == i, m.write[phase](o, g, dst, r) == sent)

    return build


def _write_not_read(phase: Phase) -> Build:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        g, r, i, c = s.ring, s.r, s.i, s.c
        return c == m.write[phase](o, g, i, r), m.send[phase](o, g, i, r) != c

    return build


def _step(phase: Phase) -> Build:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        return o.true, same(o, round_value(o, m, phase, s), expected(o, phase, s))

    return build


def _changed_slot(phase: Phase) -> Build:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        g, r, i, c = s.ring, s.r, s.i, s.c
        slot = changed_slot(o, phase, g, r, i)
        changes = o.not_(same(o, expected(o, phase, s._replace(r=r - 1)), expected(o, phase, s)))
        return o.true, o.and_(m.write[phase](o, g, i, r) == slot, changes == (c == slot))

    return build


def _finished(phase: Phase) -> Build:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        complete = is_complete(o, s.n, expected(o, phase, s))
        return o.true, complete == expected_finished(o, phase, s)

    return build


def _rs_initial(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    return o.true, same(o, rs_expected(o, s.ring, s.r, s.i, s.c), arc_value(o, s.i, 1))


def _ag_initial(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    g, r, i, c = s.ring, s.r, s.i, s.c
    end_of_rs = rs_expected(o, g, m.rounds(g.n) - 1, i, c)
    return o.true, same(o, ag_expected(o, g, r, i, c), end_of_rs)


def _rs_final(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    g, r, i, c = s.ring, s.r, s.i, s.c
    slot = rs_expected(o, g, r, i, c)
    whole_fold = arc_value(o, fold_start(o, g, c), g.n)
    return c == m.owned(o, g, i), o.and_(is_complete(o, g.n, slot), same(o, slot, whole_fold))


def _ag_final(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    g, r, i, c = s.ring, s.r, s.i, s.c
    return o.true, same(o, ag_expected(o, g, r, i, c), arc_value(o, fold_start(o, g, c), g.n))


def _offset_is_direction(o: Ops, g: Ring) -> Term:
    """``k = d (mod n)`` for ``0 <= k < n``: the rings of reduce-scatter and all-gather (``rsc-ring``)."""
    return g.k == o.ite(g.d == 1, 1, g.n - 1)


def _theorem_shard(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    """Reduce-scatter alone leaves chunk ``i`` at rank ``i``, as the whole fold ``i + d, i + 2d, ..., i``."""
    g, r, i = s.ring, s.r, s.i
    shard = rs_expected(o, g, r, i, i)
    starts_after_i = fold_start(o, g, i) == o.mod(i + g.d, g.n, -1, 2)
    whole_fold = arc_value(o, fold_start(o, g, i), g.n)
    return _offset_is_direction(o, g), o.and_(
        m.owned(o, g, i) == i, starts_after_i, same(o, shard, whole_fold)
    )


def _theorem_gather(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    """After all-gather (alone, from reduce-scatter's end) slot ``i`` of every worker ``c`` holds what
    rank ``i`` held in slot ``i`` after reduce-scatter: all-gather after reduce-scatter is all-reduce."""
    g, r, i, c = s.ring, s.r, s.i, s.c
    return _offset_is_direction(o, g), same(o, ag_expected(o, g, r, c, i), rs_expected(o, g, r, i, i))


OBLIGATIONS: Final[tuple[Obligation, ...]] = (
    Obligation("send-is-receive/rs", "a", _send_is_receive(RS)),
    Obligation("send-is-receive/ag", "a", _send_is_receive(AG)),
    Obligation("rs-initial", "b", _rs_initial, "initial"),
    Obligation("rs-step", "b", _step(RS)),
    Obligation("ag-initial", "b", _ag_initial, "initial"),
    Obligation("ag-step", "b", _step(AG)),
    Obligation("finished-chunks/rs", "b", _finished(RS), "rounds-or-initial"),
    Obligation("finished-chunks/ag", "b", _finished(AG)),
    Obligation("rs-final", "c", _rs_final, "last"),
    Obligation("ag-final", "c", _ag_final, "last"),
    Obligation("write-not-read/rs", "d", _write_not_read(RS)),
    Obligation("write-not-read/ag", "d", _write_not_read(AG)),
    Obligation("changed-slot/rs", "check_round", _changed_slot(RS)),
    Obligation("changed-slot/ag", "check_round", _changed_slot(AG)),
    Obligation("rs-ag-theorem/shard", "theorem", _theorem_shard, "last"),
    Obligation("rs-ag-theorem/gather", "theorem", _theorem_gather, "last"),
)
"""``property``: the issue's (a) send = receive, (b) inductive invariants, (c) end states,
(d) written slot never read; ``check_round``: the one slot the closed form changes is the one written;
``theorem``: for the rings with ``k = d``, reduce-scatter leaves rank ``r`` chunk ``r``'s whole fold and
all-gather copies it into slot ``r`` of every worker, the all-reduce's value (spec clause ``rs-ag-theorem``).
The other obligations show that the core, run on each phase alone, reaches these closed forms."""


class Counterexample(NamedTuple):
    """A concrete ring size, offset, direction, round, worker and slot at which an obligation fails."""

    n: int
    k: int
    d: int
    r: int
    i: int
    c: int


@dataclass
class Result:
    """The outcome of one obligation for one model."""

    model: str
    obligation: str
    seconds: float
    counterexample: Counterexample | None = None
    detail: str = ""
    """Non-empty when the failure is not the goal's: a violated encoding claim or a Z3 timeout."""

    @property
    def proved(self) -> bool:
        """True when the negated goal (and every claim's negation) is unsatisfiable."""
        return self.counterexample is None and not self.detail


def _smallest(solver: z3.Solver, s: Symbols, lowest: dict[str, int]) -> Counterexample:
    """The lexicographically smallest ``(n, k, d, r, i, c)`` the solver's assertions allow, ``d = +1`` first.

    The solver has just answered sat.  Each symbol in turn is fixed to the first
    value, counting up from ``lowest[name]``, that keeps the query satisfiable;
    the last model found bounds the count, so it ends.  (Much faster than
    ``z3.Optimize`` on these queries, and the same answer.)
    """
    found = solver.model()
    solver.push()
    for v in s:
        best = found.eval(v, model_completion=True).as_long()
        tries = (1, -1) if v is s.d else range(lowest[str(v)], best)
        for value in tries:
            if value == best:
                break
            if solver.check(v == value) == z3.sat:
                found, best = solver.model(), value
                break
        solver.add(v == best)
    solver.pop()
    n, k, d, r, i, c = (found.eval(v, model_completion=True).as_long() for v in s)
    return Counterexample(n, k, d, r, i, c)


def prove_one(
    model: Model,
    obligation: Obligation,
    *,
    min_n: int = 2,
    directions: Sequence[int] = (1, -1),
    min_k: int = 0,
    timeout_ms: int = 60_000,
) -> Result:
    """Prove ``obligation`` for ``model``, every ``n >= min_n`` and every ring of the family.

    Otherwise return the smallest counterexample.  ``directions`` and ``min_k``
    narrow the family (by default: both directions, every offset ``0 <= k < n``).
    """
    start = time.perf_counter()
    o = Z3Ops()
    s = Symbols(*z3.Ints("n k d r i c"))
    hyps, goal = obligation.build(o, model, s)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(domain(o, model, s, obligation.r_range, min_n=min_n, directions=directions, min_k=min_k))
    # First the encoding's own claims (mod operand ranges, in-place exactness) on the whole
    # domain, hypotheses or not; then the goal under the hypotheses.
    for query, what in ((z3.Not(z3.And(*o.claims)), "encoding claim"), (z3.And(hyps, z3.Not(goal)), "")):
        solver.push()
        solver.add(query)
        verdict = solver.check()
        if verdict == z3.sat:
            cex = _smallest(solver, s, {"n": min_n, "k": min_k, "r": -1, "i": 0, "c": 0})
            return Result(model.name, obligation.name, time.perf_counter() - start, cex, what)
        if verdict != z3.unsat:
            return Result(model.name, obligation.name, time.perf_counter() - start, None, f"z3: {verdict}")
        solver.pop()
        solver.add(z3.And(*o.claims))
    return Result(model.name, obligation.name, time.perf_counter() - start)


def prove(
    model: Model,
    obligations: Sequence[Obligation] = OBLIGATIONS,
    *,
    min_n: int = 2,
    directions: Sequence[int] = (1, -1),
    min_k: int = 0,
) -> list[Result]:
    """Every obligation for ``model``, in order (``prove_one``'s narrowing applies to each)."""
    return [prove_one(model, ob, min_n=min_n, directions=directions, min_k=min_k) for ob in obligations]


@dataclass
class Report:
    """What ``make prove`` prints."""

    results: list[Result] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for res in self.results:
            cex = res.counterexample
            where = f"(n, k, d, r, i, c) = ({', '.join(map(str, cex))})" if cex else ""
            verdict = "proved" if res.proved else f"FAILED {res.detail} {where}".strip()
            out.append(f"{res.model:16} {res.obligation:22} {res.seconds * 1000:8.1f} ms  {verdict}")
        total = sum(res.seconds for res in self.results)
        out.append(f"{len(self.results)} obligations, total {total:.2f} s")
        return out


def main(argv: Sequence[str] | None = None) -> int:
    """Prove the core's model and its in-place variant; exit 1 on any failure."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--fault", choices=sorted(FAULTS), help="show counterexamples for a planted fault")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    models = [FAULTS[args.fault]] if args.fault else [CORE, IN_PLACE]
    report = Report([res for model in models for res in prove(model)])
    print("\n".join(report.lines()))
    print(
        f"wall time {time.perf_counter() - started:.2f} s "
        f"(n >= 2 unbounded, every offset 0 <= k < n, d = +1 and -1; z3 {z3.get_version_string()})"
    )
    failed = [res for res in report.results if not res.proved]
    if args.fault:
        return 0 if failed else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
