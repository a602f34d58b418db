"""The search of one mode: Hypothesis generates cases, a failure is shrunk, zeroed, replayed twice and
diagnosed (:func:`run_mode`); :mod:`ring_ref.difftest._run` runs the modes of a :func:`difftest`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Final

import torch
from hypothesis import HealthCheck, Verbosity, example, given, settings
from hypothesis import seed as hypothesis_seed

from ring_ref._chunks import chunk_bounds, chunk_rows
from ring_ref.difftest._call import Outcome, well_formed
from ring_ref.difftest._diagnosis import Finding, diagnose, plus_zeros_only
from ring_ref.difftest._inputs import LAYOUTS, Case, cases, every_n_cases, one_worker_cases, uneven_cases
from ring_ref.difftest._launch import Launcher, as_launcher
from ring_ref.difftest._oracles import SPEC_ORDER, ExactOrder
from ring_ref.difftest._probes import ProbeRun, first_failing_probe
from ring_ref.difftest._report import Coverage, ModeResult
from ring_ref.difftest._verdict import difference, passes
from ring_ref.difftest._vocabulary import Collective, Mode, Op, Target
from ring_ref.schedule import Layout

__all__ = ["run_mode", "zero_out"]


class _Failed(Exception):
    """Raised inside the Hypothesis test so that it shrinks the failing case."""

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.case = case


class _NoAnswer(BaseException):
    """Raised when a call timed out or crashed, or a group's ranks were stopped after another raised:
    it ends the mode at once, without shrinking.

    Not an ``Exception``, so Hypothesis lets it through instead of replaying
    the case (each replay could cost the whole time limit, or a grace and a
    new group).
    """

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.case)
        self.outcome = outcome


def run_mode(
    fn: Target | Launcher,
    mode: Mode,
    *,
    examples: int,
    seed: int,
    max_workers: int,
    dtypes: Sequence[torch.dtype],
    op: Op | None = None,
    collective: Collective = Collective.ALL_REDUCE,
    order: ExactOrder = SPEC_ORDER,
) -> ModeResult:
    """Run one oracle on ``examples`` generated inputs (plus the ``N = 1`` ones); shrink a failure.

    ``op``: the op asked for (every case carries it; ``None``, none given: a sum);
    ``collective``: what the target computes (every case carries it); ``order``: what ``exact``
    checks against (its layout also labels chunks and decides which ``M`` are drawn).
    A call that times out or crashes, or whose group had ranks stopped after
    another rank raised (``Outcome.note``), ends the mode at once and is
    reported as found.  A failing case, once shrunk, is replayed twice: different answers
    are ``nondeterministic``; equal ones are diagnosed.  When the generated
    inputs pass ``exact`` (a sum), the order probes designed from the expected
    order run (:mod:`ring_ref.difftest._probes`); the first that fails is the
    counterexample, unshrunk.
    """
    launcher = as_launcher(fn)
    calls = 0
    tried = Coverage()
    overflow = underflow = 0

    def check(case: Case) -> None:
        nonlocal calls
        calls += 1
        judge(case)

    def judge(case: Case) -> None:
        nonlocal overflow, underflow
        tried.add(case)
        outcome = launcher.call(case)
        if outcome.failure is not None or outcome.note:
            raise _NoAnswer(outcome)
        ok, over, under = passes(outcome, mode, order)
        overflow += over
        underflow += under
        if not ok:
            raise _Failed(case)

    test = _search_test(
        check,
        mode,
        per_rank=launcher.per_rank,
        min_workers=launcher.min_workers,
        examples=examples,
        seed=seed,
        max_workers=max_workers,
        dtypes=dtypes,
        op=op,
        collective=collective,
        order=order,
    )

    def fails(candidate: Case, run: Callable[[Case], None] = check) -> bool:
        try:
            run(candidate)
        except _Failed:
            return True
        return False

    def replayed(case: Case) -> tuple[Outcome, Outcome]:
        first, second = launcher.call(case), launcher.call(case)
        for outcome in (first, second):
            if outcome.failure is not None:
                raise _NoAnswer(outcome)
        return first, second

    def probed() -> tuple[Case | None, ProbeRun]:
        return first_failing_probe(
            order,
            max_workers,
            dtypes,
            lambda c: fails(c, judge),
            collective=collective,
            min_workers=launcher.min_workers,
        )

    probes = None
    order_probed = mode == "exact" and op in (None, "sum") and collective.reduces
    try:
        case = _searched(test, fails)
        if case is None and order_probed:
            case, probes = probed()
        if case is None:
            return ModeResult(
                mode, "pass", calls, overflow, underflow_skipped=underflow, probes=probes, coverage=tried
            )
        first, second = replayed(case)
        if order_probed and probes is None and _zero_signs_only(first, order):
            # a fold from +0.0 fails first on zeros, the simplest inputs: an order beats it (signed-zero)
            probe, probes = probed()
            if probe is not None:
                case = probe
                first, second = replayed(case)
    except _NoAnswer as stopped:
        got = stopped.outcome
        finding = diagnose(launcher, got, mode, order)
        return ModeResult(
            mode, "fail", calls, overflow, finding, got.case, got.output, underflow, probes, tried
        )
    changed = difference(first, second)
    finding = (
        Finding(["nondeterministic"], f"The same input, called twice, gave different answers: {changed}")
        if changed
        else diagnose(launcher, first, mode, order)
    )
    if finding is None:
        finding = Finding(
            ["nondeterministic"],
            "This input failed during the search but passed both times it was replayed: the target's "
            "answer depends on more than its input (earlier calls, time, randomness)",
        )
    return ModeResult(mode, "fail", calls, overflow, finding, case, first.output, underflow, probes, tried)


def _zero_signs_only(outcome: Outcome, order: ExactOrder) -> bool:
    """Whether a stacked answer differs from ``order``'s only by ``+0.0`` for ``-0.0``."""
    result = well_formed(outcome)
    return result is not None and plus_zeros_only(outcome.case, result, order)


def _searched(test: Callable[[], None], fails: Callable[[Case], bool]) -> Case | None:
    """The search's failing case, shrunk (:func:`zero_out` last), or ``None`` when every input passed."""
    try:
        test()
    except _Failed as failed:
        return zero_out(failed.case, fails)
    except BaseExceptionGroup as group:
        found = _first_failed(group)
        if found is None:
            raise
        return zero_out(found.case, fails)
    return None


def _search_test(
    check: Callable[[Case], None],
    mode: Mode,
    *,
    per_rank: bool,
    examples: int,
    seed: int,
    max_workers: int,
    dtypes: Sequence[torch.dtype],
    op: Op | None,
    collective: Collective,
    min_workers: int,
    order: ExactOrder,
) -> Callable[[], None]:
    """The Hypothesis test that runs ``check`` on the mode's cases (the ``N = 1`` ones first, where
    ``min_workers`` is 1).

    A reduce-scatter's cases have ``M`` a multiple of ``N`` that the order's layout cuts into equal
    chunks (the shards); an all-gather's are shards of any bits (:func:`ring_ref.difftest._inputs.cases`).
    """
    layouts = ("contiguous",) if per_rank else LAYOUTS
    every_n = every_n_cases(
        mode,
        dtypes,
        range(min_workers, max_workers + 1),
        seed=seed,
        per_rank=per_rank,
        op=op,
        collective=collective,
        # exact's order probes run at every N after the search (a sum): they are its real inputs there
        drawn=not (mode == "exact" and op in (None, "sum") and collective.reduces),
    )
    if collective.alone:
        drawn = cases(
            mode, dtypes, max_workers, layouts, op=op, collective=collective, min_workers=min_workers
        )
        if collective.scatters:  # (the spec's even layout keeps every case: M is a multiple of N)
            drawn = drawn.filter(lambda c: _equal_chunks(c, order.layout))
        test = given(drawn)(check)
        ones = one_worker_cases(mode, dtypes, per_rank=per_rank, op=op, collective=collective)
        if collective.scatters:
            every_n = [c for c in every_n if _equal_chunks(c, order.layout)]
        for case in reversed([*(ones if min_workers == 1 else []), *every_n]):
            test = example(case)(test)
    elif mode == "exact" and order.cases is not None:
        # An order saved for one N, M and dtype (difftest --order) covers only those inputs.
        drawn = order.cases.map(lambda c: replace(c, layout="contiguous")) if per_rank else order.cases
        test = given(drawn)(check)
    else:
        any_m = order.layout != "even"
        drawn = cases(mode, dtypes, max_workers, layouts, op=op, any_m=any_m, min_workers=min_workers)
        test = given(drawn)(check)
        first = one_worker_cases(mode, dtypes, per_rank=per_rank, op=op) if min_workers == 1 else []
        if any_m:
            first += uneven_cases(
                mode, dtypes, max_workers, per_rank=per_rank, op=op, min_workers=min_workers
            )
        for case in reversed([*first, *every_n]):
            test = example(case)(test)
    test = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )(test)
    return hypothesis_seed(seed)(test)


def _equal_chunks(case: Case, layout: Layout) -> bool:
    """Whether ``layout`` cuts each worker's elements of ``case`` into ``N`` equal chunks (the shards)."""
    s = len(case.values) // case.n
    return chunk_bounds(layout, case.n, s, itemsize=case.dtype.itemsize) == chunk_rows(s, case.n)


ZERO_OUT_BUDGET: Final = 64
"""At most this many values of a shrunk counterexample are tried at zero."""


def zero_out(case: Case, fails: Callable[[Case], bool]) -> Case:
    """The last shrinking step: set each non-zero value to zero, in order, wherever the case still fails.

    Hypothesis shrinks the shape and the drawn elements; the pseudo-random fill
    it can only drop as a whole, so a value bug may end as a few random-looking
    numbers.  Deterministic, so the seed still replays the final counterexample.

    >>> start = Case(2, 2, (), torch.float32, "contiguous", (1.5, 2.0, -3.0, 4.0))
    >>> zero_out(start, lambda c: c.values[2] != 0).values
    (0.0, 0.0, -3.0, 0.0)
    """
    values = list(case.values)
    for i in [i for i, v in enumerate(values) if v != 0][:ZERO_OUT_BUDGET]:
        trial = [*values[:i], 0.0, *values[i + 1 :]]
        if fails(replace(case, values=tuple(trial))):
            values = trial
    return replace(case, values=tuple(values))


def _first_failed(group: BaseExceptionGroup[BaseException]) -> _Failed | None:
    for exc in group.exceptions:
        if isinstance(exc, _Failed):
            return exc
        if isinstance(exc, BaseExceptionGroup):
            inner = _first_failed(exc)
            if inner is not None:
                return inner
    return None
