"""A difftest run: its options resolved into a plan (the modes, the order ``exact`` checks against, the
launcher, the line that replays it), each mode searched (:func:`ring_ref.difftest._search.run_mode`), and the
report built once from the modes' results."""

from __future__ import annotations

import functools
import random
import shlex
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ring_ref._dtypes import dtype_name
from ring_ref._hints import signature_problem
from ring_ref._ops import op_name
from ring_ref._processes._job import launch_prefix
from ring_ref.difftest._job import job_size, run_in_job, run_in_mpi_job
from ring_ref.difftest._launch import InProcess, Isolated, Launcher
from ring_ref.difftest._loading import TargetError, importable_name, load_target, with_framework
from ring_ref.difftest._options import (
    Options,
    allowed_dtypes,
    check_order_file_fits,
    default_max_workers,
    modes_of,
    option_problem,
    rank_launcher,
    refused,
)
from ring_ref.difftest._oracles import SPEC_ORDER, ExactOrder
from ring_ref.difftest._orders import exact_order, reduce_scatter_order, spawn_options
from ring_ref.difftest._report import ModeResult, Report, untried
from ring_ref.difftest._rules import IN_JOB, Spawn
from ring_ref.difftest._search import run_mode
from ring_ref.difftest._vocabulary import (
    DEFAULT_TIMEOUT_S,
    MODES,
    Collective,
    CollectiveName,
    Framework,
    Mode,
    Op,
    OpTarget,
    Ranks,
    Target,
)
from ring_ref.schedule import Schedule

__all__ = ["difftest", "run_difftest"]


def difftest(
    fn: Target | OpTarget | str,
    *,
    modes: str | Iterable[str] = MODES,
    examples: int = 100,
    seed: int | None = None,
    max_workers: int | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    label: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    isolate: bool | None = None,
    ranks: Ranks | None = None,
    mca: Mapping[str, str] | None = None,
    op: object = None,
    schedule: str | Schedule | None = None,
    order: str | Path | None = None,
    collective: Collective | CollectiveName = Collective.ALL_REDUCE,
    group: object = None,
    device: str = "cpu",
    framework: Framework = "torch",
    subgroups: bool = False,
    target: str | None = None,
    env: Mapping[str, str] | None = None,
    mpiexec: str | None = None,
) -> Report:
    """Check ``fn`` against the reference in each of ``modes``; return the :class:`Report`.

    ``modes``: a mode (``"exact"``, ``"order-free"``, ``"bound"``), ``"all"``,
    or a list of them (the command line's repeated ``--mode``).  ``label``: the name the report prints
    for the target (default: its ``TARGET`` string or qualified name; ``target=``, its old name, still
    works and warns).

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
    options to OpenMPI's ``mpirun`` (e.g. ``{"coll_tuned_use_dynamic_rules": "1",
    "coll_tuned_allreduce_algorithm": "4"}``), ``env`` variables to every rank's
    environment (e.g. ``{"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"}`` under
    MPICH), and ``mpiexec`` is the launcher's path (default: the ``mpiexec`` or
    ``mpirun`` of the MPI ``mpi4py`` uses, beside the interpreter, then on
    ``PATH``; clause ``difftest-mpi-launcher``).  ``numpy`` has no bfloat16, so
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
    if target is not None:
        warnings.warn(
            "difftest(target=) is the name the report prints: pass label= instead (target= is its old name)",
            DeprecationWarning,
            stacklevel=2,
        )
        label = target if label is None else label
    options = Options(
        modes=modes,
        examples=examples,
        seed=seed,
        max_workers=max_workers,
        dtypes=dtypes,
        label=label,
        timeout=timeout,
        isolate=isolate,
        ranks=ranks,
        mca=mca,
        op=op,
        schedule=schedule,
        order=order,
        collective=collective,
        group=group,
        device=device,
        framework=framework,
        subgroups=subgroups,
        env=env,
        mpiexec=mpiexec,
    )
    return run_difftest(fn, options)


@dataclass(frozen=True)
class _Plan:
    """What a run checks, resolved from its :class:`Options`: the modes, the order ``exact`` checks
    against, the inputs drawn, and what the report says of the run before it starts."""

    modes: tuple[Mode, ...]
    exact: ExactOrder
    examples: int
    seed: int
    workers: int
    dtypes: Sequence[torch.dtype]
    op: Op | None
    collective: Collective
    label: str
    replay: str
    isolated: bool
    ranks: Ranks | None
    timeout: float


def run_difftest(fn: Target | OpTarget | str, options: Options, exact: ExactOrder | None = None) -> Report:
    """:func:`difftest` with its options in one value; ``exact``: check ``exact`` against this order
    instead of the one ``options`` name (the spec's ring by default), for the tests.

    Raises as :func:`difftest` does.
    """
    reduce_op: Op | None = None if options.op is None else op_name(options.op)
    chosen = modes_of(options.modes)
    refusal = refused(options)
    if refusal:
        raise ValueError(refusal)
    collective = Collective(options.collective)
    misfit = signature_problem(fn, options.ranks, collective, op=options.op is not None)
    if misfit:
        raise TargetError(misfit)
    ranks, max_workers, timeout = options.ranks, options.max_workers, options.timeout
    workers = max_workers if max_workers is not None else default_max_workers(ranks)
    workers = job_size(ranks, options.group, max_workers) if ranks in IN_JOB else workers
    problem = option_problem(
        examples=options.examples, seed=options.seed, max_workers=workers, timeout=timeout
    )
    if problem:
        raise ValueError(problem)
    dtypes = options.dtypes if options.dtypes is not None else allowed_dtypes(ranks)
    schedule, order = options.schedule, options.order
    if exact is None:
        exact = _collective_order(collective, schedule, order, workers, reduce_op) or (
            exact_order(schedule, order, fn, workers, ranks, framework=options.framework, spawn=options.spawn)
            or SPEC_ORDER
        )
        if exact.saved is not None:  # an order file's
            check_order_file_fits(order, exact.saved, max_workers, options.dtypes)
    if reduce_op is not None and "exact" in chosen and reduce_op not in exact.ops:
        raise ValueError(
            f"exact checks {exact.name} for {', '.join(exact.ops)} only; op {reduce_op!r} is checked "
            "against the spec's ring (drop --schedule / --order, or run --mode order-free or bound)"
        )
    seed = options.seed if options.seed is not None else random.SystemRandom().randrange(2**32)
    launcher, name = (
        _job_target(fn, ranks, workers, exact, device=options.device)
        if ranks in IN_JOB
        else _launcher(fn, options.isolate, timeout, ranks, options.spawn, framework=options.framework)
    )
    isolated = launcher is None or launcher.isolated
    shown, replay = _replay(fn, name, options, chosen, exact, seed, workers, dtypes, reduce_op, isolated)
    plan = _Plan(
        modes=chosen,
        exact=exact,
        examples=options.examples,
        seed=seed,
        workers=workers,
        dtypes=dtypes,
        op=reduce_op,
        collective=collective,
        label=options.label or shown,
        replay=replay,
        isolated=isolated,
        ranks=ranks,
        timeout=timeout,
    )
    run = functools.partial(_run, plan)
    if launcher is None and ranks == "mpi-job":
        return run_in_mpi_job(shown, run, timeout_s=timeout, subgroups=options.subgroups)
    if launcher is None:
        return run_in_job(
            fn,
            run,
            group=options.group,
            device=options.device,
            timeout_s=timeout,
            subgroups=options.subgroups,
        )
    return run(launcher)


def _replay(  # noqa: PLR0917 - one line made of every option
    fn: object,
    name: str | None,
    options: Options,
    modes: tuple[Mode, ...],
    exact: ExactOrder,
    seed: int,
    workers: int,
    dtypes: Sequence[torch.dtype],
    op: Op | None,
    isolated: bool,
) -> tuple[str, str]:
    """The name the report shows for ``fn`` (``name``, or for a function that has none its qualified
    name) and what replays this run: the command line for a ``TARGET`` with a name, else the Python call
    (with the option that names the order ``exact`` checked, ``--schedule X`` or ``--order F``)."""
    framework, collective, timeout = options.framework, Collective(options.collective), options.timeout
    if name is not None:
        where = f"--ranks {options.ranks} " if options.ranks else ""
        asked = f" --op {op}" if op is not None else ""
        # every mode is the default, so that a --mode appended to the line picks modes of its own
        asked += "" if set(modes) == set(MODES) else "".join(f" --mode {m}" for m in modes)
        extra = "" if framework == "torch" else f" --framework {framework}"
        extra += "" if timeout == DEFAULT_TIMEOUT_S else f" --timeout {timeout:g}"
        extra += "" if isolated else " --in-process"
        extra += f" --device {options.device}" if options.device != "cpu" else ""
        extra += " --subgroups" if options.subgroups else ""
        extra += "".join(f" {item}" for item in spawn_options(options.spawn))
        extra += f" {exact.option}" if exact.option else ""
        extra += collective.option
        # inside a job the line starts it again: its launcher and its number of ranks
        in_job = options.ranks in IN_JOB
        launch = launch_prefix(workers, options.ranks == "mpi-job") if in_job else ""
        launch += " " if launch else ""
        return name, (
            f"{launch}ring-ref difftest {where}{name}{asked} --examples {options.examples} --seed {seed} "
            f"--max-workers {workers} --dtypes {' '.join(dtype_name(d) for d in dtypes)}{extra}"
        )
    shown = str(getattr(fn, "__qualname__", repr(fn)))
    asked = f", op={op!r}" if op is not None else ""
    asked += f", framework={framework!r}" if framework != "torch" else ""
    for named in (exact.option, collective.option):  # "--schedule=1,1,even", "--order 'a b.json'", ...
        if named:
            flag, *rest = shlex.split(named)
            key, _, value = flag.lstrip("-").partition("=")
            asked += f", {key}={value or rest[0]!r}"
    return shown, (
        f"ring_ref.difftest.difftest({shown}, modes={modes!r}, examples={options.examples}, seed={seed}, "
        f"max_workers={workers}, dtypes=[{', '.join(f'torch.{dtype_name(d)}' for d in dtypes)}]{asked})"
    )


def _run(plan: _Plan, launcher: Launcher) -> Report:
    """Every mode of ``plan`` run through ``launcher`` (until it breaks), and the report of the run."""
    results: dict[str, ModeResult] = {}
    try:
        launcher.start()
        for mode in plan.modes:
            if launcher.broken:
                break
            if plan.collective.gathers and results:  # every mode is the one bitwise check
                results[mode] = replace(next(iter(results.values())), mode=mode)
                continue
            results[mode] = run_mode(
                launcher,
                mode,
                examples=plan.examples,
                seed=plan.seed,
                max_workers=plan.workers,
                dtypes=plan.dtypes,
                op=plan.op,
                collective=plan.collective,
                order=plan.exact,
            )
    finally:
        launcher.close()
    for result in results.values():
        if result.coverage is not None:
            result.coverage.untried = untried(
                result.coverage,
                allowed=allowed_dtypes(plan.ranks),
                min_workers=launcher.min_workers,
                op=plan.op,
                collective=plan.collective,
            )
    return Report(
        plan.label,
        plan.seed,
        plan.replay,
        results,
        isolated=plan.isolated,
        ranks=plan.ranks,
        timeout_s=plan.timeout if plan.isolated else None,
        output_bytes=launcher.output.bytes,
        output=launcher.output.text,
        op=plan.op,
        collective=plan.collective,
        exact_against=plan.exact if "exact" in plan.modes else None,
        tested_n=launcher.tested_n,
    )


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
    if not collective.alone:
        return None
    if schedule == "auto" or order is not None:
        raise ValueError(
            f"--collective {collective} checks exact against a named --schedule (or the spec's); --schedule "
            "auto and --order reveal and name all-reduce orders (drop them; ring-ref reveal --collective "
            "reduce-scatter names a reduce-scatter's order)"
        )
    if collective.gathers:
        if op is not None:
            raise ValueError(
                "an all-gather copies, it reduces nothing: drop op (--op) for --collective all-gather"
            )
        return replace(SPEC_ORDER, name="a bitwise copy of every shard (all-gather)")
    return reduce_scatter_order(schedule, workers)


def _job_target(
    fn: Target | OpTarget | str, ranks: str, size: int, exact: ExactOrder, *, device: str
) -> tuple[None, str | None]:
    """No launcher yet (rank 0 makes it inside the job) and ``fn``'s name; ``ValueError`` for what
    ``ranks="job"`` cannot do with these options."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device (--device) must be 'cpu' or 'cuda'; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device (--device) cuda puts each rank's tensors on its GPU, but torch here sees no CUDA device "
            "(torch.cuda.is_available() is False): drop --device, or run the job where torch has CUDA"
        )
    if exact.saved is not None and exact.saved.n != size:
        raise ValueError(
            f"order (--order) holds an order for N = {exact.saved.n}, but this job has {size} ranks: "
            "reveal it in a job of the same size"
        )
    name = fn if isinstance(fn, str) else importable_name(fn)
    if name is None and ranks == "mpi-job":
        raise ValueError(
            f"--ranks mpi-job loads the target by name on every rank: {getattr(fn, '__qualname__', fn)!r} "
            "must be a module-level function or a TARGET string"
        )
    return None, name


def _launcher(
    fn: Target | OpTarget | str,
    isolate: bool | None,
    timeout: float,
    ranks: Ranks | None,
    spawn: Spawn,
    *,
    framework: Framework,
) -> tuple[Launcher, str | None]:
    """The launcher for ``fn`` and its importable name (``None`` for a lambda or local function)."""
    name = fn if isinstance(fn, str) else importable_name(fn)
    if ranks is not None:
        if name is None:
            raise ValueError(
                f"a per-rank target runs in the ranks' own processes, which import it by name: "
                f"{getattr(fn, '__qualname__', fn)!r} must be a module-level function or a TARGET string"
            )
        return rank_launcher(ranks, name, timeout, **spawn._asdict()), name
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
