"""An SMT proof, for every ring size, of the schedule and its invariants (``make prove``).

The schedule, the closed-form invariants and one round of the core's update are
restated here as *linear integer arithmetic* over symbolic ``n >= 2``, a round
``r``, a worker ``i`` and a chunk slot ``c``, with no bound on ``n``; Z3 proves
each obligation by showing its negation unsatisfiable (spec clause
``proof-all-n``).  Two devices keep every query decidable:

* ``x mod n`` is only taken of operands known to lie in ``[lo*n, hi*n)`` for
  small constants ``lo, hi``, and is encoded as the case split
  ``ite(x < (lo+1) n, x - lo n, ite(...))``.  Each such range claim is recorded
  and proved alongside the obligation that uses it.
* Every slot of every state the closed forms describe holds an *arc*: the
  contributions ``s, s+1, ..., s+l-1 (mod n)``.  A slot is therefore a pair
  ``(start, length)`` plus a flag ``arc`` that says whether the value really is
  that arc.  The reduce-scatter update concatenates the incoming value with the
  receiver's own; the concatenation of two arcs is the arc ``(s1, l1 + l2)``
  exactly when the second starts where the first ends, ``s2 = (s1 + l1) mod n``
  (contiguity); otherwise it is no arc at all.  Equality with an expected arc is
  then equality of the pairs, which is exact: no over-approximation, so every
  counterexample is a real one.

The same functions build Z3 terms (:class:`Z3Ops`) and evaluate numpy arrays
(:class:`NumpyOps`): ``tests/cover/test_proof.py`` evaluates every encoded
closed form on all inputs for every ``n <= 64`` and compares it with
``ring_ref.schedule`` and ``ring_ref.invariants``, which ties this restatement
to the code.  This module imports nothing from ``ring_ref``.

The core is modelled in two flavours: *buffered* (every send reads the state at
the start of the round, which is what ``ring_ref.core.exchange`` does) and
*in-place* (workers update one buffer in the order ``0 .. n-1``, so a sender may
already have written this round); both are proved.  :data:`FAULTS` plants the
four schedule faults of the stateful tests; the prover must refute each with a
concrete counterexample ``(n, r, i, c)``.

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


class Value(NamedTuple):
    """A slot's provenance: ``arc`` says it is the arc of ``length`` workers from ``start``.

    ``start`` is its first contribution and ``length`` its number of
    contributions in every case; when ``arc`` is false the value is some other
    sequence (never equal to an arc).
    """

    start: Term
    length: Term
    arc: Term


def arc_value(o: Ops, start: Term, length: Term) -> Value:
    """The arc ``start, start+1, ... (mod n)`` of ``length`` workers; ``start`` in ``0..n-1``."""
    return Value(start, length, o.true)


def select(o: Ops, cond: Term, a: Value, b: Value) -> Value:
    """``a`` if ``cond`` else ``b``, field by field."""
    return Value(o.ite(cond, a.start, b.start), o.ite(cond, a.length, b.length), o.ite(cond, a.arc, b.arc))


def same(o: Ops, v: Value, w: Value) -> Term:
    """``v == w`` as sequences, exact whenever ``w`` is an arc (the expected side always is)."""
    return o.and_(v.arc, w.arc, v.start == w.start, v.length == w.length)


def concat(o: Ops, n: Term, v: Value, w: Value) -> Value:
    """``v + w`` (tuple concatenation, ``core.fold``): an arc iff both are and ``w`` starts where ``v`` ends.

    Lengths in the modelled states stay below ``2n``, so ``start + length < 3n``.
    """
    contiguous = w.start == o.mod(v.start + v.length, n, 0, 3)
    return Value(v.start, v.length + w.length, o.and_(v.arc, w.arc, contiguous))


def is_complete(o: Ops, n: Term, v: Value) -> Term:
    """``invariants.is_complete`` of an arc: every worker exactly once iff its length is ``n``."""
    return o.and_(v.arc, v.length == n)


class Symbols(NamedTuple):
    """The ring size, round, worker and slot: symbolic (Z3) or arrays (numpy)."""

    n: Term
    r: Term
    i: Term
    c: Term


# --- The schedule (ring_ref/schedule.py) -------------------------------------------------------------


def right(o: Ops, i: Term, n: Term) -> Term:
    """``(i + 1) mod n``."""
    return o.mod(i + 1, n, 0, 2)


def left(o: Ops, i: Term, n: Term) -> Term:
    """``(i - 1) mod n``."""
    return o.mod(i - 1, n, -1, 1)


def owned_chunk(o: Ops, i: Term, n: Term) -> Term:
    """``(i + 1) mod n``: the chunk worker ``i`` holds complete after reduce-scatter."""
    return o.mod(i + 1, n, 0, 2)


def rs_send_chunk(o: Ops, i: Term, r: Term, n: Term) -> Term:
    """``(i - r) mod n`` for ``0 <= r <= n - 1``."""
    return o.mod(i - r, n, -1, 1)


def ag_send_chunk(o: Ops, i: Term, r: Term, n: Term) -> Term:
    """``(i + 1 - r) mod n`` for ``0 <= r <= n - 1``."""
    return o.mod(i + 1 - r, n, -1, 2)


def changed_slot(o: Ops, phase: Phase, r: Term, i: Term, n: Term) -> Term:
    """``invariants.changed_slot``: ``(i - r - 1) mod n`` (reduce-scatter), ``(i - r) mod n`` (all-gather)."""
    return o.mod(i - r - 1, n, -1, 1) if phase == RS else o.mod(i - r, n, -1, 1)


# --- The closed forms (ring_ref/invariants.py) ---------------------------------------------------------


def rs_expected(o: Ops, n: Term, r: Term, i: Term, c: Term) -> Value:
    """``inv-rs-provenance``: the arc ``c .. i`` when ``d = (i - c) mod n <= r + 1``, else ``(i,)``."""
    d = o.mod(i - c, n, -1, 1)
    inside = d <= r + 1
    return arc_value(o, o.ite(inside, c, i), o.ite(inside, d + 1, 1))


def ag_expected(o: Ops, n: Term, r: Term, i: Term, c: Term) -> Value:
    """``inv-ag-provenance``: chunk ``c`` complete when ``(i + 1 - c) mod n <= r + 1``, else the RS result."""
    complete = o.mod(i + 1 - c, n, -1, 2) <= r + 1
    return select(o, complete, arc_value(o, c, n), rs_expected(o, n, n - 2, i, c))


def expected(o: Ops, phase: Phase, s: Symbols) -> Value:
    """The closed form of slot ``c`` of worker ``i`` after round ``r`` of ``phase``."""
    return rs_expected(o, *s) if phase == RS else ag_expected(o, *s)


def expected_finished(o: Ops, phase: Phase, s: Symbols) -> Term:
    """``inv-finished-chunks``: whether worker ``i`` has finished chunk ``c`` after round ``r``."""
    n, r, i, c = s
    reach = r + 1 if phase == AG else o.ite(r == n - 2, 0, -1)
    return o.mod(i + 1 - c, n, -1, 2) <= reach


# --- The core's round (ring_ref/core.py) and planted faults --------------------------------------------

SlotFn = Callable[[Ops, Term, Term, Term], Term]
"""``(ops, i, r, n) -> chunk``: a send index, or the slot a receiver writes."""


def rs_recv_chunk(o: Ops, i: Term, r: Term, n: Term) -> Term:
    """The core writes the slot its left neighbour sends: ``rs_send_chunk(left(i))``."""
    return rs_send_chunk(o, left(o, i, n), r, n)


def ag_recv_chunk(o: Ops, i: Term, r: Term, n: Term) -> Term:
    """``ag_send_chunk(left(i))``."""
    return ag_send_chunk(o, left(o, i, n), r, n)


@dataclass(frozen=True)
class Model:
    """A schedule and a core update: the real ones, or a planted fault."""

    name: str
    send: dict[str, SlotFn]
    write: dict[str, SlotFn]
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


def _wrong_rs_send(o: Ops, i: Term, r: Term, n: Term) -> Term:
    return o.mod(i - r + 1, n, -1, 2)


def _forwarded_rs_write(o: Ops, i: Term, r: Term, n: Term) -> Term:
    # tests/faults.forwarding_reduce_scatter: worker i >= 1 stores what i-1 received this round.
    return o.ite(i == 0, rs_recv_chunk(o, i, r, n), rs_recv_chunk(o, left(o, i, n), r, n))


def _forwarded_rs_send(o: Ops, i: Term, r: Term, n: Term) -> Term:
    # What the right neighbour reads from worker i in that fault.
    return _forwarded_rs_write(o, right(o, i, n), r, n)


FAULTS: Final[dict[str, Model]] = {
    "wrong-send-index": replace(
        CORE,
        name="wrong-send-index",
        send={RS: _wrong_rs_send, AG: ag_send_chunk},
        write={RS: lambda o, i, r, n: _wrong_rs_send(o, left(o, i, n), r, n), AG: ag_recv_chunk},
        description="reduce-scatter sends chunk (i - r + 1) mod n; receivers follow the sends",
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
}


def round_value(o: Ops, model: Model, phase: Phase, s: Symbols) -> Value:
    """Slot ``c`` of worker ``i`` after the model's round ``r`` of ``phase``, from the closed form before it.

    Buffered: ``new[i][W(i)] = combine(old[left(i)][W(i)], old[i][W(i)])``, other
    slots kept (``core.exchange``).  In place (order ``0 .. n-1``): worker
    ``i >= 1`` reads its left neighbour's buffer after that neighbour's own
    update, so it sees the new value when both wrote the same slot; the encoding
    unfolds that one step and claims (proves) that no longer chain occurs.
    """

    n, r, i, c = s

    def before(j: Term, k: Term) -> Value:
        return expected(o, phase, Symbols(n, r - 1, j, k))

    def combine(incoming: Value, own: Value) -> Value:
        return concat(o, n, incoming, own) if phase == RS or model.ag_adds else incoming

    def written(j: Term) -> Term:
        return model.write[phase](o, j, r, n)

    sender = left(o, i, n)
    slot = written(i)
    incoming = before(sender, slot)
    if model.in_place:
        forwarded = o.and_(i >= 1, written(sender) == slot)
        grand = left(o, sender, n)
        o.claim(
            o.not_(o.and_(forwarded, sender >= 1, written(grand) == written(sender))),
            "in-place chains are at most one hop long",
        )
        updated = combine(before(grand, written(sender)), before(sender, written(sender)))
        incoming = select(o, forwarded, updated, incoming)
    own = before(i, c)
    return select(o, c == slot, combine(incoming, own), own)


# --- Obligations ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Obligation:
    """One proof goal: ``hyps(...) -> goal(...)`` for all ``n, r, i, c``."""

    name: str
    property: str
    build: Callable[[Ops, Model, Symbols], tuple[Term, Term]]
    r_range: Literal["none", "initial", "rounds", "rounds-or-initial", "last"] = "rounds"


def _domain(o: Ops, model: Model, s: Symbols, r_range: str, min_n: int = 2) -> Term:
    n, r, i, c = s
    base = o.and_(n >= min_n, i >= 0, i < n, c >= 0, c < n)
    ranges = {
        "none": r == 0,
        "initial": r == -1,
        "rounds": o.and_(r >= 0, r <= model.rounds(n) - 1),
        "rounds-or-initial": o.and_(r >= -1, r <= model.rounds(n) - 1),
        "last": r == model.rounds(n) - 1,
    }
    return o.and_(base, ranges[r_range])


def _send_is_receive(phase: Phase) -> Callable[[Ops, Model, Symbols], tuple[Term, Term]]:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        n, r, i, c = s
        dst = right(o, i, s.n)
        sent = m.send[phase](o, i, r, n)
        return c == sent, o.and_(left(o, dst, n) == i, m.write[phase](o, dst, r, n) == sent)

    return build


def _write_not_read(phase: Phase) -> Callable[[Ops, Model, Symbols], tuple[Term, Term]]:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        n, r, i, c = s
        return c == m.write[phase](o, i, r, n), m.send[phase](o, i, r, n) != c

    return build


def _step(phase: Phase) -> Callable[[Ops, Model, Symbols], tuple[Term, Term]]:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        return o.true, same(o, round_value(o, m, phase, s), expected(o, phase, s))

    return build


def _changed_slot(phase: Phase) -> Callable[[Ops, Model, Symbols], tuple[Term, Term]]:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        n, r, i, c = s
        slot = changed_slot(o, phase, r, i, n)
        changes = o.not_(same(o, expected(o, phase, s._replace(r=r - 1)), expected(o, phase, s)))
        return o.true, o.and_(m.write[phase](o, i, r, n) == slot, changes == (c == slot))

    return build


def _finished(phase: Phase) -> Callable[[Ops, Model, Symbols], tuple[Term, Term]]:
    def build(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
        complete = is_complete(o, s.n, expected(o, phase, s))
        return o.true, complete == expected_finished(o, phase, s)

    return build


def _rs_initial(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    n, r, i, c = s
    return o.true, same(o, rs_expected(o, n, r, i, c), arc_value(o, i, 1))


def _ag_initial(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    n, r, i, c = s
    end_of_rs = rs_expected(o, n, m.rounds(n) - 1, i, c)
    return o.true, same(o, ag_expected(o, n, r, i, c), end_of_rs)


def _rs_final(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    n, r, i, c = s
    owned = owned_chunk(o, i, n)
    slot = rs_expected(o, n, r, i, c)
    return c == owned, o.and_(is_complete(o, n, slot), same(o, slot, arc_value(o, owned, n)))


def _ag_final(o: Ops, m: Model, s: Symbols) -> tuple[Term, Term]:
    n, r, i, c = s
    return o.true, same(o, ag_expected(o, n, r, i, c), arc_value(o, c, n))


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
)
"""``property``: the issue's (a) send = receive, (b) inductive invariants, (c) end states,
(d) written slot never read; ``check_round``: the one slot the closed form changes is the one written."""


class Counterexample(NamedTuple):
    """A concrete ring size, round, worker and slot at which an obligation fails."""

    n: int
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


def _smallest(assertions: Sequence[Term], s: Symbols) -> list[int]:
    """The lexicographically smallest ``(n, r, i, c)`` satisfying ``assertions`` (small enough to run)."""
    opt = z3.Optimize()
    opt.add(*assertions)
    for v in s:
        opt.minimize(v)
    if opt.check() != z3.sat:
        raise AssertionError("a satisfiable query has no minimal model")
    m = opt.model()
    return [m.eval(v, model_completion=True).as_long() for v in s]


def prove_one(model: Model, obligation: Obligation, min_n: int = 2, timeout_ms: int = 60_000) -> Result:
    """Prove ``obligation`` for ``model`` for every ``n >= min_n``, or return the smallest counterexample."""
    start = time.perf_counter()
    o = Z3Ops()
    s = Symbols(*z3.Ints("n r i c"))
    hyps, goal = obligation.build(o, model, s)
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(_domain(o, model, s, obligation.r_range, min_n))
    # First the encoding's own claims (mod operand ranges, in-place exactness) on the whole
    # domain, hypotheses or not; then the goal under the hypotheses.
    for query, what in ((z3.Not(z3.And(*o.claims)), "encoding claim"), (z3.And(hyps, z3.Not(goal)), "")):
        solver.push()
        solver.add(query)
        verdict = solver.check()
        if verdict == z3.sat:
            values = _smallest(solver.assertions(), s)
            seconds = time.perf_counter() - start
            return Result(model.name, obligation.name, seconds, Counterexample(*values), what)
        if verdict != z3.unsat:
            return Result(model.name, obligation.name, time.perf_counter() - start, None, f"z3: {verdict}")
        solver.pop()
        solver.add(z3.And(*o.claims))
    return Result(model.name, obligation.name, time.perf_counter() - start)


def prove(model: Model, obligations: Sequence[Obligation] = OBLIGATIONS, min_n: int = 2) -> list[Result]:
    """Every obligation for ``model``, in order."""
    return [prove_one(model, ob, min_n) for ob in obligations]


@dataclass
class Report:
    """What ``make prove`` prints."""

    results: list[Result] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for res in self.results:
            verdict = "proved" if res.proved else f"FAILED {res.detail} {res.counterexample or ''}".strip()
            out.append(f"{res.model:10} {res.obligation:22} {res.seconds * 1000:8.1f} ms  {verdict}")
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
    print(f"wall time {time.perf_counter() - started:.2f} s (n >= 2 unbounded; z3 {z3.get_version_string()})")
    failed = [res for res in report.results if not res.proved]
    if args.fault:
        return 0 if failed else 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
