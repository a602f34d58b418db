"""The ``ring-ref`` command line (also ``python -m ring_ref``)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import operator
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import torch

from ring_ref import _invariance, _reveal, _svg
from ring_ref._dispatch import ring_all_reduce
from ring_ref._hints import signature_problem
from ring_ref._ops import OPS
from ring_ref._reveal import RevealError
from ring_ref._trace import check_trace_size, render_table, trace, trace_json
from ring_ref._vectors import _collectives, _ops, _presets, _sums
from ring_ref._version import __version__
from ring_ref.core import initial_state, run_ring
from ring_ref.difftest import DTYPES, MODES, OrderError, TargetError, _orders, load_target
from ring_ref.difftest._in_job import command_in_job, reveal_in_job
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._options import Options, rank_launcher, refused
from ring_ref.difftest._report import Report
from ring_ref.difftest._search import run_difftest
from ring_ref.difftest._vocabulary import (
    COLLECTIVES,
    DEFAULT_TIMEOUT_S,
    FRAMEWORKS,
    MAX_RANKS,
    MPI_MAX_RANKS,
    RANKS,
)
from ring_ref.invariants import Provenance, State
from ring_ref.schedule import ALL_REDUCE, PRESETS, SPEC, ChainSchedule, Phase, reduce_scatter_ring


def _demo(_args: argparse.Namespace) -> int:
    print("Worked example (spec clause worked-example)")
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    print(f"  worker 0 = {x[0].tolist()}, worker 1 = {x[1].tolist()}")
    buffers: dict[str, list[list[float]]] = {}

    def observe(phase: Phase, r: int, state: State[float], _prov: State[Provenance]) -> None:
        buffers[f"{phase} round {r}"] = [list(row) for row in state]

    run_ring(initial_state([[1.0, 2.0], [3.0, 4.0]]), operator.add, observe)
    for stage, rows in buffers.items():
        print(f"  after {stage}: worker buffers {rows}")
    print(f"  ring_all_reduce(x) = {ring_all_reduce(x).tolist()}")
    print()
    n = 4
    print(f"Round-by-round walkthrough for N = {n} (ring-ref trace -n {n})")
    print()
    print(render_table(trace(n)))
    values = torch.arange(n * n * 2, dtype=torch.float32).reshape(n, 2 * n)
    result = ring_all_reduce(values)
    print()
    print(f"With worker i holding {2 * n} values [{2 * n}i, ..., {2 * n}i + {2 * n - 1}]:")
    print(f"  ring_all_reduce = {result.tolist()}")
    print(f"  torch.sum(x, 0) = {values.sum(0).tolist()}")
    return 0


def _trace_command(args: argparse.Namespace) -> int:
    m = args.n if args.m is None else args.m
    try:
        ring = _orders.schedule_ring(args.schedule)
        if args.collective != ALL_REDUCE:  # a preset's name takes its direction as the offset
            ring = reduce_scatter_ring(args.schedule if args.schedule in PRESETS else ring, args.n)
        check_trace_size(args.n, m, args.format, ring, collective=args.collective)
        records = trace(args.n, ring, args.op, collective=args.collective)
    except (ValueError, TypeError) as err:
        print(f"ring-ref trace: {err}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(trace_json(records, m, ring, collective=args.collective), indent=1))
    elif args.format == "svg":
        print(_svg.rounds_svg(records), end="")
    else:
        if args.collective != ALL_REDUCE:
            print(f"collective: {args.collective} alone (spec section 12)")
        if isinstance(ring, ChainSchedule):
            print(f"schedule: {ring.describe()} (spec section 15: not a ring; rounds are its steps)\n")
        elif ring != SPEC:
            print(f"ring: {ring.normalized(args.n).describe()} (spec section 10)\n")
        print(render_table(records))
    return 0


def _vectors_command(args: argparse.Namespace) -> int:
    if not args.out.strip():
        print("ring-ref vectors: --out must name a directory; got an empty path", file=sys.stderr)
        return 2
    generator = (
        _presets if args.presets else _ops if args.ops else _collectives if args.collectives else _sums
    )
    try:
        written = generator.write(Path(args.out))
    except OSError as err:
        print(f"ring-ref vectors: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


def _mca_argument(parser: argparse.ArgumentParser) -> None:
    """``--mca KEY=VALUE`` (repeatable), passed to ``mpirun`` under ``--ranks mpi``."""
    parser.add_argument(
        "--mca",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --ranks mpi: pass --mca KEY VALUE to mpirun (repeatable), e.g. "
        "coll_tuned_use_dynamic_rules=1 --mca coll_tuned_allreduce_algorithm=4 (OpenMPI's ring)",
    )


def _mca_malformed(items: list[str]) -> bool:
    """Whether some ``--mca`` item is not ``KEY=VALUE``."""
    return any(not item.partition("=")[0] or "=" not in item for item in items)


def _rank_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """``--timeout``: the time limit of one call of a per-rank target."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"with --ranks: seconds one call may take (default {DEFAULT_TIMEOUT_S:g})",
    )


def _framework_argument(parser: argparse.ArgumentParser) -> None:
    """``--framework``, for difftest and reveal alike."""
    parser.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default="torch",
        help="what TARGET takes and returns: torch (a torch.Tensor, the default) or jax (a jax.Array "
        "with the same bits; the extra ring-ref[jax])",
    )


def _difftest_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ring-ref difftest`` options."""
    parser.add_argument(
        "target", metavar="TARGET", help="package.module:function or path/to/file.py:function"
    )
    parser.add_argument(
        "--ranks",
        choices=RANKS,
        default=None,
        help="TARGET is per rank: call it on every rank of a process group of N processes "
        "(gloo: TARGET(tensor), torch.distributed on 127.0.0.1; mpi: TARGET(comm, array), an mpi4py "
        "communicator and a numpy array, ranks started by mpirun; float16/float32/float64 only; job: "
        "TARGET(tensor) on every rank of the job this command runs in, under torchrun, srun or mpirun; "
        "mpi-job: TARGET(comm, array) on every rank of the MPI job this command runs in; jax: TARGET(x), "
        "x a jax.Array, in every process of a jax.distributed group over gloo on 127.0.0.1, the extra "
        "ring-ref[jax])",
    )
    _job_arguments(parser)
    parser.add_argument(
        "--subgroups",
        action="store_true",
        help="with --ranks job or mpi-job: test every N from 1 to the job's size, a smaller N on the "
        "subgroup of ranks 0..N-1 (torch.distributed.new_group: TARGET(tensor, group=G); mpi-job: "
        "TARGET(comm_N, array)); the report says which N were tested",
    )
    _mca_argument(parser)
    _framework_argument(parser)
    parser.add_argument(
        "--mode",
        choices=[*MODES, "all"],
        action="append",
        help="an oracle to run; repeat it for several (default all)",
    )
    parser.add_argument(
        "--op",
        choices=OPS,
        default=None,
        help="check this reduction: TARGET is called with op= too (the name; a gloo rank gets the "
        "torch.distributed.ReduceOp) and checked with the op's oracles (default: TARGET(x), a sum)",
    )
    parser.add_argument(
        "--collective",
        choices=COLLECTIVES,
        default="all-reduce",
        help="what TARGET computes (default all-reduce): reduce-scatter, (N, M, ...) -> (N, M/N, ...) with "
        "chunk r at rank r; all-gather, (N, S, ...) -> (N*S, ...), every bit copied; per rank both are "
        "TARGET(output, input) (mpi: TARGET(comm, sendbuf, recvbuf))",
    )
    parser.add_argument("--examples", type=int, default=100, help="generated inputs per mode (default 100)")
    parser.add_argument("--seed", type=int, default=None, help="replay seed (default: random, printed)")
    parser.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help=f"largest N generated (default 16; {MAX_RANKS} with --ranks gloo; {MPI_MAX_RANKS} with --ranks "
        "jax and --ranks mpi, where a correct ring took about 50 s in all three modes, and 1.5-3 minutes "
        "with 8)",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=None,
        help=f"dtypes to generate, space- or comma-separated (default: {' '.join(DTYPES)}; "
        "without bfloat16 for --ranks mpi)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds one call may take before the target is stopped (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="call the target in the tester's own process (no isolation, no time limit; for debugging)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the text report"
    )
    order = parser.add_mutually_exclusive_group()
    order.add_argument(
        "--schedule",
        metavar="NAME",
        help="check exact against this order: a preset (spec, openmpi-ring, gloo, chain), "
        "=DIRECTION,OFFSET,LAYOUT, or auto (reveal the target's order first)",
    )
    order.add_argument(
        "--order",
        metavar="FILE",
        help="check exact against the trees of a saved `ring-ref reveal --json` (inputs of its N, M, dtype)",
    )


def _difftest_command(args: argparse.Namespace) -> int:
    """Run ``ring-ref difftest``: 0 pass, 1 fail, 2 usage error (reason on stderr).

    The target runs in a worker process that captures its output, so stdout
    holds only the report; with ``--in-process`` whatever the target prints
    through ``sys.stdout`` goes to stderr under ``--json``.  A broken option rule
    (:func:`ring_ref.difftest._options.refused`) is a usage error in the API's words.
    """
    names = [d for item in args.dtypes or [] for d in item.split(",") if d]
    unknown = [d for d in names if d not in DTYPES]
    problem = ""
    if unknown or (args.dtypes is not None and not names):
        problem = f"unknown dtype(s) {unknown or names}; choose from {', '.join(DTYPES)}"
    elif _mca_malformed(args.mca):
        problem = f"--mca takes KEY=VALUE; got {args.mca}"
    elif (args.backend or args.device) and args.ranks != "job":
        problem = "--backend and --device choose the job's process group and device: they need --ranks job"
    options = Options(
        modes=[m for m in (*MODES, "all") if m in (args.mode or ["all"])],
        examples=args.examples,
        seed=args.seed,
        max_workers=args.max_workers,
        dtypes=[DTYPES[d] for d in dict.fromkeys(names) if d in DTYPES] or None,
        timeout=args.timeout,
        isolate=not args.in_process,
        ranks=args.ranks,
        mca=dict(item.partition("=")[::2] for item in args.mca),
        op=args.op,
        schedule=args.schedule,
        order=args.order,
        collective=args.collective,
        framework=args.framework,
        subgroups=args.subgroups,
    )
    problem = problem or refused(options) or ""
    if problem:
        print(f"ring-ref difftest: error: {problem}", file=sys.stderr)
        return 2
    if args.ranks in ("job", "mpi-job"):
        return _difftest_in_job(args, options)
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        try:
            report = run_difftest(args.target, options)
        except OrderError as exc:
            print(f"ring-ref difftest: {exc}", file=sys.stderr)
            return 1 if args.schedule == "auto" else 2
        except (TargetError, RevealError, ValueError) as exc:
            print(f"ring-ref difftest: error: {exc}", file=sys.stderr)
            return 2
    return _print_report(report, args.json)


def _print_report(report: Report, as_json: bool, out: TextIO | None = None) -> int:
    """Print ``report`` (its JSON or its text) on ``out`` (stdout); the exit status of its verdict."""
    print(report.to_json_text() if as_json else report.render(), file=out or sys.stdout, flush=True)
    return 0 if report.verdict == "pass" else 1


def _difftest_in_job(args: argparse.Namespace, options: Options) -> int:
    """``--ranks job`` or ``mpi-job`` on this rank (:func:`~ring_ref.difftest._in_job.command_in_job`): rank
    0 prints the report (or the error) on the stdout this command started with before the others may
    leave, also when a call left ranks inside the target; every rank returns the verdict's status."""
    out = sys.stdout

    def show(outcome: object) -> None:
        if isinstance(outcome, Report):
            _print_report(outcome, args.json, out)
        else:
            print(f"ring-ref difftest: error: {outcome}", file=sys.stderr, flush=True)

    def body(device: str) -> int:
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            report = run_difftest(
                args.target, dataclasses.replace(options, device=device) if args.ranks == "job" else options
            )
        return 0 if report.verdict == "pass" else 1

    return command_in_job(
        "difftest",
        args.ranks,
        backend=args.backend,
        device=args.device,
        timeout=args.timeout,
        show=show,
        body=body,
        errors=(TargetError, OrderError, ValueError),
    )


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend`` and ``--device``, for ``--ranks job``."""
    parser.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default=None,
        help="with --ranks job: the job's process group backend (default nccl with --device cuda, else gloo)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="with --ranks job: where each rank's tensors live (cuda: cuda:LOCAL_RANK; default cpu)",
    )


def _reveal_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ring-ref reveal`` options (``spec/reveal.md``)."""
    parser.add_argument(
        "target", metavar="TARGET", help="package.module:function or path/to/file.py:function"
    )
    parser.add_argument("-n", type=int, required=True, help="number of workers N")
    parser.add_argument("-m", type=int, required=True, help="elements per worker M (any M >= 1)")
    parser.add_argument(
        "--dtype",
        choices=tuple(_reveal.LIMITS),
        default="float32",
        help="float32 (the default) or float64 (N <= 65536), float16 (N <= 2048), bfloat16 (N <= 256)",
    )
    parser.add_argument(
        "--checks", type=int, default=_reveal.CHECKS, help="random-input bitwise checks (default 4)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the checking inputs (default 0)")
    parser.add_argument("--svg", metavar="FILE", help="also draw the distinct trees into FILE")
    parser.add_argument("--json", action="store_true", help="print one JSON object (spec/reveal.schema.json)")
    parser.add_argument(
        "--ranks",
        choices=[r for r in RANKS if r != "mpi-job"],
        help="TARGET is per rank: TARGET(tensor) on every rank of a gloo group (or TARGET(comm, array) in an "
        "MPI job, or TARGET(x), x a jax.Array, in a jax.distributed group) of N processes, or (job) of the "
        "job this command runs in, whose size must be N; every rank must end with the same bits",
    )
    _rank_timeout_argument(parser)
    _job_arguments(parser)
    _framework_argument(parser)
    parser.add_argument(
        "--collective",
        choices=("all-reduce", "reduce-scatter"),
        default="all-reduce",
        help="reduce-scatter: TARGET maps (N, M) to (N, M/N) (per rank TARGET(output, input)); the "
        "shards, in rank order, are revealed as the M elements they make, and each shard's order is named",
    )


def _reveal_command(args: argparse.Namespace) -> int:  # noqa: PLR0912 - one branch a usage error
    """Run ``ring-ref reveal``: 0 when it ran, 2 on a usage error or a misbehaving target."""
    if args.ranks == "job" and args.collective != "all-reduce":
        print(
            "ring-ref reveal: error: --collective reduce-scatter is revealed on --ranks gloo or mpi (or "
            "stacked), not yet inside a job: drop --collective or run it on a gloo group of the same N",
            file=sys.stderr,
        )
        return 2
    if args.ranks == "job":
        return _reveal_in_job(args)
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        try:
            if args.checks < 0:
                raise _reveal.RevealError(f"--checks must be 0 or more; got {args.checks}")
            _reveal.check_reveal_size(args.n, args.m, args.dtype)
            if misfit := signature_problem(args.target, args.ranks, args.collective):
                raise TargetError(misfit)
            launcher = rank_launcher(args.ranks, args.target, args.timeout) if args.ranks else None
            scatter = args.collective == "reduce-scatter"
            if scatter and args.m % args.n:
                raise _reveal.RevealError(
                    f"--collective reduce-scatter needs M a multiple of N; got {args.m}"
                )
            if launcher is not None and args.framework != "torch" and args.ranks != "jax":
                raise TargetError("--framework jax is for a stacked TARGET or --ranks jax: drop --ranks")
            fn: Callable[[torch.Tensor], object]
            if launcher is not None:
                fn = _orders.per_rank_target(launcher, args.collective)
            else:
                loaded = load_target(args.target, args.framework)
                fn = _orders.stacked_reduce_scatter(loaded) if scatter else loaded
            try:
                if launcher is not None:
                    launcher.start()
                found = _reveal.reveal(
                    fn, args.n, args.m, args.dtype, checks=args.checks, seed=args.seed, name=args.target
                )
            finally:
                if launcher is not None:
                    launcher.close()
            if args.svg:
                Path(args.svg).write_text(_svg.reveal_svg(found), encoding="utf-8")
        except (TargetError, _reveal.RevealError, OSError) as exc:
            print(f"ring-ref reveal: error: {exc}", file=sys.stderr)
            return 2
    _print_revealed(found, args)
    return 0


def _print_revealed(found: _reveal.Revealed, args: argparse.Namespace, out: TextIO | None = None) -> None:
    """The revealed order on ``out`` (the text or the JSON), each shard's order for a reduce-scatter, and
    on stderr the pointer to difftest when the order is not one ring's fold."""
    out = out or sys.stdout
    print(found.to_json_text() if args.json else found.summary(), file=out, flush=True)
    if getattr(args, "collective", "all-reduce") == "reduce-scatter" and not args.json:
        print("reduce-scatter, each shard's order:", file=out)
        print(
            "\n".join(f"  {line}" for line in _orders.shard_orders(found.trees, args.n, found.ring)), file=out
        )
    if found.classification != "ring":
        # reveal names an order, it gives no verdict: the exit status stays 0 (docs/guide/reveal.md)
        ranks = f"--ranks {args.ranks} " if args.ranks else ""
        ranks += "" if args.framework == "torch" else f"--framework {args.framework} "
        print(
            f"ring-ref reveal: the order is not one ring's fold ({found.classification}); to find out "
            f"whether that is a bug, run: ring-ref difftest {ranks}{args.target}",
            file=sys.stderr,
        )


def _reveal_in_job(args: argparse.Namespace) -> int:
    """``reveal --ranks job``: every rank joins and serves; rank 0 reveals and prints (the order of the job's
    own all-reduce at its N, for ``difftest --ranks job --order``)."""
    out = sys.stdout

    def show(outcome: object) -> None:
        if isinstance(outcome, _reveal.Revealed):
            _print_revealed(outcome, args, out)
        else:
            print(f"ring-ref reveal: error: {outcome}", file=sys.stderr, flush=True)

    def run(launcher: Launcher) -> _reveal.Revealed:
        launcher.start()
        found = _reveal.reveal(
            _orders.per_rank_target(launcher),
            args.n,
            args.m,
            args.dtype,
            checks=args.checks,
            seed=args.seed,
            name=args.target,
        )
        if args.svg:
            Path(args.svg).write_text(_svg.reveal_svg(found), encoding="utf-8")
        return found

    def body(device: str) -> int:
        with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
            return reveal_in_job(
                args.target, run, n=args.n, checks=args.checks, device=device, timeout=args.timeout
            )

    return command_in_job(
        "reveal",
        "job",
        backend=args.backend,
        device=args.device,
        timeout=args.timeout,
        show=show,
        body=body,
        errors=(TargetError, _reveal.RevealError, OSError),
    )


def _int_list(text: str) -> list[int]:
    """``8,16,32`` as integers (argparse turns the ``ValueError`` into a usage error, exit 2)."""
    items = [item.strip() for item in text.split(",")]
    if not all(item.lstrip("-").isdigit() for item in items):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 8,16,32; got {text!r}")
    return [int(item) for item in items]


def _invariance_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ring-ref invariance`` options (``spec/invariance.md``)."""
    parser.add_argument(
        "target", metavar="TARGET", help="package.module:function or path/to/file.py:function"
    )
    parser.add_argument("-n", type=int, required=True, help="number of workers N")
    parser.add_argument(
        "--sizes",
        type=_int_list,
        required=True,
        metavar="M1,M2,...",
        help="buffer sizes M (elements per worker)",
    )
    parser.add_argument(
        "--offsets",
        type=_int_list,
        default=None,
        metavar="O1,O2,...",
        help="where the probe region starts in each buffer, placed wherever it fits (default: at each size, "
        "offsets that probe every chunk of a ring of N workers and the buffer's end)",
    )
    parser.add_argument(
        "--probe",
        type=int,
        default=None,
        metavar="K",
        help=f"probed elements K (default {_invariance.DEFAULT_PROBE}; fewer when the smallest size is)",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default="float32",
        help="float32 (the default) or float64 (N <= 65536 to reveal)",
    )
    parser.add_argument(
        "--by-bits",
        action="store_true",
        help="a fast screen without reveal: random values' bits alone and embedded at every placement "
        "(any N; equal bits do not prove one order)",
    )
    parser.add_argument(
        "--draws",
        type=int,
        default=_invariance.BITS_DRAWS,
        help=f"with --by-bits: random inputs tried (default {_invariance.BITS_DRAWS})",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (spec/invariance.schema.json)"
    )
    parser.add_argument(
        "--svg", metavar="FILE", help="also draw probed elements x placements, coloured by tree"
    )
    parser.add_argument(
        "--ranks",
        choices=RANKS,
        help="TARGET is per rank, as for difftest --ranks: each rank's buffer holds its probe at the offset",
    )
    _mca_argument(parser)
    _rank_timeout_argument(parser)


def _invariance_command(args: argparse.Namespace) -> int:
    """Run ``ring-ref invariance``: 0 invariant, 1 not invariant, 2 usage error or misbehaving target."""
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        try:
            if _mca_malformed(args.mca):
                raise _invariance.InvarianceError(f"--mca takes KEY=VALUE; got {args.mca}")
            if args.svg and args.by_bits:
                raise _invariance.InvarianceError("--svg draws trees, and --by-bits reveals none: drop one")
            found = _invariance.invariance(
                args.target,
                args.n,
                args.sizes,
                offsets=args.offsets,
                probe=args.probe,
                dtype=args.dtype,
                ranks=args.ranks,
                mca=dict(item.partition("=")[::2] for item in args.mca),
                by_bits=args.by_bits,
                draws=args.draws,
                seed=args.seed,
                timeout=args.timeout,
            )
            if args.svg:
                Path(args.svg).write_text(_svg.invariance_svg(found), encoding="utf-8")
        except (TargetError, _reveal.RevealError, _invariance.InvarianceError, OSError) as exc:
            print(f"ring-ref invariance: error: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(found.to_json()) if args.json else found.render())
    return 0 if found.invariant else 1


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per tool."""
    parser = argparse.ArgumentParser(
        prog="ring-ref",
        description="Reference ring all-reduce: demo, traces, vectors, differential testing, reveal, "
        "invariance.",
    )
    parser.add_argument("--version", action="version", version=f"ring-ref {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="the worked example and an N = 4 walkthrough")
    demo.set_defaults(func=_demo)
    tr = commands.add_parser("trace", help="every round of both phases: sends, add/copy, slot provenance")
    tr.add_argument("-n", type=int, required=True, help="number of workers N (>= 1)")
    tr.add_argument("-m", type=int, help="rows per worker M, a multiple of N for the even layout (default N)")
    tr.add_argument("--format", choices=("table", "json", "svg"), default="table", help="output format")
    tr.add_argument(
        "--schedule",
        default="spec",
        metavar="NAME",
        help="the ring: a preset (spec, the default; openmpi-ring; gloo; chain, not a ring) or "
        "=DIRECTION,OFFSET,LAYOUT",
    )
    tr.add_argument(
        "--op",
        choices=OPS,
        default="sum",
        help="reduction op (spec section 9): what reduce-scatter receivers store; avg ends dividing by N",
    )
    tr.add_argument(
        "--collective",
        choices=COLLECTIVES,
        default=ALL_REDUCE,
        help="both phases (all-reduce, the default) or one alone (spec section 12), on the ring whose "
        "offset is its direction; M counts the rows of the whole buffer",
    )
    tr.set_defaults(func=_trace_command)
    vec = commands.add_parser("vectors", help="write the conformance vector files (spec/vectors/)")
    vec.add_argument("--out", required=True, help="directory to write into (created if needed)")
    which = vec.add_mutually_exclusive_group()
    which.add_argument(
        "--presets",
        action="store_true",
        help="write the schedule presets' vectors (ring_all_reduce_presets_v1) instead of the v1 files",
    )
    which.add_argument(
        "--ops",
        action="store_true",
        help="write the reduction ops' vectors (ring_all_reduce_ops_v1: prod, max, min, avg) instead",
    )
    which.add_argument(
        "--collectives",
        action="store_true",
        help="write reduce-scatter's and all-gather's vectors (ring_reduce_scatter_v1, ring_all_gather_v1)",
    )
    vec.set_defaults(func=_vectors_command)
    dt = commands.add_parser(
        "difftest", help="check an all-reduce implementation against the reference and diagnose its bug"
    )
    _difftest_arguments(dt)
    dt.set_defaults(func=_difftest_command)
    rv = commands.add_parser(
        "reveal", help="name the summation order of every result element of an all-reduce, from its outputs"
    )
    _reveal_arguments(rv)
    rv.set_defaults(func=_reveal_command)
    inv = commands.add_parser(
        "invariance",
        help="does an element's order change with the message size or its position in the buffer?",
    )
    _invariance_arguments(inv)
    inv.set_defaults(func=_invariance_command)
    return parser


def _dash_value(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Refuse ``--schedule -1,2,blocks``: argparse would read the value as an option and say only
    "expected one argument"."""
    for option, value in itertools.pairwise(argv):
        if option == "--schedule" and value.startswith("-") and value[1:2].isdigit():
            parser.error(
                f"--schedule {value}: write --schedule={value} (with '=': argparse reads a value that "
                "starts with '-' as an option of its own)"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ring-ref`` console script."""
    parser = build_parser()
    _dash_value(parser, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except BrokenPipeError:
        # The reader left early (`ring-ref trace -n 64 | head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status
