"""The SMT proof (``tools/prove.py``): it proves, its encoding is the code, and its counterexamples are real.

The encoding is a second statement of the schedule family and the closed forms,
so the proof is worth only as much as the tie between the two: every encoded
function is evaluated (through the numpy twin that shares the Z3 terms' code)
and compared with ``ring_ref``; one round of the encoded core is compared with
``ring_ref.core`` slot by slot; each planted fault's counterexample is replayed
on the concrete faulty round.  How far each tie reaches:

* the schedule's index functions: every ``n <= 64``, every offset ``0 <= k < n``,
  both directions, every round, worker and slot (``RingSchedule``'s methods
  run on numpy arrays, which is the same code; on plain ints for ``n <= 8``);
  for ``n <= 32`` every layout and the offsets ``k ± n`` too; and the spec
  ring's module-level functions for every ``n <= 64``;
* the closed forms: the spec ring (``schedule=SPEC``) on every input for every
  ``n <= 32`` (``make soak``: every ``n <= 64``, about 20 s); every ring on
  every input for every ``n <= 14`` (``make soak``: ``n <= 20``); for every ``n``
  from 15 to 64 one whole state of a random ring and round, and 20 000 random
  slots of random rings (offsets anywhere in ``-n .. 2n - 1``);
* one round of the core: every ring for ``n <= 7``, the spec ring for ``n <= 16``;
* the planted faults' encodings: the concrete faulty rounds of every ring for ``n <= 5``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import chain, product
from typing import Any

import numpy as np
import pytest

from ring_ref import core, invariants, schedule
from ring_ref.core import fold
from ring_ref.invariants import InvariantViolation, Provenance, State
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, SPEC, Layout, Phase, RingSchedule
from tests.common import faults
from tools import prove
from tools.prove import AG, RS, NumpyOps, Ring, Symbols, Value

pytestmark = pytest.mark.clause("proof-all-n")

MAX_N = 64
SCALAR_MAX_N = 8
SPEC_CLOSED_MAX_N = 32
FAMILY_CLOSED_MAX_N = 14
SOAK_FAMILY_CLOSED_MAX_N = 20
ROUND_MAX_N = 16
FAMILY_ROUND_MAX_N = 7
LAYOUT_MAX_N = 32
RANDOM_SLOTS = 20_000


def _rings(n: int) -> Iterator[RingSchedule]:
    """Every ring of the family for ``n`` workers: both directions, every offset."""
    for d, k in product((1, -1), range(n)):
        yield RingSchedule(d, k)


def _d_arc(start: int, length: int, n: int, d: int) -> Provenance:
    return tuple((start + j * d) % n for j in range(length))


def _triples(v: Value) -> Any:
    """The encoding's ``(start, length, arc)`` of every slot, as nested lists of int triples."""
    fields = np.broadcast_arrays(v.start, v.length, np.asarray(v.arc, dtype=np.int64))
    return np.stack(fields, axis=-1).tolist()


def _describes(p: Provenance, triple: list[int], n: int, d: int) -> bool:
    """The encoding's ``(start, length, arc)`` says exactly what ``p`` is."""
    start, length, is_arc = triple
    really_arc = p == _d_arc(start, length, n, d)
    return len(p) == length and p[:1] == (start,) and really_arc == bool(is_arc)


def _arc_table(n: int, d: int) -> list[Provenance]:
    """Every d-arc of ``n`` workers as a tuple, indexed by ``start * (n + 1) + length``."""
    ring = tuple(range(n)) * 2 if d == 1 else tuple(range(n - 1, -1, -1)) * 2
    firsts = range(n) if d == 1 else range(n - 1, -1, -1)
    return [ring[first : first + length] for first in firsts for length in range(n + 1)]


@pytest.mark.clause("rs-ag-theorem")
def test_the_cli_proves_every_obligation_for_the_core_and_the_in_place_variant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert prove.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    for model in (prove.CORE, prove.IN_PLACE):
        mine = [line.split() for line in lines if line.startswith(f"{model.name} ")]
        assert [words[1] for words in mine] == [ob.name for ob in prove.OBLIGATIONS]
        assert all(words[-1] == "proved" for words in mine), mine
    assert f"{2 * len(prove.OBLIGATIONS)} obligations, total" in lines[-2]
    assert "every offset 0 <= k < n, d = +1 and -1" in lines[-1]


# --- The encoding is the code: the schedule --------------------------------------------------------------


@pytest.mark.clause("rs-send-chunk", "ag-send-chunk", "ring-topology", "rs-owned-chunk")
def test_encoded_schedule_at_d_1_k_0_is_the_spec_functions_for_every_n_up_to_64() -> None:
    o = NumpyOps()
    for n in range(2, MAX_N + 1):
        g = Ring(n, 1, 0)
        # r up to n - 1: the extra-round fault's range is encoded too.
        r, i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        pairs = [(int(a), int(b)) for a, b in zip(r.ravel(), i.ravel(), strict=True)]
        checks: list[tuple[Any, Callable[[int, int, int], int]]] = [
            (prove.right(o, g, i), lambda _r, i, n: schedule.right(i, n)),
            (prove.left(o, g, i), lambda _r, i, n: schedule.left(i, n)),
            (prove.owned_chunk(o, g, i), lambda _r, i, n: schedule.owned_chunk(i, n)),
            (prove.rs_send_chunk(o, g, i, r), lambda r, i, n: schedule.rs_send_chunk(i, r, n)),
            (prove.ag_send_chunk(o, g, i, r), lambda r, i, n: schedule.ag_send_chunk(i, r, n)),
            (prove.rs_recv_chunk(o, g, i, r), lambda r, i, n: schedule.rs_recv_chunk(i, r, n)),
            (prove.ag_recv_chunk(o, g, i, r), lambda r, i, n: schedule.ag_recv_chunk(i, r, n)),
            (prove.changed_slot(o, RS, g, r, i), lambda r, i, n: invariants.changed_slot(RS, r, i, n)),
            (prove.changed_slot(o, AG, g, r, i), lambda r, i, n: invariants.changed_slot(AG, r, i, n)),
        ]
        for encoded, python in checks:
            assert encoded.ravel().tolist() == [python(a, b, n) for a, b in pairs]
        assert int(prove.CORE.rounds(n)) == schedule.rounds_per_phase(n)


FamilyCheck = tuple[
    str, Callable[[NumpyOps, Ring, Any, Any, Any], Any], Callable[[Any, int, Any, Any, Any], Any]
]

FAMILY_CHECKS: list[FamilyCheck] = [
    # (name, encoded(o, g, r, i, c), python(ring, n, r, i, c)) for every index function of the family
    ("right", lambda o, g, r, i, c: prove.right(o, g, i), lambda s, n, r, i, c: s.right(i, n)),
    ("left", lambda o, g, r, i, c: prove.left(o, g, i), lambda s, n, r, i, c: s.left(i, n)),
    ("fold_start", lambda o, g, r, i, c: prove.fold_start(o, g, c), lambda s, n, r, i, c: s.fold_start(c, n)),
    ("position", lambda o, g, r, i, c: prove.position(o, g, i, c), lambda s, n, r, i, c: s.position(i, c, n)),
    ("owned", lambda o, g, r, i, c: prove.owned_chunk(o, g, i), lambda s, n, r, i, c: s.owned_chunk(i, n)),
    (
        "rs_send",
        lambda o, g, r, i, c: prove.rs_send_chunk(o, g, i, r),
        lambda s, n, r, i, c: s.rs_send_chunk(i, r, n),
    ),
    (
        "ag_send",
        lambda o, g, r, i, c: prove.ag_send_chunk(o, g, i, r),
        lambda s, n, r, i, c: s.ag_send_chunk(i, r, n),
    ),
    (
        "rs_recv",
        lambda o, g, r, i, c: prove.rs_recv_chunk(o, g, i, r),
        lambda s, n, r, i, c: s.rs_recv_chunk(i, r, n),
    ),
    (
        "ag_recv",
        lambda o, g, r, i, c: prove.ag_recv_chunk(o, g, i, r),
        lambda s, n, r, i, c: s.ag_recv_chunk(i, r, n),
    ),
    (
        "changed_slot rs",
        lambda o, g, r, i, c: prove.changed_slot(o, RS, g, r, i),
        lambda s, n, r, i, c: invariants.changed_slot(RS, r, i, n, schedule=s),
    ),
    (
        "changed_slot ag",
        lambda o, g, r, i, c: prove.changed_slot(o, AG, g, r, i),
        lambda s, n, r, i, c: invariants.changed_slot(AG, r, i, n, schedule=s),
    ),
]

DISPATCH_CHECKS: list[tuple[str, Callable[[Any, int, Any, Any, Any], Any]]] = [
    # (name of the encoded function, python(ring, n, r, i, c)): the methods that pick a phase's function
    ("rs_send", lambda s, n, r, i, c: s.send_chunk(RS, i, r, n)),
    ("ag_send", lambda s, n, r, i, c: s.send_chunk(AG, i, r, n)),
    ("rs_recv", lambda s, n, r, i, c: s.recv_chunk(RS, i, r, n)),
    ("ag_recv", lambda s, n, r, i, c: s.recv_chunk(AG, i, r, n)),
]


def _family_grid(n: int) -> tuple[Any, ...]:
    """Broadcastable axes ``d, k, r, i, c`` (``r`` and ``c`` in ``0 .. n - 1``: one extra round)."""
    d = np.array([1, -1]).reshape(2, 1, 1, 1, 1)
    k, r, i, c = (np.arange(n).reshape([n if a == b else 1 for b in range(5)]) for a in range(1, 5))
    return d, k, r, i, c


def _encoded_family(n: int) -> dict[str, Any]:
    """Every encoded index function on the grid (each array spans only the axes it depends on)."""
    o = NumpyOps()
    d, k, r, i, c = _family_grid(n)
    return {name: np.asarray(enc(o, Ring(n, d, k), r, i, c)) for name, enc, _ in FAMILY_CHECKS}


@pytest.mark.clause("schedule-family", "schedule-invariants", "schedule-layouts")
def test_encoded_family_schedule_is_ring_schedule_for_every_n_up_to_64_and_every_ring() -> None:
    """``RingSchedule``'s methods, run on arrays of every ``(d, k, r, i, c)``.

    The methods are integer arithmetic only (numpy's ``%`` is Python's floor
    modulo), so running them on arrays runs the same code on every input at
    once.  For ``n <= 32`` also: the other layouts, and the offsets ``k - n`` and
    ``k + n`` (the same rings: the encoding takes ``0 <= k < n``, the code any int).
    """
    for n in range(2, MAX_N + 1):
        encoded = _encoded_family(n)
        d, k, r, i, c = _family_grid(n)
        variants: list[tuple[Layout, int]] = [("even", 0)]
        if n <= LAYOUT_MAX_N:
            variants += [("blocks", 0), ("gloo", 0), ("even", -n), ("even", n)]
        for layout, shift in variants:
            ring: Any = RingSchedule(d, k + shift, layout)
            for name, python in chain(((name, py) for name, _, py in FAMILY_CHECKS), DISPATCH_CHECKS):
                got, want = np.broadcast_arrays(python(ring, n, r, i, c), encoded[name])
                assert np.array_equal(got, want), (n, layout, shift, name)


@pytest.mark.clause("schedule-family", "schedule-invariants")
def test_encoded_family_schedule_is_ring_schedule_on_plain_ints_up_to_8() -> None:
    for n in range(2, SCALAR_MAX_N + 1):
        full = (2, n, n, n, n)
        encoded = {name: np.broadcast_to(array, full).tolist() for name, array in _encoded_family(n).items()}
        for x, k, r, i, c in product(range(2), *[range(n)] * 4):
            ring = RingSchedule((1, -1)[x], k)
            for name, python in chain(((name, py) for name, _, py in FAMILY_CHECKS), DISPATCH_CHECKS):
                got = python(ring, n, r, i, c)
                assert type(got) is int
                assert got == encoded[name][x][k][r][i][c], (n, ring, r, i, c, name)


# --- The encoding is the code: the closed forms ----------------------------------------------------------


def _assert_closed_form(phase: Phase, n: int, ring: RingSchedule, rounds: range | None = None) -> None:
    """Every slot after each round of ``phase`` (all, or those in ``rounds``), and the finished chunks."""
    o = NumpyOps()
    d = ring.direction
    rounds = rounds or range(-1 if phase == REDUCE_SCATTER else 0, n - 1)
    r, i, c = np.meshgrid(np.array(rounds), np.arange(n), np.arange(n), indexing="ij")
    s = Symbols(n, ring.offset % n, d, r, i, c)
    v = prove.expected(o, phase, s)
    assert bool(np.all(v.arc))
    finished = prove.expected_finished(o, phase, s)
    complete = prove.is_complete(o, n, v)
    arcs = _arc_table(n, d)
    index = (v.start * (n + 1) + v.length).reshape(len(rounds), n * n).tolist()
    for j, rr in enumerate(rounds):
        state = invariants.expected_state(phase, rr, n, schedule=ring)
        # The encoded arcs rebuilt as tuples must be the whole state, slot for slot.
        assert list(map(arcs.__getitem__, index[j])) == list(chain.from_iterable(state)), (phase, n, ring, rr)
        want = invariants.expected_finished(phase, rr, n, schedule=ring)
        got = tuple(frozenset(np.flatnonzero(row).tolist()) for row in finished[j])
        assert got == want, (phase, n, ring, rr)
        assert tuple(frozenset(np.flatnonzero(row).tolist()) for row in complete[j]) == want


@pytest.mark.parametrize("phase", [REDUCE_SCATTER, ALL_GATHER])
@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
def test_encoded_closed_forms_at_d_1_k_0_are_the_spec_invariants_for_every_n_up_to_32(phase: Phase) -> None:
    for n in range(2, SPEC_CLOSED_MAX_N + 1):
        _assert_closed_form(phase, n, SPEC)


@pytest.mark.parametrize("phase", [REDUCE_SCATTER, ALL_GATHER])
@pytest.mark.clause("schedule-invariants")
def test_encoded_closed_forms_are_the_family_invariants_for_every_ring_up_to_14(phase: Phase) -> None:
    for n in range(2, FAMILY_CLOSED_MAX_N + 1):
        for ring in _rings(n):
            _assert_closed_form(phase, n, ring)


@pytest.mark.soak  # about 20 s: n**3 slots per n, each through ring_ref.invariants
@pytest.mark.parametrize("phase", [REDUCE_SCATTER, ALL_GATHER])
@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
def test_encoded_closed_forms_at_d_1_k_0_are_the_spec_invariants_for_every_n_from_33_to_64(
    phase: Phase,
) -> None:
    for n in range(SPEC_CLOSED_MAX_N + 1, MAX_N + 1):
        _assert_closed_form(phase, n, SPEC)


@pytest.mark.soak  # about 6 s: 2 n rings of n**3 slots per n
@pytest.mark.parametrize("phase", [REDUCE_SCATTER, ALL_GATHER])
@pytest.mark.clause("schedule-invariants")
def test_encoded_closed_forms_are_the_family_invariants_for_every_ring_from_15_to_20(phase: Phase) -> None:
    for n in range(FAMILY_CLOSED_MAX_N + 1, SOAK_FAMILY_CLOSED_MAX_N + 1):
        for ring in _rings(n):
            _assert_closed_form(phase, n, ring)


@pytest.mark.parametrize("phase", [REDUCE_SCATTER, ALL_GATHER])
@pytest.mark.clause("schedule-invariants")
def test_encoded_closed_forms_are_the_family_invariants_on_random_rings_up_to_64(phase: Phase) -> None:
    rng = random.Random(f"prove-{phase}")
    r_lo = -1 if phase == REDUCE_SCATTER else 0
    for n in range(FAMILY_CLOSED_MAX_N + 1, MAX_N + 1):
        ring = RingSchedule(rng.choice((1, -1)), rng.randrange(n))
        r = rng.randrange(r_lo, n - 1)
        _assert_closed_form(phase, n, ring, range(r, r + 1))
    points = []
    for _ in range(RANDOM_SLOTS):
        n = rng.randrange(2, MAX_N + 1)
        points.append(
            (
                n,
                rng.randrange(n),
                rng.choice((1, -1)),
                rng.randrange(r_lo, n - 1),
                *divmod(rng.randrange(n * n), n),
            )
        )
    n_, k_, d_, r_, i_, c_ = (np.array(column) for column in zip(*points, strict=True))
    triples = _triples(prove.expected(NumpyOps(), phase, Symbols(n_, k_, d_, r_, i_, c_)))
    closed = invariants.rs_expected if phase == REDUCE_SCATTER else invariants.ag_expected
    for triple, (n, k, d, r, i, c) in zip(triples, points, strict=True):
        # Any int offset names a ring; k - n, k and k + n are the same one.
        got = closed(n, r, i, c, schedule=RingSchedule(d, k + n * rng.choice((-1, 0, 1))))
        assert _describes(got, triple, n, d), (phase, n, k, d, r, i, c)


def test_encoded_completeness_is_is_complete_on_every_arc_up_to_64() -> None:
    o = NumpyOps()
    for n in range(2, MAX_N + 1):
        s, length = np.meshgrid(np.arange(n), np.arange(1, n + 1), indexing="ij")
        encoded = prove.is_complete(o, n, prove.arc_value(o, s, length))
        for d in (1, -1):
            python = [
                invariants.is_complete(invariants.arc(a, b, n, d), n)
                for a, b in zip(s.ravel().tolist(), length.ravel().tolist(), strict=True)
            ]
            assert encoded.ravel().tolist() == python


def _values(n: int, d: int) -> Iterator[tuple[Provenance, Value]]:
    """Every d-arc of length 1..n (built by ``invariants.arc``), and some other sequences, encoded."""
    for s in range(n):
        for length in range(1, n + 1):
            p = invariants.arc(s, length, n, d)
            yield p, Value(np.int64(s), np.int64(length), np.bool_(True))
    for s in range(n):
        # (s, s + 2d) and (s, s - d): no d-arcs for n >= 3, but (s, s - d) is one for n = 2.
        for p in ((s, (s + 2 * d) % n), (s, (s - d) % n)):
            yield p, Value(np.int64(s), np.int64(2), np.bool_(p == _d_arc(s, 2, n, d)))


@pytest.mark.parametrize("n", range(2, 6))
def test_encoded_concatenation_and_equality_are_the_tuples(n: int) -> None:
    o = NumpyOps()
    for d in (1, -1):
        g = Ring(n, d, 0)
        values = list(_values(n, d))
        for p, v in values:
            for q, w in values:
                cat = prove.concat(o, g, v, w)
                assert _describes(p + q, _triples(cat), n, d), (d, p, q)
                if bool(w.arc):
                    assert bool(prove.same(o, v, w)) == (p == q), (d, p, q)


# --- The encoding is the code: one round ----------------------------------------------------------------


def _assert_round_encoded(
    model: prove.Model, phase: Phase, r: int, ring: RingSchedule, after: State[Provenance]
) -> None:
    n = len(after)
    o = NumpyOps()
    i, c = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    triples = _triples(
        prove.round_value(o, model, phase, Symbols(n, ring.offset % n, ring.direction, r, i, c))
    )
    for w, slot in product(range(n), repeat=2):
        assert _describes(after[w][slot], triples[w][slot], n, ring.direction), (
            model.name,
            phase,
            r,
            n,
            w,
            slot,
        )


@pytest.mark.clause("rs-add", "ag-copy-not-add", "simultaneous-rounds")
@pytest.mark.parametrize("model", [prove.CORE, prove.IN_PLACE], ids=lambda m: m.name)
def test_encoded_round_is_the_core_round(model: prove.Model) -> None:
    for n in range(2, ROUND_MAX_N + 1):
        for phase, r in schedule.all_rounds(n):
            after = core.step(invariants.expected_state_before(phase, r, n), phase, r, fold)
            _assert_round_encoded(model, phase, r, SPEC, after)


@pytest.mark.clause("schedule-family")
@pytest.mark.parametrize("model", [prove.CORE, prove.IN_PLACE], ids=lambda m: m.name)
def test_encoded_round_is_the_core_round_of_every_ring(model: prove.Model) -> None:
    for n in range(2, FAMILY_ROUND_MAX_N + 1):
        for ring in _rings(n):
            for phase, r in schedule.all_rounds(n):
                after = core.step(
                    invariants.expected_state_before(phase, r, n, schedule=ring),
                    phase,
                    r,
                    fold,
                    schedule=ring,
                )
                _assert_round_encoded(model, phase, r, ring, after)


# --- Planted faults: the prover refutes each, and the refutation replays ---------------------------------


def _take_incoming(incoming: Provenance, _own: Provenance) -> Provenance:
    return incoming


def _off_by_one_owned(ring: RingSchedule, i: int, n: int) -> int:
    return ring.owned_chunk(i, n) if ring.direction == 1 else (i - ring.offset) % n


def _in_place_forwarding(state: State[Provenance], r: int, ring: RingSchedule) -> State[Provenance]:
    """``tests/common/faults.forwarding_reduce_scatter`` on any ring: in place, order 0 .. n-1, forwarding."""
    n = len(state)
    rows = [list(row) for row in state]
    for i in range(n):
        sender = ring.left(i, n)
        c = ring.rs_recv_chunk(sender if sender < i else i, r, n)
        rows[i][c] = fold(rows[sender][c], rows[i][c])
    return tuple(tuple(row) for row in rows)


Round = Callable[[State[Provenance], int, RingSchedule], State[Provenance]]


def _wrong_send_index(state: State[Provenance], r: int, ring: RingSchedule) -> State[Provenance]:
    if ring == SPEC:
        return faults.wrong_chunk_reduce_scatter(state, r, fold)
    n = len(state)
    return core.exchange(state, lambda i: (ring.rs_recv_chunk(i, r, n) + 1) % n, fold, schedule=ring)


def _forwarding(state: State[Provenance], r: int, ring: RingSchedule) -> State[Provenance]:
    if ring == SPEC:
        return faults.forwarding_reduce_scatter(state, r, fold)
    return _in_place_forwarding(state, r, ring)


def _adding_all_gather(state: State[Provenance], r: int, ring: RingSchedule) -> State[Provenance]:
    if ring == SPEC:
        return faults.adding_all_gather(state, r, fold)
    n = len(state)
    return core.exchange(state, lambda i: ring.ag_recv_chunk(i, r, n), fold, schedule=ring)


def _owned_off_by_one(state: State[Provenance], r: int, ring: RingSchedule) -> State[Provenance]:
    n, d = len(state), ring.direction
    return core.exchange(
        state,
        lambda i: _off_by_one_owned(ring, (ring.left(i, n) - r * d) % n, n),
        _take_incoming,
        schedule=ring,
    )


FAULTY_ROUNDS: dict[tuple[str, Phase], Round] = {
    ("wrong-send-index", REDUCE_SCATTER): _wrong_send_index,
    ("forwarding", REDUCE_SCATTER): _forwarding,
    ("adding-all-gather", ALL_GATHER): _adding_all_gather,
    ("ag-offset", ALL_GATHER): lambda state, r, ring: core.all_gather_round(
        state, r, schedule=RingSchedule(ring.direction, ring.offset + 1)
    ),
    ("ag-flipped", ALL_GATHER): lambda state, r, ring: core.all_gather_round(
        state, r, schedule=RingSchedule(-ring.direction, ring.offset)
    ),
    ("owned-off-by-one", ALL_GATHER): _owned_off_by_one,
}
"""The concrete faulty rounds, built from ``ring_ref.core`` (and ``tests/common/faults.py`` on the spec ring);
every other round of a fault (and every round of extra-round, which only runs one more) is the core's."""


def _faulty_round(
    name: str, state: State[Provenance], phase: Phase, r: int, ring: RingSchedule
) -> State[Provenance]:
    faulty = FAULTY_ROUNDS.get((name, phase))
    if faulty is None:
        return core.step(state, phase, r, fold, schedule=ring)
    return faulty(state, r, ring)


def _faulty_rings(n: int) -> Iterator[RingSchedule]:
    yield SPEC
    yield from _rings(n)


@pytest.mark.parametrize("name", sorted(prove.FAULTS))
def test_encoded_fault_is_the_concrete_faulty_round(name: str) -> None:
    model = prove.FAULTS[name]
    for n in range(2, 6):
        for ring in _faulty_rings(n):
            for phase in (REDUCE_SCATTER, ALL_GATHER):
                for r in range(int(model.rounds(n))):
                    after = _faulty_round(
                        name, invariants.expected_state_before(phase, r, n, schedule=ring), phase, r, ring
                    )
                    _assert_round_encoded(model, phase, r, ring, after)


EXPECTED_FAILURES = {
    "wrong-send-index": {"rs-step"},
    "adding-all-gather": {"ag-step"},
    "extra-round": {"rs-step", "finished-chunks/rs"},
    "forwarding": {"rs-step", "write-not-read/rs"},
    "ag-offset": {"ag-step"},
    "ag-flipped": {"ag-step"},
    "owned-off-by-one": {"ag-step", "rs-final"},
}


def _replay(name: str, obligation: str, cex: prove.Counterexample) -> None:
    """Run the faulty ring at the counterexample and see the failure the obligation names."""
    n, k, d, r, i, c = cex
    ring = RingSchedule(d, k)
    if obligation == "rs-final":
        assert name == "owned-off-by-one"
        state = core.provenance_state(n)
        for rr in range(n - 1):
            state = _faulty_round(name, state, REDUCE_SCATTER, rr, ring)
        # The faulty all-gather starts by sending slot c of worker i as if it were complete.
        assert c == _off_by_one_owned(ring, i, n)
        assert not invariants.is_complete(state[i][c], n), (name, cex)
        return
    phase: Phase = REDUCE_SCATTER if obligation.endswith(("/rs", "rs-step")) else ALL_GATHER
    before = invariants.expected_state_before(phase, r, n, schedule=ring)
    after = _faulty_round(name, before, phase, r, ring)
    # The code's own check rejects the state the faulty round leaves.
    with pytest.raises(InvariantViolation):
        invariants.check(after, phase, r, schedule=ring)
    if obligation.endswith("-step"):
        closed = invariants.rs_expected if phase == REDUCE_SCATTER else invariants.ag_expected
        assert after[i][c] != closed(n, r, i, c, schedule=ring), (name, cex)
        with pytest.raises(InvariantViolation):
            invariants.check_round(before, after, phase, r, schedule=ring)
    if obligation == "write-not-read/rs":
        j = ring.right(i, n)
        # Worker i received into slot c this round, and its right neighbour got that new value.
        assert after[i][c] != before[i][c]
        assert after[j][c][: len(after[i][c])] == after[i][c]


@pytest.mark.clause(
    "rs-send-chunk", "ag-copy-not-add", "round-count", "simultaneous-rounds", "schedule-family"
)
@pytest.mark.parametrize("name", sorted(prove.FAULTS))
def test_planted_fault_gets_a_counterexample_that_replays(name: str) -> None:
    """The obligations each fault must break (``python tools/prove.py --fault NAME`` tries them all)."""
    obligations = [ob for ob in prove.OBLIGATIONS if ob.name in EXPECTED_FAILURES[name]]
    assert len(obligations) == len(EXPECTED_FAILURES[name])
    for res in prove.prove(prove.FAULTS[name], obligations):
        cex = res.counterexample
        assert res.detail == "", "a fault must break a goal, not the encoding's claims"
        assert cex is not None, res
        _replay(name, res.obligation, cex)
        if name == "ag-flipped":
            assert cex.n == 3, "for n = 2 the directions +1 and -1 are the same ring"
        if name == "owned-off-by-one":
            assert cex.d == -1, "the fault is in the d = -1 case only"


@pytest.mark.clause("schedule-family")
@pytest.mark.parametrize("name", sorted(prove.FAULTS))
def test_planted_fault_is_refuted_on_a_ring_far_from_the_spec_ring_too(name: str) -> None:
    """Restricted to ``n >= 5``, ``d = -1`` and ``k >= 1``, each fault still has a counterexample there."""
    obligations = [ob for ob in prove.OBLIGATIONS if ob.name in EXPECTED_FAILURES[name]]
    for res in prove.prove(prove.FAULTS[name], obligations, min_n=5, directions=(-1,), min_k=1):
        cex = res.counterexample
        assert res.detail == "" and cex is not None, res
        assert cex.n >= 5 and cex.d == -1 and 1 <= cex.k < cex.n
        _replay(name, res.obligation, cex)


def test_the_off_by_one_owned_chunk_of_d_minus_1_is_proved_harmless_for_d_plus_1() -> None:
    """The fault touches only ``d = -1``: on the ``d = +1`` rings the prover finds nothing, as it should."""
    results = prove.prove(prove.FAULTS["owned-off-by-one"], directions=(1,))
    assert all(res.proved for res in results), [res for res in results if not res.proved]


def test_a_fault_in_the_encoding_itself_is_reported_as_a_broken_claim() -> None:
    """A mod whose operand leaves its claimed range is caught, not silently wrong."""

    def bad_send(o: prove.Ops, g: Ring, i: Any, r: Any) -> Any:
        return o.mod(i - g.k - o.times(g.d, r), g.n, -1, 1)  # i - k - r d can leave [-n, n)

    model = replace(prove.CORE, name="bad-encoding", send={RS: bad_send, AG: prove.ag_send_chunk})
    res = prove.prove_one(model, prove.OBLIGATIONS[0])
    assert res.detail == "encoding claim"
    assert res.counterexample is not None
    n, k, d, r, i, _ = res.counterexample
    assert not -n <= i - k - d * r < n


THEOREM = {ob.name: ob for ob in prove.OBLIGATIONS if ob.name.startswith("rs-ag-theorem/")}


@pytest.mark.clause("rs-ag-theorem")
def test_the_theorem_needs_offset_equal_to_direction_and_the_true_owned_chunk() -> None:
    """Without ``k = d`` the shard obligation has a counterexample (the spec's ring ``k = 0``: rank ``i``
    owns chunk ``i + 1``), as has the gather obligation; with the owned chunk off by one (``d = -1``), the
    shard obligation fails on a ring with ``k = d``.  Each counterexample replays on the code."""
    for ob in THEOREM.values():
        anyring = replace(ob, name=f"{ob.name} (any k)", build=_without_hypothesis(ob.build))
        (res,) = prove.prove(prove.CORE, [anyring])
        assert res.detail == "" and res.counterexample is not None, res
        n, k, d, _r, i, c = res.counterexample
        assert (k - d) % n != 0
        ring = RingSchedule(d, k)
        if ob.name.endswith("shard"):
            assert ring.owned_chunk(i, n) != i or ring.fold_order(i, n)[0] != (i + d) % n
        else:
            final = core.run_ring(core.provenance_state(n), core.fold, schedule=ring)
            after_rs = core.run_ring(
                core.provenance_state(n), core.fold, schedule=ring, phases=(REDUCE_SCATTER,)
            )
            assert final[c][i] != after_rs[i][i]
    (res,) = prove.prove(prove.FAULTS["owned-off-by-one"], [THEOREM["rs-ag-theorem/shard"]])
    assert res.counterexample is not None and res.counterexample.d == -1
    n, k, d, _r, i, _c = res.counterexample
    assert RingSchedule(d, k).owned_chunk(i, n) == i != _off_by_one_owned(RingSchedule(d, k), i, n)


def _without_hypothesis(build: prove.Build) -> prove.Build:
    def any_offset(o: prove.Ops, m: prove.Model, s: prove.Symbols) -> tuple[Any, Any]:
        return o.true, build(o, m, s)[1]

    return any_offset
