"""The search: Hypothesis generates cases per mode, shrinks a failure, and :func:`difftest` runs it all."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Final

import torch
from hypothesis import HealthCheck, Verbosity, example, given, settings
from hypothesis import seed as hypothesis_seed

from ring_ref._dtypes import TORCH_DTYPES, dtype_name
from ring_ref.difftest._call import call_target, well_formed
from ring_ref.difftest._diagnosis import Finding, diagnose, structural
from ring_ref.difftest._inputs import Case, cases, one_worker_cases
from ring_ref.difftest._oracles import check_values
from ring_ref.difftest._report import ModeResult, Report
from ring_ref.difftest._targets import importable_name
from ring_ref.difftest._vocabulary import DTYPES, MODES, Mode, Target

__all__ = ["difftest", "option_problem", "run_mode", "zero_out"]


class _Failed(Exception):
    """Raised inside the Hypothesis test so that it shrinks the failing case."""

    def __init__(self, case: Case) -> None:
        super().__init__(case)
        self.case = case


def run_mode(
    fn: Target,
    mode: Mode,
    *,
    examples: int,
    seed: int,
    max_workers: int,
    dtypes: Sequence[torch.dtype],
) -> ModeResult:
    """Run one oracle on ``examples`` generated inputs (plus the ``N = 1`` ones); shrink a failure."""
    calls = 0
    overflow = 0

    def check(case: Case) -> None:
        nonlocal calls, overflow
        calls += 1
        outcome = call_target(fn, case)
        result = well_formed(outcome)
        if result is None or structural(outcome):
            raise _Failed(case)
        mismatch, skipped = check_values(mode, case, result)
        overflow += skipped
        if mismatch is not None:
            raise _Failed(case)

    test = given(cases(mode, dtypes, max_workers))(check)
    for case in reversed(one_worker_cases(mode, dtypes)):
        test = example(case)(test)
    test = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        verbosity=Verbosity.quiet,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )(test)
    test = hypothesis_seed(seed)(test)
    try:
        test()
    except _Failed as failed:
        case = failed.case
    except BaseExceptionGroup as group:
        found = _first_failed(group)
        if found is None:
            raise
        case = found.case
    else:
        return ModeResult(mode, "pass", calls, overflow)

    def fails(candidate: Case) -> bool:
        try:
            check(candidate)
        except _Failed:
            return True
        return False

    case = zero_out(case, fails)
    finding = diagnose(fn, call_target(fn, case), mode)
    if finding is None:
        finding = Finding(["out-of-bound"], "the target failed during the search but not on replay (flaky?)")
    return ModeResult(mode, "fail", calls, overflow, finding, case)


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


def difftest(
    fn: Target,
    *,
    modes: Iterable[Mode] = MODES,
    examples: int = 100,
    seed: int | None = None,
    max_workers: int = 16,
    dtypes: Sequence[torch.dtype] = tuple(DTYPES.values()),
    target: str | None = None,
) -> Report:
    """Check ``fn`` against the reference in each of ``modes``; return the :class:`Report`.

    ``seed`` fixes Hypothesis' search (a random one is chosen and reported when
    ``None``); rerunning with the same seed and options replays the search.
    """
    modes = tuple(modes)
    problem = option_problem(examples=examples, seed=seed, max_workers=max_workers)
    if problem:
        raise ValueError(problem)
    if not dtypes or any(d not in TORCH_DTYPES for d in dtypes):
        raise ValueError(f"dtypes must be a non-empty subset of {list(DTYPES)}; got {list(dtypes)}")
    if not modes or any(m not in MODES for m in modes):
        raise ValueError(f"modes must be a non-empty subset of {list(MODES)}; got {list(modes)}")
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    name = target or importable_name(fn)
    mode_arg = modes[0] if len(modes) == 1 else "all"
    if name is not None:
        replay = (
            f"ring-ref difftest {name} --mode {mode_arg} --examples {examples} --seed {seed} "
            f"--max-workers {max_workers} --dtypes {' '.join(dtype_name(d) for d in dtypes)}"
        )
    else:
        name = str(getattr(fn, "__qualname__", repr(fn)))
        replay = (
            f"ring_ref.difftest.difftest({name}, modes={modes!r}, examples={examples}, seed={seed}, "
            f"max_workers={max_workers}, dtypes=[{', '.join(f'torch.{dtype_name(d)}' for d in dtypes)}])"
        )
    report = Report(name, seed, replay)
    for mode in modes:
        report.modes[mode] = run_mode(
            fn, mode, examples=examples, seed=seed, max_workers=max_workers, dtypes=dtypes
        )
    return report


def option_problem(*, examples: int, seed: int | None, max_workers: int) -> str:
    """Why these :func:`difftest` options are invalid, or ``""``.

    >>> option_problem(examples=0, seed=None, max_workers=4)
    'examples (--examples) must be at least 1; got 0'
    >>> option_problem(examples=5, seed=1.5, max_workers=4)  # type: ignore[arg-type]
    'seed (--seed) must be a non-negative integer; got 1.5'
    """
    for name, value in (("examples", examples), ("seed", seed), ("max_workers", max_workers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            flag = name.replace("_", "-")
            kind = "a non-negative integer" if name == "seed" else "an integer"
            return f"{name} (--{flag}) must be {kind}; got {value!r}"
    if examples < 1:
        return f"examples (--examples) must be at least 1; got {examples}"
    if seed is not None and seed < 0:
        return f"seed (--seed) must be a non-negative integer; got {seed}"
    if not 1 <= max_workers <= 64:
        return f"max_workers (--max-workers) must be between 1 and 64; got {max_workers}"
    return ""
