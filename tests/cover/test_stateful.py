"""A Hypothesis state machine that steps the ring one round at a time.

After every step it checks, against the closed forms of ``ring_ref.invariants``:
the provenance of every slot (``inv-rs-provenance``, ``inv-ag-provenance``),
which chunks each worker has finished (``inv-finished-chunks``), and that every
slot's value is exactly the sum of the contributions its provenance names
(values are exact rationals, so this is an independent check of the
arithmetic).  Subclasses plant faults in the round functions; each must be
caught, which shows the checks bite.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import Phase as HypothesisPhase
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from ring_ref import invariants
from ring_ref.core import (
    Combine,
    all_gather_round,
    fold,
    initial_state,
    provenance_state,
    reduce_scatter_round,
)
from ring_ref.invariants import State
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, Phase
from tests.common.faults import adding_all_gather, forwarding_reduce_scatter, wrong_chunk_reduce_scatter

pytestmark = pytest.mark.clause(
    "inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks", "rs-add", "ag-copy-not-add"
)

Round = Callable[[State[Any], int, Combine[Any]], State[Any]]


def correct_rs(state: State[Any], r: int, combine: Combine[Any]) -> State[Any]:
    return reduce_scatter_round(state, r, combine)


def correct_ag(state: State[Any], r: int, _combine: Combine[Any]) -> State[Any]:
    return all_gather_round(state, r)


class RingMachine(RuleBasedStateMachine):
    """Runs reduce-scatter then all-gather, one round per step, checking every invariant."""

    rs_round: Round = staticmethod(correct_rs)
    ag_round: Round = staticmethod(correct_ag)
    rs_rounds_extra = 0

    def __init__(self) -> None:
        super().__init__()
        self.n = 0
        self.x: list[list[Fraction]] = []
        self.values: State[Fraction] = ()
        self.prov: State[tuple[int, ...]] = ()
        self.phase: Phase = REDUCE_SCATTER
        self.r = -1

    @initialize(n=st.integers(1, 7), data=st.data())
    def start(self, n: int, data: st.DataObject) -> None:
        self.n = n
        cell = st.fractions(min_value=-100, max_value=100, max_denominator=64)
        self.x = [[data.draw(cell) for _ in range(n)] for _ in range(n)]
        self.values = initial_state(self.x)
        self.prov = provenance_state(n)

    def _rs_rounds(self) -> int:
        return self.n - 1 + self.rs_rounds_extra

    @precondition(lambda self: self.phase == REDUCE_SCATTER and self.r + 1 < self._rs_rounds())
    @rule()
    def reduce_scatter_step(self) -> None:
        self.r += 1
        self.values = self.rs_round(self.values, self.r, operator.add)
        self.prov = self.rs_round(self.prov, self.r, fold)

    @precondition(
        lambda self: (
            self.n > 1
            and (self.phase == ALL_GATHER or self.r + 1 == self._rs_rounds())
            and not (self.phase == ALL_GATHER and self.r == self.n - 2)
        )
    )
    @rule()
    def all_gather_step(self) -> None:
        if self.phase == REDUCE_SCATTER:
            self.phase, self.r = ALL_GATHER, -1
        self.r += 1
        self.values = self.ag_round(self.values, self.r, operator.add)
        self.prov = self.ag_round(self.prov, self.r, fold)

    def _done(self) -> bool:
        return self.n > 0 and (self.n == 1 or (self.phase == ALL_GATHER and self.r == self.n - 2))

    @precondition(lambda self: self._done())
    @rule()
    def finished(self) -> None:
        """Terminal: every worker holds the exact total of every chunk."""
        totals = [sum((self.x[w][c] for w in range(self.n)), Fraction(0)) for c in range(self.n)]
        for row in self.values:
            assert list(row) == totals

    @invariant()
    def provenance_matches_closed_form(self) -> None:
        if self.n:
            holds = (
                invariants.holds_rs_invariant
                if self.phase == REDUCE_SCATTER
                else invariants.holds_ag_invariant
            )
            violation = invariants.first_violation(self.prov, self.phase, self.r)
            assert holds(self.prov, self.r), f"after {self.phase} round {self.r}: {violation}"

    @invariant()
    def finished_chunks_match_closed_form(self) -> None:
        if self.n:
            assert invariants.holds_finished_chunks(self.prov, self.phase, self.r), (
                f"after {self.phase} round {self.r}: finished {invariants.finished_chunks(self.prov)}"
            )

    @invariant()
    def values_are_the_sums_their_provenance_names(self) -> None:
        for i, row in enumerate(self.values):
            for c, value in enumerate(row):
                assert value == sum((self.x[w][c] for w in self.prov[i][c]), Fraction(0)), (i, c)


TestRingMachine = RingMachine.TestCase
# 2 (n - 1) rounds plus the terminal rule; more steps would only repeat `finished`.
TestRingMachine.settings = settings(TestRingMachine.settings, stateful_step_count=16)


class AddingAllGatherMachine(RingMachine):
    ag_round = staticmethod(adding_all_gather)


class WrongChunkMachine(RingMachine):
    rs_round = staticmethod(wrong_chunk_reduce_scatter)


class ForwardingMachine(RingMachine):
    rs_round = staticmethod(forwarding_reduce_scatter)


class ExtraRoundMachine(RingMachine):
    rs_rounds_extra = 1


@pytest.mark.clause("simultaneous-rounds", "round-count")
@pytest.mark.parametrize(
    ("machine", "message"),
    [
        (AddingAllGatherMachine, "after all-gather round"),
        (WrongChunkMachine, "after reduce-scatter round"),
        (ForwardingMachine, "after reduce-scatter round"),
        (ExtraRoundMachine, "after reduce-scatter round"),
    ],
    ids=["ag-adds", "wrong-chunk", "forwards-same-round", "extra-round"],
)
def test_planted_fault_is_caught(machine: type[RingMachine], message: str) -> None:
    fast = settings(
        max_examples=200,
        deadline=None,
        database=None,
        phases=[HypothesisPhase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    with pytest.raises(AssertionError, match=message):
        run_state_machine_as_test(machine, settings=fast)
