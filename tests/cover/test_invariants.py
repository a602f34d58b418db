"""The invariant predicates themselves: the per-round shortcut agrees with the full check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ring_ref import invariants
from ring_ref.core import fold, provenance_state, step
from ring_ref.invariants import InvariantViolation, changed_slot, check, check_round
from ring_ref.schedule import REDUCE_SCATTER, all_rounds

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
