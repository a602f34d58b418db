"""Assert-style contracts on the schedule, the core and the invariants, for CrossHair.

Each function's leading ``assert`` statements are its preconditions and the
later ones its postconditions; ``make contracts`` runs
``crosshair check --analysis_kind=asserts`` on this module, which explores the
inputs symbolically and must find no counterexample.  The arguments are plain
ints and tuples, which CrossHair reasons about; ring sizes are bounded
(``n <= MAX_N``) where a body loops over workers, so each path terminates.

The postconditions are phrased through the predicates ``rs_round_is_add`` and
``ag_round_is_copy``, so a planted faulty step can be checked against the very
same statements (``tests/nocover/test_contracts.py``).
"""

from __future__ import annotations

from ring_ref.core import all_gather_round, fold, provenance_state, reduce_scatter_round
from ring_ref.invariants import (
    State,
    changed_slot,
    expected_finished,
    expected_state,
    expected_state_before,
    finished_chunks,
)
from ring_ref.schedule import (
    ALL_GATHER,
    REDUCE_SCATTER,
    ag_recv_chunk,
    ag_send_chunk,
    left,
    owned_chunk,
    right,
    rs_recv_chunk,
    rs_send_chunk,
)

MAX_N = 5


def add_ints(incoming: int, own: int) -> int:
    """The combine for integer buffers."""
    return incoming + own


def small_round_input(state: State[int], r: int) -> bool:
    """Precondition of the round contracts: a square state of 2 or 3 workers and a valid round."""
    return 2 <= len(state) <= 3 and all(len(row) == len(state) for row in state) and 0 <= r < len(state) - 1


def rs_round_is_add(before: State[int], after: State[int], r: int) -> bool:
    """``rs-add``: only the received slot changes, to ``incoming + own``."""
    n = len(before)
    return len(after) == n and all(
        after[i][c] == (before[left(i, n)][c] + before[i][c] if c == rs_recv_chunk(i, r, n) else before[i][c])
        for i in range(n)
        for c in range(n)
    )


def ag_round_is_copy(before: State[int], after: State[int], r: int) -> bool:
    """``ag-copy-not-add``: only the received slot changes, to the sender's value."""
    n = len(before)
    return len(after) == n and all(
        after[i][c] == (before[left(i, n)][c] if c == ag_recv_chunk(i, r, n) else before[i][c])
        for i in range(n)
        for c in range(n)
    )


def schedule_in_range(i: int, r: int, n: int) -> None:
    """Every chunk index the schedule produces is a valid slot; neighbours are inverse."""
    assert n >= 2
    assert 0 <= i < n
    assert 0 <= r < n - 1
    for c in (rs_send_chunk(i, r, n), rs_recv_chunk(i, r, n), ag_send_chunk(i, r, n), ag_recv_chunk(i, r, n)):
        assert 0 <= c < n
    assert left(right(i, n), n) == i
    assert right(i, n) != i


def rs_pipeline(i: int, r: int, n: int) -> None:
    """``rs-send-chunk``: in round ``r + 1`` a worker sends on the chunk it added into in round ``r``.

    Also: a worker never receives its own chunk ``i`` in reduce-scatter, and its
    last receive is the chunk it owns (``rs-owned-chunk``).
    """
    assert n >= 2
    assert 0 <= i < n
    assert 0 <= r < n - 1
    assert rs_recv_chunk(i, r, n) != i
    if r + 1 < n - 1:
        assert rs_send_chunk(i, r + 1, n) == rs_recv_chunk(i, r, n)
    else:
        assert rs_recv_chunk(i, r, n) == owned_chunk(i, n)


def rs_receives_distinct(i: int, r1: int, r2: int, n: int) -> None:
    """Reduce-scatter adds into a different slot in each round, so no slot is added twice."""
    assert n >= 2
    assert 0 <= i < n
    assert 0 <= r1 < r2 < n - 1
    assert rs_recv_chunk(i, r1, n) != rs_recv_chunk(i, r2, n)


def ag_pipeline(i: int, r: int, n: int) -> None:
    """``ag-send-chunk``: all-gather starts from the owned chunk and forwards what it received."""
    assert n >= 2
    assert 0 <= i < n
    assert 0 <= r < n - 1
    assert ag_send_chunk(i, 0, n) == owned_chunk(i, n)
    assert ag_recv_chunk(i, r, n) != owned_chunk(i, n)
    if r + 1 < n - 1:
        assert ag_send_chunk(i, r + 1, n) == ag_recv_chunk(i, r, n)


def rs_round_contract(state: tuple[tuple[int, ...], ...], r: int) -> None:
    """The core's reduce-scatter round on arbitrary integer buffers satisfies ``rs-add``."""
    assert small_round_input(state, r)
    assert rs_round_is_add(state, reduce_scatter_round(state, r, add_ints), r)


def ag_round_contract(state: tuple[tuple[int, ...], ...], r: int) -> None:
    """The core's all-gather round on arbitrary integer buffers satisfies ``ag-copy-not-add``."""
    assert small_round_input(state, r)
    assert ag_round_is_copy(state, all_gather_round(state, r), r)


def rs_invariant_inductive(n: int, r: int) -> None:
    """``inv-rs-provenance`` is inductive: one core round maps the closed form at ``r`` to ``r + 1``."""
    assert 1 <= n <= MAX_N
    assert -1 <= r < n - 2
    before = expected_state(REDUCE_SCATTER, r, n)
    if r == -1:
        assert before == provenance_state(n)
    after = reduce_scatter_round(before, r + 1, fold)
    assert after == expected_state(REDUCE_SCATTER, r + 1, n)
    assert finished_chunks(after) == expected_finished(REDUCE_SCATTER, r + 1, n)


def ag_invariant_inductive(n: int, r: int) -> None:
    """``inv-ag-provenance`` is inductive, starting from the reduce-scatter end state."""
    assert 2 <= n <= MAX_N
    assert -1 <= r < n - 2
    before = expected_state(ALL_GATHER, r, n)
    if r == -1:
        assert before == expected_state(REDUCE_SCATTER, n - 2, n)
    after = all_gather_round(before, r + 1)
    assert after == expected_state(ALL_GATHER, r + 1, n)
    assert finished_chunks(after) == expected_finished(ALL_GATHER, r + 1, n)
    if r + 1 == n - 2:
        assert all(row == after[0] for row in after)


def changed_slot_is_the_only_change(n: int, r: int) -> None:
    """``check_round``'s premise: each round changes the closed form in one slot per worker."""
    assert 1 <= n <= MAX_N
    assert 0 <= r < n - 1
    for phase in (REDUCE_SCATTER, ALL_GATHER):
        before = expected_state_before(phase, r, n)
        after = expected_state(phase, r, n)
        for i in range(n):
            differ = [c for c in range(n) if before[i][c] != after[i][c]]
            assert differ == [changed_slot(phase, r, i, n)]
