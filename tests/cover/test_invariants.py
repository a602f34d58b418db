"""The invariant predicates themselves: the per-round shortcut agrees with the full check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ring_ref import invariants
from ring_ref.core import fold, provenance_state, step
from ring_ref.invariants import (
    InvariantViolation,
    Provenance,
    State,
    arc,
    changed_slot,
    check,
    check_round,
    first_violation,
)
from ring_ref.schedule import ALL_GATHER, GLOO, REDUCE_SCATTER, Phase, RingSchedule, all_rounds
from tests.common.oracles import spec_slot

pytestmark = pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance")


@pytest.mark.parametrize("n", range(1, 14))
def test_closed_form_changes_exactly_at_changed_slot(n: int) -> None:
    for phase, r in all_rounds(n):
        before, after = invariants.expected_state_before(phase, r, n), invariants.expected_state(phase, r, n)
        for i in range(n):
            differ = [c for c in range(n) if before[i][c] != after[i][c]]
            assert differ == [changed_slot(phase, r, i, n)]


@given(st.integers(2, 9), st.data())
def test_check_round_rejects_exactly_what_the_full_check_rejects(n: int, data: st.DataObject) -> None:
    """Damage one slot of a correct round (or leave it intact): both checks must agree."""
    phase, r = data.draw(st.sampled_from(all_rounds(n)))
    before = invariants.expected_state_before(phase, r, n)
    after = [list(row) for row in step(before, phase, r, fold)]
    damaged = data.draw(st.booleans())
    if damaged:
        i, c = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))
        after[i][c] = data.draw(
            st.sampled_from([after[i][c] + (i,), after[i][c][:-1], (c,), (*reversed(after[i][c]), n)])
        )
    state = tuple(tuple(row) for row in after)
    full_ok = invariants.first_violation(state, phase, r) is None
    try:
        check_round(before, state, phase, r)
        shortcut_ok = True
    except InvariantViolation:
        shortcut_ok = False
    assert shortcut_ok == full_ok
    if not damaged:
        assert full_ok


def test_check_round_names_the_broken_slot() -> None:
    before = provenance_state(4)
    after = step(before, REDUCE_SCATTER, 0, fold)
    broken = tuple(row if i != 2 else (row[0], row[1] + (2,), *row[2:]) for i, row in enumerate(after))
    with pytest.raises(InvariantViolation, match=r"reduce-scatter round 0: worker 2 slot 1"):
        check_round(before, broken, REDUCE_SCATTER, 0)
    check(after, REDUCE_SCATTER, 0)


# ==========================================================================================================
# Behaviour of the invariant predicates on inputs the other tests never gave them.
#
# Arcs that start outside ``0 .. n-1``; malformed (ragged, short) states; rounds
# in which *every* worker's received slot is wrong; a reduce-scatter round whose
# received slots hold the all-gather closed form (a check that confused the two
# phases would accept it).  Expected values come from independent one-line
# statements of the spec, not from the code under test.
# ==========================================================================================================


def _spec_arc(start: int, length: int, n: int) -> Provenance:
    return tuple((start + k) % n for k in range(length))


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_arc_takes_its_start_mod_n(n: int) -> None:
    for start in range(-2 * n, 3 * n):
        for length in range(n + 1):
            assert arc(start, length, n) == _spec_arc(start, length, n), (start, length, n)


def _rows(state: State[Provenance]) -> list[list[Provenance]]:
    return [list(row) for row in state]


def _frozen(rows: list[list[Provenance]]) -> State[Provenance]:
    return tuple(tuple(row) for row in rows)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 5])
def test_first_violation_refuses_a_ragged_state(n: int) -> None:
    state = _rows(provenance_state(n))
    state[n - 1] = state[n - 1][:-1]
    with pytest.raises(ValueError, match=rf"a ring state must be {n} workers x {n} slots"):
        first_violation(_frozen(state), REDUCE_SCATTER, -1)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 4])
def test_check_round_refuses_a_ragged_or_short_state(n: int) -> None:
    before = provenance_state(n)
    after = _rows(step(before, REDUCE_SCATTER, 0, fold))
    ragged = [*after[:-1], [*after[-1], (0,)]]
    with pytest.raises(ValueError, match="workers x"):
        check_round(before, _frozen(ragged), REDUCE_SCATTER, 0)
    with pytest.raises(ValueError):
        check_round(before, _frozen(after[:-1]), REDUCE_SCATTER, 0)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 6])
def test_check_round_rejects_a_round_where_every_received_slot_is_wrong(n: int) -> None:
    for phase, r in all_rounds(n):
        before = invariants.expected_state_before(phase, r, n)
        after = _rows(step(before, phase, r, fold))
        for i in range(n):
            c = invariants.changed_slot(phase, r, i, n)
            after[i][c] = (*after[i][c], i)  # one contribution too many, everywhere
        with pytest.raises(InvariantViolation, match=rf"after {phase} round {r}: worker 0 slot"):
            check_round(before, _frozen(after), phase, r)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 6])
def test_check_round_rejects_a_round_that_was_not_run(n: int) -> None:
    for phase, r in all_rounds(n):
        before = invariants.expected_state_before(phase, r, n)
        with pytest.raises(InvariantViolation, match=rf"after {phase} round {r}"):
            check_round(before, before, phase, r)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [3, 4, 6])
def test_check_round_does_not_mix_up_the_phases(n: int) -> None:
    """A reduce-scatter round whose received slots hold the all-gather closed form is wrong."""
    for r in range(n - 1):
        before = invariants.expected_state_before(REDUCE_SCATTER, r, n)
        after = _rows(before)
        for i in range(n):
            c = invariants.changed_slot(REDUCE_SCATTER, r, i, n)
            after[i][c] = invariants.ag_expected(n, r, i, c)
        state = _frozen(after)
        if state == invariants.expected_state(REDUCE_SCATTER, r, n):
            continue
        with pytest.raises(InvariantViolation):
            check_round(before, state, REDUCE_SCATTER, r)
    for r in range(n - 1):
        # And an all-gather round whose received slots hold the reduce-scatter form.
        before = invariants.expected_state_before(ALL_GATHER, r, n)
        after = _rows(before)
        for i in range(n):
            c = invariants.changed_slot(ALL_GATHER, r, i, n)
            after[i][c] = invariants.rs_expected(n, r, i, c)
        with pytest.raises(InvariantViolation):
            check_round(before, _frozen(after), ALL_GATHER, r)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 5])
def test_check_round_accepts_every_correct_round(n: int) -> None:
    for phase, r in all_rounds(n):
        before = invariants.expected_state_before(phase, r, n)
        check_round(before, step(before, phase, r, fold), phase, r)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 5])
def test_check_names_a_finished_chunks_mismatch(n: int) -> None:
    """A state whose provenance is right up to one completed slot too few is reported."""
    state = _rows(invariants.expected_state(ALL_GATHER, n - 2, n))
    state[0][0] = (*state[0][0][:-1],)
    with pytest.raises(InvariantViolation, match=r"worker 0 slot 0 holds contributions"):
        check(_frozen(state), ALL_GATHER, n - 2)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 4])
def test_check_round_refuses_a_before_state_of_fewer_workers(n: int) -> None:
    before = provenance_state(n)
    after = _rows(step(before, REDUCE_SCATTER, 0, fold))
    after[-1][0] = (n - 1, n - 1)  # the last worker is wrong; a truncating comparison would miss it
    with pytest.raises(ValueError):
        check_round(before[:-1], _frozen(after), REDUCE_SCATTER, 0)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 5])
def test_holds_predicates_accept_the_closed_form_and_reject_a_damaged_one(n: int) -> None:
    for r in range(-1, n - 1):
        state = invariants.expected_state(REDUCE_SCATTER, r, n)
        assert invariants.holds_rs_invariant(state, r)
        damaged = _rows(state)
        damaged[n - 1][0] = (*damaged[n - 1][0], 0)
        assert not invariants.holds_rs_invariant(_frozen(damaged), r)
    for r in range(n - 1):
        state = invariants.expected_state(ALL_GATHER, r, n)
        assert invariants.holds_ag_invariant(state, r)
        damaged = _rows(state)
        damaged[0][n - 1] = (n - 1,) * 2
        assert not invariants.holds_ag_invariant(_frozen(damaged), r)


def _spec_finished(phase: Phase, r: int, n: int) -> tuple[frozenset[int], ...]:
    """inv-finished-chunks as the spec words it."""
    if phase == REDUCE_SCATTER:
        return tuple(frozenset({(i + 1) % n} if r == n - 2 else ()) for i in range(n))
    return tuple(frozenset(c for c in range(n) if (i + 1 - c) % n <= r + 1) for i in range(n))


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_expected_finished_is_the_spec_sentence(n: int) -> None:
    for r in range(-1, n - 1):
        assert invariants.expected_finished(REDUCE_SCATTER, r, n) == _spec_finished(REDUCE_SCATTER, r, n)
    for r in range(n - 1):
        assert invariants.expected_finished(ALL_GATHER, r, n) == _spec_finished(ALL_GATHER, r, n)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
def test_check_message_names_both_the_contributions_found_and_those_required() -> None:
    state = _rows(invariants.expected_state(REDUCE_SCATTER, 0, 3))
    state[2][1] = (1, 2, 2)
    with pytest.raises(InvariantViolation) as caught:
        check(_frozen(state), REDUCE_SCATTER, 0)
    assert str(caught.value) == (
        "after reduce-scatter round 0: worker 2 slot 1 holds contributions (1, 2, 2), "
        "the spec requires (1, 2)"
    )


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_check_refuses_a_reduce_scatter_round_past_the_last(n: int) -> None:
    """After one round too many the provenance formula still matches, but nothing may be finished."""
    state = invariants.expected_state(REDUCE_SCATTER, n - 1, n)
    finished = tuple(frozenset({(i + 1) % n}) for i in range(n))
    with pytest.raises(InvariantViolation) as caught:
        check(state, REDUCE_SCATTER, n - 1)
    assert str(caught.value) == (
        f"after reduce-scatter round {n - 1}: finished chunks {finished} differ from "
        f"{tuple(frozenset() for _ in range(n))}"
    )


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 5])
def test_check_round_rejects_damage_to_any_slot_the_round_must_not_touch(n: int) -> None:
    """Every slot other than the one received must be as before; damaging any one of them is caught."""
    for phase, r in all_rounds(n):
        before = invariants.expected_state_before(phase, r, n)
        good = step(before, phase, r, fold)
        for i in range(n):
            for c in range(n):
                if c == invariants.changed_slot(phase, r, i, n):
                    continue
                after = _rows(good)
                after[i][c] = (*after[i][c], i)
                with pytest.raises(InvariantViolation, match=rf"worker {i} slot {c}"):
                    check_round(before, _frozen(after), phase, r)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_check_refuses_an_all_gather_round_before_the_first(n: int) -> None:
    """r = -2: the state matches the formula, but the finished chunks cannot."""
    state = invariants.expected_state(ALL_GATHER, -2, n)
    finished = tuple(frozenset({(i + 1) % n}) for i in range(n))
    with pytest.raises(InvariantViolation) as caught:
        check(state, ALL_GATHER, -2)
    assert str(caught.value) == (
        f"after all-gather round -2: finished chunks {finished} differ from "
        f"{tuple(frozenset() for _ in range(n))}"
    )


# --- the schedule family (clause schedule-invariants) --------------------------------------------

FAMILY = [GLOO, RingSchedule(-1, 0, "even"), RingSchedule(1, 2, "even")]
"""Rings whose closed forms differ from the spec's (openmpi-ring has the spec's, on other chunks)."""


def _family_rounds(
    ring: RingSchedule, n: int
) -> list[tuple[Phase, int, State[Provenance], State[Provenance]]]:
    """``(phase, r, before, after)`` for every round of ``ring``, stepped by the core."""
    state, out = provenance_state(n), []
    for phase, r in all_rounds(n):
        after = step(state, phase, r, fold, schedule=ring)
        out.append((phase, r, state, after))
        state = after
    return out


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.clause("schedule-invariants")
@pytest.mark.parametrize("ring", FAMILY, ids=str)
@pytest.mark.parametrize("n", [3, 4, 5])
def test_the_predicates_hold_for_the_ring_they_are_given_and_not_for_the_spec(
    ring: RingSchedule, n: int
) -> None:
    spec_agrees = []
    for phase, r, before, after in _family_rounds(ring, n):
        holds = invariants.holds_rs_invariant if phase == REDUCE_SCATTER else invariants.holds_ag_invariant
        assert holds(after, r, schedule=ring), (phase, r)
        assert invariants.holds_finished_chunks(after, phase, r, schedule=ring), (phase, r)
        check(after, phase, r, schedule=ring)
        check_round(before, after, phase, r, schedule=ring)
        spec_agrees.append(holds(after, r) and invariants.holds_finished_chunks(after, phase, r))
    assert not all(spec_agrees)  # the spec's closed forms tell this ring apart


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.clause("schedule-invariants")
@pytest.mark.parametrize("ring", FAMILY, ids=str)
@pytest.mark.parametrize("n", [3, 4, 5])
def test_a_round_that_delivers_nothing_is_refused_for_every_ring(ring: RingSchedule, n: int) -> None:
    for phase, r, before, _after in _family_rounds(ring, n):
        with pytest.raises(InvariantViolation, match=rf"^after {phase} round {r}: "):
            check_round(before, before, phase, r, schedule=ring)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
@pytest.mark.clause("schedule-invariants")
@pytest.mark.parametrize("ring", FAMILY, ids=str)
@pytest.mark.parametrize("n", [3, 4, 5])
def test_a_round_that_delivers_the_specs_values_into_the_rings_slots_is_refused(
    ring: RingSchedule, n: int
) -> None:
    """Each worker's slot gets what the spec's ring would hold there (``tests/common/oracles.spec_slot``)."""
    refused = 0
    for phase, r, before, after in _family_rounds(ring, n):
        rows = _rows(before)
        for i in range(n):
            (c,) = [c for c in range(n) if after[i][c] != before[i][c]]  # the slot the ring delivers
            rows[i][c] = tuple(spec_slot(phase, r, i, c, n))
        faulty = _frozen(rows)
        if faulty == after:
            continue  # here the spec's values are the ring's
        with pytest.raises(InvariantViolation, match=rf"^after {phase} round {r}: "):
            check_round(before, faulty, phase, r, schedule=ring)
        refused += 1
    assert refused > 0
