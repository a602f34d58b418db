"""Contracts of ``ring_ref/_contracts.py`` stated over planted faulty rounds.

Not collected by pytest; ``tests/nocover/test_contracts.py`` runs CrossHair on this file
and expects a counterexample for each function.
"""

from __future__ import annotations

from ring_ref._contracts import add_ints, ag_round_is_copy, rs_round_is_add, small_round_input
from tests.common.faults import adding_all_gather, wrong_chunk_reduce_scatter


def faulty_ag_round_contract(state: tuple[tuple[int, ...], ...], r: int) -> None:
    assert small_round_input(state, r)
    assert ag_round_is_copy(state, adding_all_gather(state, r, add_ints), r)


def faulty_rs_round_contract(state: tuple[tuple[int, ...], ...], r: int) -> None:
    assert small_round_input(state, r)
    assert rs_round_is_add(state, wrong_chunk_reduce_scatter(state, r, add_ints), r)
