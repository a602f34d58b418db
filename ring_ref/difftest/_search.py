"""The search: Hypothesis generates cases per mode, shrinks a failure, and :func:`difftest` runs it all."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

import torch
from hypothesis import HealthCheck, Verbosity, example, given, settings
from hypothesis import seed as hypothesis_seed

from ring_ref._dtypes import TORCH_DTYPES, dtype_name
from ring_ref._ops import op_name
from ring_ref.difftest._call import Outcome
from ring_ref.difftest._diagnosis import Finding, as_launcher, diagnose, difference, passes
from ring_ref.difftest._inputs import LAYOUTS, Case, cases, one_worker_cases, uneven_cases
from ring_ref.difftest._launch import InProcess, Isolated, Launcher
from ring_ref.difftest._loading import importable_name, load_target
from ring_ref.difftest._mpi import MPI_DTYPES, MpiRanks
from ring_ref.difftest._oracles import EXACT_ORDER, SavedOrder
from ring_ref.difftest._orders import checking_against, exact_order
from ring_ref.difftest._probes import first_failing_probe
from ring_ref.difftest._ranks import GlooRanks
from ring_ref.difftest._report import ModeResult, Report
from ring_ref.difftest._vocabulary import (
    DEFAULT_TIMEOUT_S,
    DTYPES,
    MAX_RANKS,
    MODES,
    MPI_MAX_RANKS,
    RANKS,
    Mode,
    Op,
    OpTarget,
    Ranks,
    Target,
)
from ring_ref.schedule import Schedule

__all__ = ["default_max_workers", "difftest", "option_problem", "run_mode", "zero_out"]


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
) -> ModeResult:
    """Run one oracle on ``examples`` generated inputs (plus the ``N = 1`` ones); shrink a failure.

    ``op``: the op asked for (every case carries it; ``None``, none given: a sum).
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
    overflow = underflow = 0

    def check(case: Case) -> None:
        nonlocal calls
        calls += 1
        judge(case)

    def judge(case: Case) -> None:
        nonlocal overflow, underflow
        outcome = launcher.call(case)
        if outcome.failure is not None or outcome.note:
            raise _NoAnswer(outcome)
        ok, over, under = passes(outcome, mode)
        overflow += over
        underflow += under
        if not ok:
            raise _Failed(case)

    test = _search_test(
        check,
        mode,
        per_rank=launcher.per_rank,
        examples=examples,
        seed=seed,
        max_workers=max_workers,
        dtypes=dtypes,
        op=op,
    )

    def fails(candidate: Case, run: Callable[[Case], None] = check) -> bool:
        try:
            run(candidate)
        except _Failed:
            return True
        return False

    probes = None
    try:
        case = _searched(test, fails)
        if case is None and mode == "exact" and op in (None, "sum"):
            order = EXACT_ORDER.get()
            case, probes = first_failing_probe(order, max_workers, dtypes, lambda c: fails(c, judge))
        if case is None:
            return ModeResult(mode, "pass", calls, overflow, underflow_skipped=underflow, probes=probes)
        first, second = launcher.call(case), launcher.call(case)
        for outcome in (first, second):
            if outcome.failure is not None:
                raise _NoAnswer(outcome)
    except _NoAnswer as stopped:
        got = stopped.outcome
        finding = diagnose(launcher, got, mode)
        return ModeResult(mode, "fail", calls, overflow, finding, got.case, got.output, underflow, probes)
    changed = difference(first, second)
    finding = (
        Finding(["nondeterministic"], f"The same input, called twice, gave different answers: {changed}")
        if changed
        else diagnose(launcher, first, mode)
    )
    if finding is None:
        finding = Finding(
            ["nondeterministic"],
            "This input failed during the search but passed both times it was replayed: the target's "
            "answer depends on more than its input (earlier calls, time, randomness)",
        )
    return ModeResult(mode, "fail", calls, overflow, finding, case, first.output, underflow, probes)


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
) -> Callable[[], None]:
    """The Hypothesis test that runs ``check`` on the mode's cases (the ``N = 1`` ones first)."""
    layouts = ("contiguous",) if per_rank else LAYOUTS
    order = EXACT_ORDER.get()
    if mode == "exact" and order.cases is not None:
        # An order saved for one N, M and dtype (difftest --order) covers only those inputs.
        drawn = order.cases.map(lambda c: replace(c, layout="contiguous")) if per_rank else order.cases
        test = given(drawn)(check)
    else:
        any_m = order.layout != "even"
        test = given(cases(mode, dtypes, max_workers, layouts, op=op, any_m=any_m))(check)
        first = one_worker_cases(mode, dtypes, per_rank=per_rank, op=op)
        if any_m:
            first += uneven_cases(mode, dtypes, max_workers, per_rank=per_rank, op=op)
        for case in reversed(first):
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
    fn: Target | OpTarget | str,
    *,
    modes: str | Iterable[str] = MODES,
    examples: int = 100,
    seed: int | None = None,
    max_workers: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    target: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    isolate: bool | None = None,
    ranks: Ranks | None = None,
    mca: Mapping[str, str] | None = None,
    op: object = None,
    schedule: str | Schedule | None = None,
    order: str | Path | None = None,
) -> Report:
    """Check ``fn`` against the reference in each of ``modes``; return the :class:`Report`.

    ``modes``: a mode (``"exact"``, ``"order-free"``, ``"bound"``), ``"all"``,
    or a list of them (the command line's repeated ``--mode``).

    ``fn`` is a function or a ``TARGET`` string (``package.module:function`` or
    ``path/to/file.py:function``).  ``seed`` fixes Hypothesis' search (a random
    one is chosen and reported when ``None``); rerunning with the same seed
    and options replays the search.  ``max_workers`` is the largest ``N``
    (default 16, 8 with ``ranks="gloo"``, 4 with ``ranks="mpi"``: :func:`default_max_workers`).

    Isolation: a target that can be imported by name (a string, or a
    module-level function) runs in a worker process, and each call gets at most
    ``timeout`` seconds; a lambda or local function runs in this process
    (``report.isolated`` is false).  ``isolate=False`` forces the latter;
    ``isolate=True`` refuses a function that cannot be isolated.

    ``ranks="gloo"``: ``fn`` is a per-rank target, ``fn(tensor)``, called on
    every rank of a gloo group of ``N`` processes on ``127.0.0.1`` with that
    rank's ``(M, ...)`` tensor; it must be importable by name.  Every rank's
    result is checked, and the ranks against each other.

    ``ranks="mpi"``: ``fn(comm, array)`` on every rank of an ``mpirun`` job of
    ``N`` ranks, ``comm`` an ``mpi4py`` communicator of the ``N`` ranks and
    ``array`` that rank's own ``numpy`` input; ``mca`` adds ``--mca KEY VALUE``
    options to ``mpirun`` (e.g. ``{"coll_tuned_use_dynamic_rules": "1",
    "coll_tuned_allreduce_algorithm": "4"}``).  ``numpy`` has no bfloat16, so
    the dtypes are float16, float32 and float64 (the default drops bfloat16;
    asking for it is refused).

    ``dtypes`` defaults to every dtype the launcher takes.

    ``op`` (``"sum"``, ``"prod"``, ``"max"``, ``"min"``, ``"avg"``, or a
    ``torch.distributed.ReduceOp``; clause ``difftest-ops``): the target is
    called with ``op=`` as well (the name; a gloo rank gets the ``ReduceOp``)
    and checked with that op's oracles.  ``None`` (the default): the target is
    called without ``op=`` and must sum.  ``exact`` against another order
    (``--schedule``, ``--order``) checks ``sum`` only.

    What ``exact`` checks against (clause ``difftest-exact-orders``; the
    report's ``exact_against``): the spec's ring by default; ``schedule=``
    another ring of the family (a preset name, a :class:`RingSchedule`, its
    text ``"DIRECTION,OFFSET,LAYOUT"``, or ``"auto"``: reveal the target's
    order first and check against the ring that fits it); ``order=`` the trees
    of a saved ``ring-ref reveal --json`` file, on inputs of exactly its ``N``,
    ``M`` and dtype (an explicit ``max_workers`` below that ``N`` or ``dtypes``
    without that dtype is refused; otherwise they apply to the other modes).

    Raises :class:`~ring_ref.difftest.TargetError` when the target cannot be loaded,
    ``ValueError`` for invalid options (:class:`OrderError`, a ``ValueError``,
    for an unusable schedule or order file, and when ``schedule="auto"`` finds no ring).
    """
    reduce_op: Op | None = None if op is None else op_name(op)
    chosen = _modes_of(modes)
    if ranks is not None and ranks not in RANKS:
        raise ValueError(f"ranks must be one of {list(RANKS)} or None; got {ranks!r}")
    workers = max_workers if max_workers is not None else default_max_workers(ranks)
    problem = option_problem(examples=examples, seed=seed, max_workers=workers, timeout=timeout)
    if problem:
        raise ValueError(problem)
    asked_dtypes = dtypes
    dtypes = _dtypes_for(ranks, dtypes)
    if mca and ranks != "mpi":
        raise ValueError(f"mca (--mca) options are for ranks='mpi' (mpirun) only; got ranks={ranks!r}")
    if reduce_op not in (None, "sum") and (schedule == "auto" or order is not None):
        raise ValueError(
            f"--op {reduce_op} checks exact against the spec's ring or a named --schedule; --schedule auto "
            "and --order reveal and name sum orders (drop them; order-free and bound need no order)"
        )
    exact = exact_order(schedule, order, fn, workers, ranks) or EXACT_ORDER.get()
    if order is not None and exact.saved is not None:  # order= given (not one set by checking_against)
        _check_order_file_fits(order, exact.saved, max_workers, asked_dtypes)
    if reduce_op is not None and "exact" in chosen and reduce_op not in exact.ops:
        raise ValueError(
            f"exact checks {exact.name} for {', '.join(exact.ops)} only; op {reduce_op!r} is checked "
            "against the spec's ring (drop --schedule / --order, or run --mode order-free or bound)"
        )
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    launcher, name = _launcher(fn, isolate, timeout, ranks, mca)
    options = "" if timeout == DEFAULT_TIMEOUT_S else f" --timeout {timeout:g}"
    options += "" if launcher.isolated else " --in-process"
    options += "".join(f" --mca {key}={value}" for key, value in (mca or {}).items())
    options += f" {exact.option}" if exact.option else ""
    if name is None:
        name = str(getattr(fn, "__qualname__", repr(fn)))
        replay = _replay(None, name, chosen, examples, seed, workers, dtypes, exact.option, reduce_op)
    else:
        replay = _replay(ranks, name, chosen, examples, seed, workers, dtypes, options, reduce_op, cli=True)
    report = Report(target or name, seed, replay, isolated=launcher.isolated, ranks=ranks, op=reduce_op)
    report.timeout_s = timeout if launcher.isolated else None
    report.exact_against = exact if "exact" in chosen else None
    try:
        launcher.start()
        with checking_against(exact):
            for mode in chosen:
                report.modes[mode] = run_mode(
                    launcher,
                    mode,
                    examples=examples,
                    seed=seed,
                    max_workers=workers,
                    dtypes=dtypes,
                    op=reduce_op,
                )
    finally:
        launcher.close()
    report.output_bytes, report.output = launcher.output.bytes, launcher.output.text
    return report


def default_max_workers(ranks: Ranks | None) -> int:
    """The largest ``N`` when none is given: 16 stacked, 8 on gloo ranks, 4 in MPI jobs (slower to call).

    >>> [default_max_workers(r) for r in (None, "gloo", "mpi")]
    [16, 8, 4]
    """
    return MPI_MAX_RANKS if ranks == "mpi" else MAX_RANKS if ranks else 16


def _modes_of(modes: str | Iterable[str]) -> tuple[Mode, ...]:
    """``modes`` as the modes to run, in the order given: one name, ``"all"``, or a list of them.

    >>> _modes_of("bound"), _modes_of(["bound", "exact", "bound"]), _modes_of(["all"]) == MODES
    (('bound',), ('bound', 'exact'), True)
    """
    asked = [modes] if isinstance(modes, str) else list(modes)
    if not asked or any(m not in (*MODES, "all") for m in asked):
        raise ValueError(
            f"each mode must be one of {[*MODES, 'all']}; modes (mode=, --mode) takes one or a "
            f"non-empty list of them; got {asked}"
        )
    return MODES if "all" in asked else tuple(m for m in dict.fromkeys(asked) if m in MODES)


def _check_order_file_fits(
    path: object, saved: SavedOrder, max_workers: int | None, dtypes: Sequence[torch.dtype] | None
) -> None:
    """Refuse an explicit ``max_workers`` or ``dtypes`` that the saved order's inputs would break.

    ``exact`` draws its inputs at the file's own ``N``, ``M`` and dtype; the
    other modes use ``max_workers`` and ``dtypes`` as usual.
    """
    n, m, dtype = saved.n, saved.m, dtype_name(saved.dtype)
    clash = []
    if max_workers is not None and max_workers < n:
        clash.append(f"max_workers (--max-workers) {max_workers} is below its N")
    if dtypes is not None and saved.dtype not in dtypes:
        clash.append(f"dtypes (--dtypes) {[dtype_name(d) for d in dtypes]} leave out its dtype")
    if clash:
        raise ValueError(
            f"order (--order) {str(path)!r} holds an order for N = {n}, M = {m}, {dtype}, the only inputs "
            f"exact draws with it, but {' and '.join(clash)}: drop the option or change it (it applies "
            "to the other modes)"
        )


def _dtypes_for(ranks: Ranks | None, dtypes: Sequence[torch.dtype] | None) -> Sequence[torch.dtype]:
    """The dtypes to generate: ``dtypes``, checked, or every one the launcher takes."""
    allowed = MPI_DTYPES if ranks == "mpi" else tuple(DTYPES.values())
    if dtypes is None:
        return allowed
    if not dtypes or any(d not in TORCH_DTYPES for d in dtypes):
        raise ValueError(f"dtypes must be a non-empty subset of {list(DTYPES)}; got {list(dtypes)}")
    if any(d not in allowed for d in dtypes):
        raise ValueError(
            f"--ranks mpi hands each rank a numpy array, and numpy has no bfloat16: choose dtypes from "
            f"{[dtype_name(d) for d in allowed]}; got {[dtype_name(d) for d in dtypes]}"
        )
    return dtypes


def _replay(  # noqa: PLR0917 - one line made of every option
    ranks: Ranks | None,
    name: str,
    modes: tuple[Mode, ...],
    examples: int,
    seed: int,
    workers: int,
    dtypes: Sequence[torch.dtype],
    options: str,
    op: Op | None,
    *,
    cli: bool = False,
) -> str:
    """The command line (``cli``) or Python call that replays this run.

    ``options``: the command line's extra options, or for the Python call the
    one that names the order ``exact`` checked (``--schedule X``, ``--order F``).
    """
    if cli:
        where = f"--ranks {ranks} " if ranks else ""
        asked = f" --op {op}" if op is not None else ""
        # every mode is the default, so that a --mode appended to the line picks modes of its own
        mode_args = "" if set(modes) == set(MODES) else "".join(f" --mode {m}" for m in modes)
        return (
            f"ring-ref difftest {where}{name}{asked}{mode_args} --examples {examples} --seed {seed} "
            f"--max-workers {workers} --dtypes {' '.join(dtype_name(d) for d in dtypes)}{options}"
        )
    asked = f", op={op!r}" if op is not None else ""
    if options:
        key, _, value = options.lstrip("-").replace("=", " ", 1).partition(" ")
        asked += f", {key}={value!r}"
    return (
        f"ring_ref.difftest.difftest({name}, modes={modes!r}, examples={examples}, seed={seed}, "
        f"max_workers={workers}, dtypes=[{', '.join(f'torch.{dtype_name(d)}' for d in dtypes)}]{asked})"
    )


def _launcher(
    fn: Target | OpTarget | str,
    isolate: bool | None,
    timeout: float,
    ranks: Ranks | None,
    mca: Mapping[str, str] | None = None,
) -> tuple[Launcher, str | None]:
    """The launcher for ``fn`` and its importable name (``None`` for a lambda or local function)."""
    name = fn if isinstance(fn, str) else importable_name(fn)
    if ranks is not None:
        if name is None or isolate is False:
            raise ValueError(
                f"a per-rank target runs in the ranks' own processes, which import it by name: "
                f"{getattr(fn, '__qualname__', fn)!r} must be a module-level function or a TARGET string, "
                "and isolate cannot be False"
            )
        if ranks == "mpi":
            return MpiRanks(name, timeout, mca), name
        return GlooRanks(name, timeout), name
    if isinstance(fn, str):
        return (InProcess(load_target(fn)) if isolate is False else Isolated(fn, timeout)), fn
    if isolate is False:
        return InProcess(fn), name
    if name is None:
        if isolate:
            raise ValueError(
                f"{getattr(fn, '__qualname__', fn)!r} cannot be isolated: the worker imports the target by "
                "name, and a lambda or local function has none; define it at module level, or pass "
                "isolate=False to run it in this process"
            )
        return InProcess(fn), None
    return Isolated(name, timeout), name


def option_problem(
    *, examples: int, seed: int | None, max_workers: int, timeout: float = DEFAULT_TIMEOUT_S
) -> str:
    """Why these :func:`difftest` options are invalid, or ``""``.

    >>> option_problem(examples=0, seed=None, max_workers=4)
    'examples (--examples) must be at least 1; got 0'
    """
    if examples < 1:
        return f"examples (--examples) must be at least 1; got {examples}"
    if seed is not None and seed < 0:
        return f"seed (--seed) must be a non-negative integer; got {seed}"
    if not 1 <= max_workers <= 64:
        return f"max_workers (--max-workers) must be between 1 and 64; got {max_workers}"
    if not (math.isfinite(timeout) and timeout > 0):
        return f"timeout (--timeout) must be a positive number of seconds; got {timeout:g}"
    return ""
