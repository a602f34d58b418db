"""The search: Hypothesis generates cases per mode, shrinks a failure, and :func:`difftest` runs it all."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Final

import torch
from hypothesis import HealthCheck, Verbosity, example, given, settings
from hypothesis import seed as hypothesis_seed

from ring_ref._chunks import chunk_bounds, chunk_rows
from ring_ref._dtypes import TORCH_DTYPES, dtype_name
from ring_ref._ops import op_name
from ring_ref.difftest._call import Outcome, well_formed
from ring_ref.difftest._diagnosis import Finding, as_launcher, diagnose, difference, passes, plus_zeros_only
from ring_ref.difftest._inputs import LAYOUTS, Case, cases, one_worker_cases, uneven_cases
from ring_ref.difftest._job import job_size, run_in_job, run_in_mpi_job
from ring_ref.difftest._launch import InProcess, Isolated, Launcher
from ring_ref.difftest._loading import importable_name, load_target, with_framework
from ring_ref.difftest._mpi import MPI_DTYPES, MpiRanks
from ring_ref.difftest._oracles import EXACT_ORDER, SPEC_ORDER, ExactOrder, SavedOrder
from ring_ref.difftest._orders import checking_against, exact_order, reduce_scatter_order
from ring_ref.difftest._probes import ProbeRun, first_failing_probe
from ring_ref.difftest._ranks import GlooRanks, JaxRanks
from ring_ref.difftest._report import ModeResult, Report
from ring_ref.difftest._vocabulary import (
    COLLECTIVES,
    DEFAULT_TIMEOUT_S,
    DTYPES,
    FRAMEWORKS,
    MAX_RANKS,
    MODES,
    MPI_MAX_RANKS,
    RANKS,
    Collective,
    Framework,
    Mode,
    Op,
    OpTarget,
    Ranks,
    Target,
)
from ring_ref.schedule import Layout, Schedule

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
    collective: Collective = "all-reduce",
) -> ModeResult:
    """Run one oracle on ``examples`` generated inputs (plus the ``N = 1`` ones); shrink a failure.

    ``op``: the op asked for (every case carries it; ``None``, none given: a sum);
    ``collective``: what the target computes (every case carries it).
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
        min_workers=launcher.min_workers,
        examples=examples,
        seed=seed,
        max_workers=max_workers,
        dtypes=dtypes,
        op=op,
        collective=collective,
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
            EXACT_ORDER.get(),
            max_workers,
            dtypes,
            lambda c: fails(c, judge),
            collective=collective,
            min_workers=launcher.min_workers,
        )

    probes = None
    order_probed = mode == "exact" and op in (None, "sum") and collective != "all-gather"
    try:
        case = _searched(test, fails)
        if case is None and order_probed:
            case, probes = probed()
        if case is None:
            return ModeResult(mode, "pass", calls, overflow, underflow_skipped=underflow, probes=probes)
        first, second = replayed(case)
        if order_probed and probes is None and _zero_signs_only(first):
            # a fold from +0.0 fails first on zeros, the simplest inputs: an order beats it (signed-zero)
            probe, probes = probed()
            if probe is not None:
                case = probe
                first, second = replayed(case)
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


def _zero_signs_only(outcome: Outcome) -> bool:
    """Whether a stacked answer differs from the ring's only by ``+0.0`` for ``-0.0``."""
    result = well_formed(outcome)
    return result is not None and plus_zeros_only(outcome.case, result)


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
    collective: Collective = "all-reduce",
    min_workers: int = 1,
) -> Callable[[], None]:
    """The Hypothesis test that runs ``check`` on the mode's cases (the ``N = 1`` ones first, where
    ``min_workers`` is 1).

    A reduce-scatter's cases have ``M`` a multiple of ``N`` that the order's layout cuts into equal
    chunks (the shards); an all-gather's are shards of any bits (:func:`ring_ref.difftest._inputs.cases`).
    """
    layouts = ("contiguous",) if per_rank else LAYOUTS
    order = EXACT_ORDER.get()
    if collective != "all-reduce":
        drawn = cases(
            mode, dtypes, max_workers, layouts, op=op, collective=collective, min_workers=min_workers
        )
        if collective == "reduce-scatter" and order.layout != "even":
            drawn = drawn.filter(lambda c: _equal_chunks(c, order.layout))
        test = given(drawn)(check)
        ones = one_worker_cases(mode, dtypes, per_rank=per_rank, op=op, collective=collective)
        for case in reversed(ones if min_workers == 1 else []):
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
    collective: Collective = "all-reduce",
    group: object = None,
    device: str = "cpu",
    framework: Framework = "torch",
    subgroups: bool = False,
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

    ``ranks="job"`` (clause ``difftest-job``): called on every rank of a job
    whose ``torch.distributed`` process group is initialised already (the
    default group, or ``group``), ``fn(tensor)`` on every rank as under
    ``"gloo"``, ``N`` the group's size, tensors on ``device`` (``"cuda"``:
    ``cuda:LOCAL_RANK``'s current device).  Rank 0 runs the search; every rank
    returns the same report (or raises the same exception).  After a call that
    left ranks inside the target (``timed-out``, ``crashed``, ``raised`` with
    ranks stopped) rank 0 prints the report and every rank's process exits 1.
    ``subgroups=True`` (``--subgroups``, with ``"job"`` or ``"mpi-job"``): every
    ``N`` from 1 to the world size is drawn, a smaller one on the subgroup of
    ranks ``0 .. N-1`` (``new_group``; ``Split`` under MPI), ``fn(tensor,
    group=G)`` (``fn(comm_N, array)``); ``fn`` must take ``group=``.  The
    report's ``tested_n`` says which ``N`` were called.

    ``framework="jax"`` (clause ``jax-difftest``): a stacked ``fn`` takes the
    case as a ``jax.Array`` and returns a ``jax.Array`` (the extra ``ring-ref[jax]``;
    :mod:`ring_ref.difftest._jax`); everything else is as for a torch target.

    ``ranks="jax"`` (clause ``jax-ranks``): ``fn(x)`` in every process of a
    ``jax.distributed`` group of ``N`` over gloo on ``127.0.0.1``, ``x`` that
    process's ``(M, ...)`` input as a ``jax.Array`` on its one CPU device,
    checked as under ``"gloo"`` (:class:`~ring_ref.difftest._ranks.JaxRanks`;
    this process must not have imported jax).

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

    ``collective`` (``--collective``, clause ``difftest-collectives``): what
    the target computes.  ``"all-reduce"`` (the default) as above;
    ``"reduce-scatter"``: a stacked target maps ``(N, M, ...)`` to
    ``(N, M/N, ...)``, row ``r`` rank ``r``'s shard (chunk ``r`` of the
    reduction), a rank is called ``fn(output, input)`` (``mpi``: ``fn(comm,
    sendbuf, recvbuf)``), and ``exact`` checks the ring that finishes chunk
    ``r`` at rank ``r`` (a preset's direction and layout with offset =
    direction; a ring given must have them equal); ``order-free`` and
    ``bound`` are all-reduce's, on the shards in rank order;
    ``"all-gather"``: ``(N, S, ...)`` to ``(N*S, ...)``, rank ``r``'s shard in
    slot ``r``, every bit copied (NaN payloads, signed zeros, subnormals), the
    one oracle of every mode.

    Raises :class:`~ring_ref.difftest.TargetError` when the target cannot be loaded,
    ``ValueError`` for invalid options (:class:`OrderError`, a ``ValueError``,
    for an unusable schedule or order file, and when ``schedule="auto"`` finds no ring).
    """
    reduce_op: Op | None = None if op is None else op_name(op)
    chosen = _modes_of(modes)
    refused = _refused(
        collective, ranks, framework, mca, reduce_op, auto=schedule == "auto" or order is not None
    ) or _subgroups_refused(subgroups, ranks)
    if refused:
        raise ValueError(refused)
    workers = max_workers if max_workers is not None else default_max_workers(ranks)
    workers = job_size(ranks, group, max_workers) if ranks in ("job", "mpi-job") else workers
    problem = option_problem(examples=examples, seed=seed, max_workers=workers, timeout=timeout)
    if problem:
        raise ValueError(problem)
    asked_dtypes = dtypes
    dtypes = _dtypes_for(ranks, dtypes)
    exact = _collective_order(collective, schedule, order, workers, reduce_op) or (
        exact_order(schedule, order, fn, workers, ranks, framework=framework) or EXACT_ORDER.get()
    )
    if order is not None and exact.saved is not None:  # order= given (not one set by checking_against)
        _check_order_file_fits(order, exact.saved, max_workers, asked_dtypes)
    if reduce_op is not None and "exact" in chosen and reduce_op not in exact.ops:
        raise ValueError(
            f"exact checks {exact.name} for {', '.join(exact.ops)} only; op {reduce_op!r} is checked "
            "against the spec's ring (drop --schedule / --order, or run --mode order-free or bound)"
        )
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
    launcher, name = (
        _job_target(fn, ranks, workers, exact, schedule, isolate, device)
        if ranks in ("job", "mpi-job")
        else _launcher(fn, isolate, timeout, ranks, mca, framework=framework)
    )
    isolated = launcher is None or launcher.isolated
    options = "" if framework == "torch" else f" --framework {framework}"
    options += "" if timeout == DEFAULT_TIMEOUT_S else f" --timeout {timeout:g}"
    options += "" if isolated else " --in-process"
    options += f" --device {device}" if device != "cpu" else ""
    options += " --subgroups" if subgroups else ""
    options += "".join(f" --mca {key}={value}" for key, value in (mca or {}).items())
    options += f" {exact.option}" if exact.option else ""
    options += f" --collective {collective}" if collective != "all-reduce" else ""
    if name is None:
        name = str(getattr(fn, "__qualname__", repr(fn)))
        asked = exact.option or (f"--collective {collective}" if collective != "all-reduce" else "")
        replay = _replay(
            None, name, chosen, examples, seed, workers, dtypes, asked, reduce_op, framework=framework
        )
    else:
        replay = _replay(ranks, name, chosen, examples, seed, workers, dtypes, options, reduce_op, cli=True)
    report = Report(target or name, seed, replay, isolated=isolated, ranks=ranks, op=reduce_op)
    report.collective = collective
    report.timeout_s = timeout if isolated else None
    report.exact_against = exact if "exact" in chosen else None
    run = functools.partial(
        _run, report, chosen, exact, examples=examples, seed=seed, workers=workers, dtypes=dtypes
    )
    run = functools.partial(run, op=reduce_op)
    if launcher is None and ranks == "mpi-job":
        return run_in_mpi_job(name, run, timeout_s=timeout, subgroups=subgroups)
    if launcher is None:
        return run_in_job(fn, run, group=group, device=device, timeout_s=timeout, subgroups=subgroups)
    return run(launcher)


def _refused(
    collective: str, ranks: str | None, framework: str, mca: object, reduce_op: Op | None, *, auto: bool
) -> str | None:
    """What is wrong with ``difftest``'s choice of collective, ranks, framework, ``mca`` and op (``auto``:
    ``--schedule auto`` or ``--order`` given), or ``None``."""
    if collective not in COLLECTIVES:
        return f"collective (--collective) must be one of {list(COLLECTIVES)}; got {collective!r}"
    if ranks is not None and ranks not in RANKS:
        return f"ranks must be one of {list(RANKS)} or None; got {ranks!r}"
    if framework not in FRAMEWORKS or (framework != "torch" and ranks not in (None, "jax")):
        return (
            f"framework (--framework) must be one of {list(FRAMEWORKS)}, and jax is for stacked targets "
            f"or ranks='jax' (--ranks jax); got framework={framework!r}, ranks={ranks!r}"
        )
    if mca and ranks != "mpi":
        return f"mca (--mca) options are for ranks='mpi' (mpirun) only; got ranks={ranks!r}"
    if reduce_op not in (None, "sum") and auto:
        return (
            f"--op {reduce_op} checks exact against the spec's ring or a named --schedule; --schedule auto "
            "and --order reveal and name sum orders (drop them; order-free and bound need no order)"
        )
    return None


def _subgroups_refused(subgroups: object, ranks: str | None) -> str | None:
    """Why ``subgroups`` cannot be used with ``ranks``, or ``None``.

    >>> _subgroups_refused(True, "gloo")[:40]
    'subgroups (--subgroups) tests every smal'
    """
    if not isinstance(subgroups, bool):
        return f"subgroups (--subgroups) must be True or False; got {subgroups!r}"
    if subgroups and ranks not in ("job", "mpi-job"):
        return (
            "subgroups (--subgroups) tests every smaller N inside a job, through subgroups of its ranks: it "
            f"needs ranks='job' or 'mpi-job' (--ranks job / mpi-job); got ranks={ranks!r} (--ranks gloo and "
            "mpi draw every N up to --max-workers already)"
        )
    return None


def _run(
    report: Report,
    chosen: tuple[Mode, ...],
    exact: ExactOrder,
    launcher: Launcher,
    *,
    examples: int,
    seed: int,
    workers: int,
    dtypes: Sequence[torch.dtype],
    op: Op | None,
) -> Report:
    """Fill ``report`` with every mode in ``chosen`` run through ``launcher`` (until it breaks)."""
    try:
        launcher.start()
        with checking_against(exact):
            for mode in chosen:
                if launcher.broken:
                    break
                report.modes[mode] = run_mode(
                    launcher,
                    mode,
                    examples=examples,
                    seed=seed,
                    max_workers=workers,
                    dtypes=dtypes,
                    op=op,
                    collective=report.collective,
                )
    finally:
        launcher.close()
    report.output_bytes, report.output = launcher.output.bytes, launcher.output.text
    return report


def _collective_order(
    collective: Collective,
    schedule: str | Schedule | None,
    order: str | Path | None,
    workers: int,
    op: Op | None,
) -> ExactOrder | None:
    """What ``exact`` checks for a reduce-scatter or an all-gather (``None``: an all-reduce, as usual).

    ``--schedule auto`` and ``--order`` reveal and name all-reduce orders, so they are refused here.
    """
    if collective == "all-reduce":
        return None
    if schedule == "auto" or order is not None:
        raise ValueError(
            f"--collective {collective} checks exact against a named --schedule (or the spec's); --schedule "
            "auto and --order reveal and name all-reduce orders (drop them; ring-ref reveal --collective "
            "reduce-scatter names a reduce-scatter's order)"
        )
    if collective == "all-gather":
        if op is not None:
            raise ValueError(
                "an all-gather copies, it reduces nothing: drop op (--op) for --collective all-gather"
            )
        return replace(SPEC_ORDER, name="a bitwise copy of every shard (all-gather)", source="spec")
    return reduce_scatter_order(schedule, workers)


def _job_target(  # noqa: PLR0917 - difftest's settings, checked
    fn: Target | OpTarget | str,
    ranks: str,
    size: int,
    exact: ExactOrder,
    schedule: object,
    isolate: bool | None,
    device: str,
) -> tuple[None, str | None]:
    """No launcher yet (rank 0 makes it inside the job) and ``fn``'s name; ``ValueError`` for what
    ``ranks="job"`` cannot do with these options."""
    if schedule == "auto":
        raise ValueError(
            "--schedule auto reveals the target's order first; in a job, run `ring-ref reveal --ranks job "
            "... --json > order.json` and then `difftest --ranks job --order order.json`"
        )
    if isolate is False:
        raise ValueError("isolate=False (--in-process) does not apply to ranks='job': the job's ranks run it")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device (--device) must be 'cpu' or 'cuda'; got {device!r}")
    if exact.saved is not None and exact.saved.n != size:
        raise ValueError(
            f"order (--order) holds an order for N = {exact.saved.n}, but this job has {size} ranks: "
            "reveal it in a job of the same size"
        )
    name = fn if isinstance(fn, str) else importable_name(fn)
    if name is None and not isinstance(fn, str) and ranks == "mpi-job":
        raise ValueError(
            f"--ranks mpi-job loads the target by name on every rank: {getattr(fn, '__qualname__', fn)!r} "
            "must be a module-level function or a TARGET string"
        )
    return None, name


def default_max_workers(ranks: Ranks | None) -> int:
    """The largest ``N`` when none is given: 16 stacked, 8 on gloo ranks, 4 in MPI jobs and jax groups
    (slower to start: every process imports jax).

    >>> [default_max_workers(r) for r in (None, "gloo", "mpi", "jax")]
    [16, 8, 4, 4]
    """
    return MPI_MAX_RANKS if ranks in ("mpi", "jax") else MAX_RANKS if ranks else 16


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
    allowed = MPI_DTYPES if ranks in ("mpi", "mpi-job") else tuple(DTYPES.values())
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
    framework: Framework = "torch",
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
    asked += f", framework={framework!r}" if framework != "torch" else ""
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
    *,
    framework: Framework = "torch",
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
        return (JaxRanks if ranks == "jax" else GlooRanks)(name, timeout), name
    if name is None and isolate:
        raise ValueError(
            f"{getattr(fn, '__qualname__', fn)!r} cannot be isolated: the worker imports the target by "
            "name, and a lambda or local function has none; define it at module level, or pass "
            "isolate=False to run it in this process"
        )
    if name is not None and isolate is not False:
        return Isolated(name, timeout, framework), name
    here = load_target(fn, framework) if isinstance(fn, str) else with_framework(fn, framework)
    return InProcess(here), name


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
