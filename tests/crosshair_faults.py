"""Contracts of ``ring_ref/contracts.py`` stated over planted faulty rounds.

Not collected by pytest; ``tests/test_contracts.py`` runs CrossHair on this file
and expects a counterexample for each function.
"""

from __future__ import annotations

from ring_ref.contracts import ag_round_is_copy, rs_round_is_add
from tests.faults import adding_all_gather, wrong_chunk_reduce_scatter


def _add(incoming: int, own: int) -> int:
    return incoming + own


def faulty_ag_round_contract(state: tuple[tuple[int, ...], ...], r: int) -> None:
    assert 2 <= len(state) <= 3
    assert all(len(row) == len(state) for row in state)
    assert 0 <= r < len(state) - 1
    assert ag_round_is_copy(state, adding_all_gather(state, r, _add), r)


def faulty_rs_round_contract(state: tuple[tuple[int, ...], ...], r: int) -> None:
    assert 2 <= len(state) <= 3
    assert all(len(row) == len(state) for row in state)
    assert 0 <= r < len(state) - 1
    assert rs_round_is_add(state, wrong_chunk_reduce_scatter(state, r, _add), r)
