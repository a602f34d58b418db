"""The ``ring-ref`` command line (also ``python -m ring_ref``)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import operator
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from ring_ref import _reveal, _svg
from ring_ref._dispatch import ring_all_reduce
from ring_ref._ops import OPS
from ring_ref._reveal import RevealError
from ring_ref._trace import check_trace_size, render_table, trace, trace_json
from ring_ref._vectors import _ops, _presets, _sums
from ring_ref._version import __version__
from ring_ref.core import initial_state, run_ring
from ring_ref.difftest import DTYPES, MODES, OrderError, TargetError, _orders, difftest, load_target
from ring_ref.difftest._vocabulary import DEFAULT_TIMEOUT_S, MAX_RANKS, MPI_MAX_RANKS, RANKS
from ring_ref.invariants import Provenance, State
from ring_ref.schedule import SPEC, Phase


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
        check_trace_size(args.n, m, args.format, ring)
    except (ValueError, TypeError) as err:
        print(f"ring-ref trace: {err}", file=sys.stderr)
        return 2
    records = trace(args.n, ring, args.op)
    if args.format == "json":
        print(json.dumps(trace_json(records, m, ring), indent=1))
    elif args.format == "svg":
        print(_svg.rounds_svg(records), end="")
    else:
        if ring != SPEC:
            print(f"ring: {ring.normalized(args.n).describe()} (spec section 10)\n")
        print(render_table(records))
    return 0


def _vectors_command(args: argparse.Namespace) -> int:
    if not args.out.strip():
        print("ring-ref vectors: --out must name a directory; got an empty path", file=sys.stderr)
        return 2
    generator = _presets if args.presets else _ops if args.ops else _sums
    try:
        written = generator.write(Path(args.out))
    except OSError as err:
        print(f"ring-ref vectors: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


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
        "communicator and a numpy array, ranks started by mpirun; float16/float32/float64 only)",
    )
    parser.add_argument(
        "--mca",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --ranks mpi: pass --mca KEY VALUE to mpirun (repeatable), e.g. "
        "coll_tuned_use_dynamic_rules=1 --mca coll_tuned_allreduce_algorithm=4 (OpenMPI's ring)",
    )
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
    parser.add_argument("--examples", type=int, default=100, help="generated inputs per mode (default 100)")
    parser.add_argument("--seed", type=int, default=None, help="replay seed (default: random, printed)")
    parser.add_argument(
        "--max-workers",
        type=int,
        default=None,
        help=f"largest N generated (default 16; {MAX_RANKS} with --ranks gloo; {MPI_MAX_RANKS} with --ranks "
        "mpi, where a correct ring took about 50 s in all three modes, and 1.5-3 minutes with 8)",
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
        help="check exact against this ring: a preset (spec, openmpi-ring, gloo), =DIRECTION,OFFSET,LAYOUT, "
        "or auto (reveal the target's order first)",
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
    through ``sys.stdout`` goes to stderr under ``--json``.
    """
    names = [d for item in args.dtypes or [] for d in item.split(",") if d]
    unknown = [d for d in names if d not in DTYPES]
    mca = dict(item.partition("=")[::2] for item in args.mca)
    problem = ""
    if args.ranks and args.in_process:
        problem = "--in-process cannot be combined with --ranks (the ranks are processes of their own)"
    if args.mca and args.ranks != "mpi":
        problem = "--mca options are passed to mpirun: they need --ranks mpi"
    if any(not item.partition("=")[0] or "=" not in item for item in args.mca):
        problem = f"--mca takes KEY=VALUE; got {args.mca}"
    if args.ranks == "mpi" and "bfloat16" in names:
        problem = (
            "--ranks mpi hands each rank a numpy array, and numpy has no bfloat16: drop it from --dtypes"
        )
    if unknown or (args.dtypes is not None and not names):
        problem = f"unknown dtype(s) {unknown or names}; choose from {', '.join(DTYPES)}"
    if problem:
        print(f"ring-ref difftest: error: {problem}", file=sys.stderr)
        return 2
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        try:
            report = difftest(
                args.target,
                modes=[m for m in (*MODES, "all") if m in (args.mode or ["all"])],
                examples=args.examples,
                seed=args.seed,
                max_workers=args.max_workers,
                dtypes=[DTYPES[d] for d in dict.fromkeys(names)] if names else None,
                timeout=args.timeout,
                isolate=not args.in_process,
                ranks=args.ranks,
                mca=mca,
                op=args.op,
                schedule=args.schedule,
                order=args.order,
            )
        except OrderError as exc:
            print(f"ring-ref difftest: {exc}", file=sys.stderr)
            return 1 if args.schedule == "auto" else 2
        except (TargetError, RevealError, ValueError) as exc:
            print(f"ring-ref difftest: error: {exc}", file=sys.stderr)
            return 2
    print(report.to_json_text() if args.json else report.render())
    return 0 if report.verdict == "pass" else 1


def _reveal_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``ring-ref reveal`` options (spec section 11)."""
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
        choices=RANKS,
        help="TARGET is per rank: TARGET(tensor) on every rank of a gloo group (or TARGET(comm, array) in an "
        "MPI job) of N processes; every rank must end with the same bits",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"with --ranks: seconds one call may take (default {DEFAULT_TIMEOUT_S:g})",
    )


def _reveal_command(args: argparse.Namespace) -> int:
    """Run ``ring-ref reveal``: 0 when it ran, 2 on a usage error or a misbehaving target."""
    with contextlib.redirect_stdout(sys.stderr if args.json else sys.stdout):
        try:
            if args.checks < 0:
                raise _reveal.RevealError(f"--checks must be 0 or more; got {args.checks}")
            _reveal.check_reveal_size(args.n, args.m, args.dtype)
            launcher = _orders.rank_launcher(args.ranks, args.target, args.timeout) if args.ranks else None
            fn = load_target(args.target) if launcher is None else _orders.per_rank_target(launcher)
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
    print(json.dumps(found.to_json()) if args.json else found.summary())
    if found.classification != "ring":
        # reveal names an order, it gives no verdict: the exit status stays 0 (docs/guide/reveal.md)
        ranks = f"--ranks {args.ranks} " if args.ranks else ""
        print(
            f"ring-ref reveal: the order is not one ring's fold ({found.classification}); to find out "
            f"whether that is a bug, run: ring-ref difftest {ranks}{args.target}",
            file=sys.stderr,
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per tool."""
    parser = argparse.ArgumentParser(
        prog="ring-ref",
        description="Reference ring all-reduce: demo, traces, vectors, differential testing, reveal.",
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
        help="the ring: a preset (spec, the default; openmpi-ring; gloo) or =DIRECTION,OFFSET,LAYOUT",
    )
    tr.add_argument(
        "--op",
        choices=OPS,
        default="sum",
        help="reduction op (spec section 9): what reduce-scatter receivers store; avg ends dividing by N",
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
