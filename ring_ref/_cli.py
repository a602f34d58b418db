"""The ``ring-ref`` command line (also ``python -m ring_ref``): every sub-command's arguments, parsed and
checked by the rules that need no torch before anything heavy is imported (clause
``cli-arguments-first``: ``--help`` and a usage error answer at once); then :mod:`ring_ref._commands`
runs the command."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Sequence

from ring_ref._names import (
    DTYPE_NAMES,
    INVARIANCE_DRAWS,
    INVARIANCE_PROBE,
    OPS,
    REVEAL_CHECKS,
)
from ring_ref._version import __version__
from ring_ref.difftest._rules import (
    DEFAULT_TIMEOUT_S,
    FRAMEWORKS,
    IN_JOB,
    MAX_RANKS,
    MODES,
    MPI_MAX_RANKS,
    RANKS,
    Options,
    Spawn,
    default_max_workers,
    env_names_refused,
    env_refused,
    option_problem,
    refused_before_torch,
)
from ring_ref.schedule import ALL_REDUCE, COLLECTIVES, PRESETS, REDUCE_SCATTER, Collective

__all__ = ["build_parser", "main"]


def _mpi_arguments(parser: argparse.ArgumentParser) -> None:
    """``--env NAME=VALUE`` and ``--mca KEY=VALUE`` (repeatable) and ``--mpiexec PATH``: how the tester starts
    its ranks (``--env``: every launcher's; the others ``--ranks mpi``'s)."""
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --ranks mpi, gloo, jax or mlx: set NAME=VALUE in every rank's environment (repeatable; "
        "mpi: through the launcher; gloo, jax, mlx: in each forked rank before it joins the group and "
        "imports TARGET), e.g. MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring (MPICH), I_MPI_ADJUST_ALLREDUCE=8 "
        "(Intel MPI), OMPI_MCA_coll_tuned_allreduce_algorithm=4 (OpenMPI), MLX_RING_VERBOSE=1 (MLX)",
    )
    parser.add_argument(
        "--mca",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --ranks mpi under OpenMPI: pass --mca KEY VALUE to mpirun (repeatable), e.g. "
        "coll_tuned_use_dynamic_rules=1 --mca coll_tuned_allreduce_algorithm=4 (OpenMPI's ring)",
    )
    parser.add_argument(
        "--mpiexec",
        metavar="PATH",
        default=None,
        help="with --ranks mpi: the launcher to start the ranks with (default: the mpiexec or mpirun beside "
        "this Python, else on PATH, of the MPI mpi4py uses)",
    )


def _assignments(items: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` items as a mapping (the last of a key wins)."""
    return dict(item.partition("=")[::2] for item in items)


def _mpi_problem(args: argparse.Namespace, *, ranks: bool = True) -> str:
    """What is wrong with ``--env``, ``--mca`` and ``--mpiexec`` (``""``: nothing): each item ``KEY=VALUE``,
    names an environment can hold, and (``ranks``; difftest's own rules say it) ranks that take them
    (:func:`~ring_ref.difftest._rules.env_refused`; ``--mca``: ``--ranks mpi``)."""
    for option, items in (("--env", args.env), ("--mca", args.mca)):
        if any(not item.partition("=")[0] or "=" not in item for item in items):
            return f"{option} takes {'NAME' if option == '--env' else 'KEY'}=VALUE; got {items}"
    if ranks and args.mca and args.ranks != "mpi":
        return (
            "--mca options are passed to the mpirun the tester starts: they need ranks='mpi' (--ranks mpi); "
            "inside your own job give them to its mpirun (or as OMPI_MCA_KEY variables); got --ranks "
            f"{args.ranks}"
        )
    if ranks:
        return env_refused(_assignments(args.env), args.mpiexec, args.ranks) or ""
    return env_names_refused(_assignments(args.env)) or ""


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
        "ring-ref[jax]; mlx: TARGET(tensor) in every process of an MLX ring on 127.0.0.1, MLX_HOSTFILE and "
        "MLX_RANK set, the extra ring-ref[mlx])",
    )
    _job_arguments(parser)
    _mpi_arguments(parser)
    parser.add_argument(
        "--subgroups",
        action="store_true",
        help="with --ranks job or mpi-job: test every N from 1 to the job's size, a smaller N on the "
        "subgroup of ranks 0..N-1 (torch.distributed.new_group: TARGET(tensor, group=G); mpi-job: "
        "TARGET(comm_N, array)); the report says which N were tested",
    )
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
        default=ALL_REDUCE,
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
        "jax, mlx and mpi, where a correct ring took about 50 s in all three modes, and 1.5-3 minutes "
        "with 8)",
    )
    parser.add_argument(
        "--dtypes",
        nargs="+",
        default=None,
        help=f"dtypes to generate, space- or comma-separated (default: {' '.join(DTYPE_NAMES)}; "
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
        help=f"check exact against this order: a preset ({', '.join(PRESETS)}), "
        "=DIRECTION,OFFSET,LAYOUT, or auto (reveal the target's order first)",
    )
    order.add_argument(
        "--order",
        metavar="FILE",
        help="check exact against the trees of a saved `ring-ref reveal --json` (inputs of its N, M, dtype)",
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
        choices=DTYPE_NAMES,
        default="float32",
        help="float32 (the default) or float64 (N <= 65536), float16 (N <= 2048), bfloat16 (N <= 256)",
    )
    parser.add_argument(
        "--checks", type=int, default=REVEAL_CHECKS, help="random-input bitwise checks (default 4)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the checking inputs (default 0)")
    parser.add_argument("--svg", metavar="FILE", help="also draw the distinct trees into FILE")
    parser.add_argument("--json", action="store_true", help="print one JSON object (spec/reveal.schema.json)")
    parser.add_argument(
        "--ranks",
        choices=RANKS,
        help="TARGET is per rank: TARGET(tensor) on every rank of a gloo group (or TARGET(comm, array) in an "
        "MPI job, or TARGET(x), x a jax.Array, in a jax.distributed group, or TARGET(tensor) in an "
        "MLX ring) of N processes, or (job, mpi-job) of the job this command runs in, whose size must be "
        "N; every rank must end with the same bits",
    )
    _rank_timeout_argument(parser)
    _job_arguments(parser)
    _mpi_arguments(parser)
    _framework_argument(parser)
    parser.add_argument(
        "--collective",
        choices=(ALL_REDUCE, REDUCE_SCATTER),
        default=ALL_REDUCE,
        help="reduce-scatter: TARGET maps (N, M) to (N, M/N) (per rank TARGET(output, input)); the "
        "shards, in rank order, are revealed as the M elements they make, and each shard's order is named",
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
        help=f"probed elements K (default {INVARIANCE_PROBE}; fewer when the smallest size is)",
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
        default=INVARIANCE_DRAWS,
        help=f"with --by-bits: random inputs tried (default {INVARIANCE_DRAWS})",
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
        help="TARGET is per rank, as for difftest --ranks: each rank's buffer holds its probe at the offset "
        "(job, mpi-job: every rank of the job this command runs in, -n its size; rank 0 prints)",
    )
    _mpi_arguments(parser)
    _rank_timeout_argument(parser)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one sub-command per tool."""
    parser = argparse.ArgumentParser(
        prog="ring-ref",
        description="Reference ring all-reduce: demo, traces, vectors, differential testing, reveal, "
        "invariance.",
    )
    parser.add_argument("--version", action="version", version=f"ring-ref {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="the worked example and an N = 4 walkthrough")
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
    dt = commands.add_parser(
        "difftest", help="check an all-reduce implementation against the reference and diagnose its bug"
    )
    _difftest_arguments(dt)
    rv = commands.add_parser(
        "reveal", help="name the summation order of every result element of an all-reduce, from its outputs"
    )
    _reveal_arguments(rv)
    inv = commands.add_parser(
        "invariance",
        help="does an element's order change with the message size or its position in the buffer?",
    )
    _invariance_arguments(inv)
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


def _difftest_problem(args: argparse.Namespace) -> str:
    """What is wrong with ``difftest``'s arguments by the rules that need no torch (``""``: nothing yet);
    keeps on ``args`` the :class:`~ring_ref.difftest._rules.Options` they make (``options``, without its
    dtypes) and the dtypes by name (``dtype_names``), for the command."""
    names = [d for item in args.dtypes or [] for d in item.split(",") if d]
    unknown = [d for d in names if d not in DTYPE_NAMES]
    args.dtype_names = [d for d in names if d in DTYPE_NAMES]
    args.options = Options(
        modes=[m for m in (*MODES, "all") if m in (args.mode or ["all"])],
        examples=args.examples,
        seed=args.seed,
        max_workers=args.max_workers,
        timeout=args.timeout,
        isolate=not args.in_process,
        ranks=args.ranks,
        **args.spawn._asdict(),
        op=args.op,
        schedule=args.schedule,
        order=args.order,
        collective=args.collective,
        framework=args.framework,
        subgroups=args.subgroups,
    )
    if unknown or (args.dtypes is not None and not names):
        return f"unknown dtype(s) {unknown or names}; choose from {', '.join(DTYPE_NAMES)}"
    if problem := _mpi_problem(args, ranks=False):
        return problem
    if (args.backend or args.device) and args.ranks != "job":
        return "--backend and --device choose the job's process group and device: they need --ranks job"
    # in a job N is the job's size, known only inside it: --max-workers is checked there
    in_job = args.ranks in IN_JOB
    workers = default_max_workers(args.ranks) if args.max_workers is None or in_job else args.max_workers
    return refused_before_torch(args.options) or option_problem(
        examples=args.examples, seed=args.seed, max_workers=workers, timeout=args.timeout
    )


def _invariance_problem(args: argparse.Namespace) -> str:
    """What is wrong with ``invariance``'s arguments before anything is imported (``""``: nothing yet)."""
    if problem := _mpi_problem(args):
        return problem
    if args.svg and args.by_bits:
        return "--svg draws trees, and --by-bits reveals none: drop one"
    return ""


def _usage_problem(args: argparse.Namespace) -> str:
    """The first usage error of the parsed ``args`` that needs no torch, in words (``""``: none found)."""
    if args.command == "difftest":
        return _difftest_problem(args)
    if args.command == "invariance":
        return _invariance_problem(args)
    if args.command == "reveal":
        return _mpi_problem(args)
    if args.command == "vectors" and not args.out.strip():
        return "--out must name a directory; got an empty path"
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ring-ref`` console script: the arguments are parsed and checked by the rules
    that need no torch first (clause ``cli-arguments-first``), then the command runs."""
    started = time.perf_counter()
    parser = build_parser()
    _dash_value(parser, sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if hasattr(args, "collective"):  # the one place a --collective name becomes the value
        args.collective = Collective(args.collective)
    args.started = started  # for reveal's time line: the whole command, torch's import included
    if args.command in ("difftest", "reveal", "invariance"):  # how --ranks mpi starts its jobs
        args.spawn = Spawn(_assignments(args.mca), _assignments(args.env), args.mpiexec)
    problem = _usage_problem(args)
    if problem:
        error = "" if args.command == "vectors" else "error: "
        print(f"ring-ref {args.command}: {error}{problem}", file=sys.stderr)
        return 2
    # the tools and torch, imported only once the arguments hold (a function-level import on purpose)
    from ring_ref._commands import COMMANDS

    try:
        status: int = COMMANDS[args.command](args)
    except BrokenPipeError:
        # The reader left early (`ring-ref trace -n 64 | head`): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status
