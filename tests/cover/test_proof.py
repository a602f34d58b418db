"""The SMT proof (``tools/prove.py``): it proves, its encoding is the code, and its counterexamples are real.

The encoding is a second statement of the schedule and the closed forms, so the
proof is worth only as much as the tie between the two: every encoded function
is evaluated (through the numpy twin that shares the Z3 terms' code) on every
input for every ``n <= 64`` and compared with ``ring_ref``; one round of the
encoded core is compared with ``ring_ref.core`` slot by slot; each planted
fault's counterexample is replayed on the concrete faulty round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from itertools import chain
from typing import Any

import numpy as np
import pytest

from ring_ref import core, invariants, schedule
from ring_ref.core import fold
from ring_ref.invariants import Provenance, State
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, Phase
from tests import faults
from tools import prove
from tools.prove import AG, RS, NumpyOps, Symbols, Value

pytestmark = pytest.mark.clause("proof-all-n")

MAX_N = 64
ROUND_MAX_N = 20


def _tuple_of(v: Value, n: int, idx: tuple[int, ...]) -> tuple[int, int, bool]:
    return int(v.start[idx]), int(v.length[idx]), bool(v.arc[idx])


def _describes(p: Provenance, start: int, length: int, is_arc: bool, n: int) -> bool:
    """The encoding's ``(start, length, arc)`` says exactly what ``p`` is."""
    really_arc = p == tuple((start + k) % n for k in range(length))
    return len(p) == length and p[:1] == (start,) and really_arc == is_arc


def test_every_obligation_is_proved_for_the_core_and_the_in_place_variant() -> None:
    for model in (prove.CORE, prove.IN_PLACE):
        results = prove.prove(model)
        assert [res.obligation for res in results] == [ob.name for ob in prove.OBLIGATIONS]
        failed = [res for res in results if not res.proved]
        assert not failed, failed


def test_the_cli_prints_a_time_per_obligation_and_a_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert prove.main([]) == 0
    out = capsys.readouterr().out
    assert out.count(" ms  proved") == 2 * len(prove.OBLIGATIONS)
    assert f"{2 * len(prove.OBLIGATIONS)} obligations, total" in out


# --- The encoding is the code -----------------------------------------------------------------------


@pytest.mark.clause("rs-send-chunk", "ag-send-chunk", "ring-topology", "rs-owned-chunk")
def test_encoded_schedule_is_ring_ref_schedule_for_every_n_up_to_64() -> None:
    o = NumpyOps()
    for n in range(2, MAX_N + 1):
        # r up to n - 1: the extra-round fault's range is encoded too.
        r, i = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        pairs = [(int(a), int(b)) for a, b in zip(r.ravel(), i.ravel(), strict=True)]
        checks: list[tuple[Any, Callable[[int, int, int], int]]] = [
            (prove.right(o, i, n), lambda _r, i, n: schedule.right(i, n)),
            (prove.left(o, i, n), lambda _r, i, n: schedule.left(i, n)),
            (prove.owned_chunk(o, i, n), lambda _r, i, n: schedule.owned_chunk(i, n)),
            (prove.rs_send_chunk(o, i, r, n), lambda r, i, n: schedule.rs_send_chunk(i, r, n)),
            (prove.ag_send_chunk(o, i, r, n), lambda r, i, n: schedule.ag_send_chunk(i, r, n)),
            (prove.rs_recv_chunk(o, i, r, n), lambda r, i, n: schedule.rs_recv_chunk(i, r, n)),
            (prove.ag_recv_chunk(o, i, r, n), lambda r, i, n: schedule.ag_recv_chunk(i, r, n)),
            (prove.changed_slot(o, RS, r, i, n), lambda r, i, n: invariants.changed_slot(RS, r, i, n)),
            (prove.changed_slot(o, AG, r, i, n), lambda r, i, n: invariants.changed_slot(AG, r, i, n)),
        ]
        for encoded, python in checks:
            assert encoded.ravel().tolist() == [python(a, b, n) for a, b in pairs]
        assert int(prove.CORE.rounds(n)) == schedule.rounds_per_phase(n)


def _grid(n: int, r_lo: int) -> tuple[Any, Any, Any]:
    return tuple(np.meshgrid(np.arange(r_lo, n - 1), np.arange(n), np.arange(n), indexing="ij"))  # type: ignore[return-value]


def _assert_closed_form(phase: Phase, n: int, r_lo: int) -> None:
    o = NumpyOps()
    r, i, c = _grid(n, r_lo)
    v = prove.expected(o, phase, Symbols(n, r, i, c))
    assert bool(np.all(v.arc))
    finished = prove.expected_finished(o, phase, Symbols(n, r, i, c))
    complete = prove.is_complete(o, n, v)
    # Every arc of this ring as a tuple, indexed by start * (n + 1) + length.
    doubled = tuple(range(n)) * 2
    arcs = [doubled[s : s + ln] for s in range(n) for ln in range(n + 1)]
    index = (v.start * (n + 1) + v.length).reshape(len(range(r_lo, n - 1)), n * n).tolist()
    for k, rr in enumerate(range(r_lo, n - 1)):
        state = invariants.expected_state(phase, rr, n)
        # The encoded arcs rebuilt as tuples must be the whole state, slot for slot.
        assert list(map(arcs.__getitem__, index[k])) == list(chain.from_iterable(state)), (phase, n, rr)
        want = invariants.expected_finished(phase, rr, n)
        got = tuple(frozenset(np.flatnonzero(row).tolist()) for row in finished[k])
        assert got == want, (phase, n, rr)
        assert tuple(frozenset(np.flatnonzero(row).tolist()) for row in complete[k]) == want


@pytest.mark.clause("inv-rs-provenance", "inv-finished-chunks")
def test_encoded_rs_closed_form_is_ring_ref_invariants_for_every_n_up_to_64() -> None:
    for n in range(2, MAX_N + 1):
        _assert_closed_form(REDUCE_SCATTER, n, -1)


@pytest.mark.clause("inv-ag-provenance", "inv-finished-chunks")
def test_encoded_ag_closed_form_is_ring_ref_invariants_for_every_n_up_to_64() -> None:
    for n in range(2, MAX_N + 1):
        _assert_closed_form(ALL_GATHER, n, 0)


def test_encoded_completeness_is_is_complete_on_every_arc_up_to_64() -> None:
    o = NumpyOps()
    for n in range(2, MAX_N + 1):
        s, length = np.meshgrid(np.arange(n), np.arange(1, n + 1), indexing="ij")
        encoded = prove.is_complete(o, n, prove.arc_value(o, s, length))
        python = [
            invariants.is_complete(invariants.arc(a, b, n), n)
            for a, b in zip(s.ravel().tolist(), length.ravel().tolist(), strict=True)
        ]
        assert encoded.ravel().tolist() == python


def _values(n: int, max_len: int) -> Iterator[tuple[Provenance, Value]]:
    """Every arc of length 1..max_len, and some non-arcs, with their encodings."""
    o = NumpyOps()
    for s in range(n):
        for length in range(1, max_len + 1):
            yield tuple((s + k) % n for k in range(length)), prove.arc_value(o, np.int64(s), np.int64(length))
    for s in range(n):
        # (s, s+2): no arc for n >= 3; its encoding is (s, 2, arc=False).
        p = (s, (s + 2) % n)
        yield p, Value(np.int64(s), np.int64(2), np.bool_(p == (s, (s + 1) % n)))


@pytest.mark.parametrize("n", range(2, 9))
def test_encoded_concatenation_and_equality_are_the_tuples(n: int) -> None:
    o = NumpyOps()
    values = list(_values(n, n))
    for p, v in values:
        for q, w in values:
            cat = prove.concat(o, n, v, w)
            assert _describes(p + q, int(cat.start), int(cat.length), bool(cat.arc), n), (p, q)
            if bool(w.arc):
                assert bool(prove.same(o, v, w)) == (p == q), (p, q)


def _previous(phase: Phase, r: int, n: int) -> State[Provenance]:
    if phase == ALL_GATHER and r == 0:
        return invariants.expected_state(REDUCE_SCATTER, n - 2, n)
    return invariants.expected_state(phase, r - 1, n)


def _assert_round_encoded(model: prove.Model, phase: Phase, r: int, n: int, after: State[Provenance]) -> None:
    o = NumpyOps()
    i, c = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    v = prove.round_value(o, model, phase, Symbols(n, r, i, c))
    for w in range(n):
        for slot in range(n):
            start, length, is_arc = _tuple_of(v, n, (w, slot))
            assert _describes(after[w][slot], start, length, is_arc, n), (model.name, phase, r, n, w, slot)


@pytest.mark.clause("rs-add", "ag-copy-not-add", "simultaneous-rounds")
@pytest.mark.parametrize("model", [prove.CORE, prove.IN_PLACE], ids=lambda m: m.name)
def test_encoded_round_is_the_core_round(model: prove.Model) -> None:
    for n in range(2, ROUND_MAX_N + 1):
        for phase, r in schedule.all_rounds(n):
            after = core.step(_previous(phase, r, n), phase, r, fold)
            _assert_round_encoded(model, phase, r, n, after)


# --- Planted faults: the prover refutes each, and the refutation replays ---------------------------------


def _wrong_send(i: int, r: int, n: int) -> int:
    return (i - r + 1) % n


def _faulty_round(
    name: str, state: State[Provenance], phase: Phase, r: int, monkeypatch: pytest.MonkeyPatch
) -> State[Provenance]:
    """The concrete faulty round, built from ``ring_ref.core`` and ``tests/faults.py``."""
    with monkeypatch.context() as patch:
        if name == "wrong-send-index":
            patch.setattr(schedule, "rs_send_chunk", _wrong_send)
        if name == "adding-all-gather" and phase == ALL_GATHER:
            return faults.adding_all_gather(state, r, fold)
        if name == "forwarding" and phase == REDUCE_SCATTER:
            return faults.forwarding_reduce_scatter(state, r, fold)
        return core.step(state, phase, r, fold)


@pytest.mark.parametrize("name", sorted(prove.FAULTS))
def test_encoded_fault_is_the_concrete_faulty_round(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = prove.FAULTS[name]
    for n in range(2, 10):
        for phase in (REDUCE_SCATTER, ALL_GATHER):
            for r in range(int(model.rounds(n))):
                after = _faulty_round(name, _previous(phase, r, n), phase, r, monkeypatch)
                _assert_round_encoded(model, phase, r, n, after)


EXPECTED_FAILURES = {
    "wrong-send-index": {"rs-step"},
    "adding-all-gather": {"ag-step"},
    "extra-round": {"rs-step", "finished-chunks/rs"},
    "forwarding": {"rs-step", "write-not-read/rs"},
}


@pytest.mark.clause("rs-send-chunk", "ag-copy-not-add", "round-count", "simultaneous-rounds")
@pytest.mark.parametrize("min_n", [2, 5])
@pytest.mark.parametrize("name", sorted(prove.FAULTS))
def test_planted_fault_gets_a_counterexample_that_replays(
    name: str, min_n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = {res.obligation: res for res in prove.prove(prove.FAULTS[name], min_n=min_n)}
    failed = {ob for ob, res in results.items() if not res.proved}
    assert EXPECTED_FAILURES[name] <= failed, failed
    for ob in failed:
        assert results[ob].detail == "", "a fault must break a goal, not the encoding's claims"
        cex = results[ob].counterexample
        assert cex is not None
        assert cex.n >= min_n
    steps: tuple[tuple[str, Phase], ...] = (("rs-step", REDUCE_SCATTER), ("ag-step", ALL_GATHER))
    for ob, phase in steps:
        if ob in failed:
            n, r, i, c = results[ob].counterexample  # type: ignore[misc]
            after = _faulty_round(name, _previous(phase, r, n), phase, r, monkeypatch)
            closed = invariants.rs_expected if phase == REDUCE_SCATTER else invariants.ag_expected
            assert after[i][c] != closed(n, r, i, c), (name, n, r, i, c)
            violation = invariants.first_violation(after, phase, r)
            assert violation is not None
    if "write-not-read/rs" in failed:
        n, r, i, c = results["write-not-read/rs"].counterexample  # type: ignore[misc]
        before = _previous(REDUCE_SCATTER, r, n)
        after = _faulty_round(name, before, REDUCE_SCATTER, r, monkeypatch)
        j = schedule.right(i, n)
        # Worker i received into slot c this round, and its right neighbour got that new value.
        assert after[i][c] != before[i][c]
        assert after[j][c][: len(after[i][c])] == after[i][c]


def test_a_fault_in_the_encoding_itself_is_reported_as_a_broken_claim() -> None:
    """A mod whose operand leaves its claimed range is caught, not silently wrong."""

    def bad_send(o: prove.Ops, i: Any, r: Any, n: Any) -> Any:
        return o.mod(i - r + 1, n, 0, 2)  # i - r + 1 can be negative

    model = replace(prove.CORE, name="bad-encoding", send={RS: bad_send, AG: prove.ag_send_chunk})
    res = prove.prove_one(model, prove.OBLIGATIONS[0])
    assert res.detail == "encoding claim"
    assert res.counterexample is not None
    n, r, i, _ = res.counterexample
    assert i - r + 1 < 0 <= n
