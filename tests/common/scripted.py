"""A launcher whose every answer the test chooses (the search's and the run's tests)."""

from __future__ import annotations

from collections.abc import Callable

from ring_ref import ring_all_reduce
from ring_ref.difftest import Case
from ring_ref.difftest._call import Failure, Outcome, call_target
from ring_ref.difftest._launch import Launcher, OutputLog

Answer = Callable[[Case, int], Outcome]


class Scripted(Launcher):
    """A launcher whose ``k``-th call (from 1) answers ``answer(case, k)``; it keeps the cases it got."""

    isolated = True
    kind = "scripted"

    def __init__(self, answer: Answer, *, per_rank: bool = False) -> None:
        self.answer = answer
        self.per_rank = per_rank
        self.output = OutputLog()
        self.cases: list[Case] = []
        self.started = self.closed = 0

    def start(self) -> None:
        self.started += 1

    def call(self, case: Case) -> Outcome:
        self.cases.append(case)
        return self.answer(case, len(self.cases))

    def close(self) -> None:
        self.closed += 1


def right(case: Case, k: int = 0) -> Outcome:
    outcome = call_target(ring_all_reduce, case)
    outcome.output = f"call {k}"
    return outcome


def off_by(delta: float) -> Answer:
    def answer(case: Case, k: int) -> Outcome:
        outcome = call_target(lambda x: ring_all_reduce(x) + delta, case)
        outcome.output = f"call {k}"
        return outcome

    return answer


def crashed(case: Case, k: int) -> Outcome:
    return Outcome(
        case, failure=Failure("crashed", f"died on call {k}", "stack of the dead"), output=f"call {k}"
    )
