"""The options of :func:`~ring_ref.difftest.difftest` and the rules that need no torch: its words (modes,
``--ranks`` values, frameworks, the defaults), one :class:`Options` value, and the rules that read only
names and numbers, so that the command line refuses a usage error before it imports torch (clause
``cli-arguments-first``).  The rules that read dtypes and the launcher table are
:mod:`ring_ref.difftest._options`'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, NamedTuple

from ring_ref.schedule import COLLECTIVES, Collective, CollectiveName, Schedule

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENV_RANKS",
    "FRAMEWORKS",
    "IN_JOB",
    "MAX_RANKS",
    "MODES",
    "MPI_MAX_RANKS",
    "RANKS",
    "Framework",
    "Mode",
    "Options",
    "Ranks",
    "Spawn",
    "default_max_workers",
    "env_names_refused",
    "env_refused",
    "kinds_refused",
    "modes_of",
    "option_problem",
    "refused_before_torch",
    "spawn_refused",
    "subgroups_refused",
]

Mode = Literal["exact", "order-free", "bound"]
MODES: Final[tuple[Mode, ...]] = ("exact", "order-free", "bound")

DEFAULT_TIMEOUT_S: Final = 60.0
"""The default time limit, in seconds, for one call of an isolated or per-rank target (``--timeout``)."""

Framework = Literal["torch", "jax"]
FRAMEWORKS: Final[tuple[Framework, ...]] = ("torch", "jax")
"""What a stacked target is handed (``--framework``): a ``torch.Tensor`` (the default), or a ``jax.Array``
with the same bits, returning a ``jax.Array`` (the extra ``ring-ref[jax]``; :mod:`ring_ref.difftest._jax`)."""

Ranks = Literal["gloo", "mpi", "job", "mpi-job", "jax", "mlx"]
RANKS: Final[tuple[Ranks, ...]] = ("gloo", "mpi", "job", "mpi-job", "jax", "mlx")
"""The process groups a per-rank target can run on (``--ranks``): gloo, ``TARGET(tensor)``; mpi,
``TARGET(comm, array)`` with an ``mpi4py`` communicator and a ``numpy`` array; job, ``TARGET(tensor)``
on every rank of the job the tester runs in (``torchrun``, ``srun``, ``mpirun``); mpi-job,
``TARGET(comm, array)`` on every rank of the MPI job the tester runs in; jax, ``TARGET(x)`` with a
``jax.Array`` on every process of a ``jax.distributed`` group over gloo
(:class:`~ring_ref.difftest._ranks.JaxRanks`); mlx, ``TARGET(tensor)`` on every process of an MLX ring
group on ``127.0.0.1``, joined from ``MLX_HOSTFILE`` and ``MLX_RANK``
(:class:`~ring_ref.difftest._ranks.MlxRanks`)."""
IN_JOB: Final[tuple[Ranks, ...]] = ("job", "mpi-job")
"""The ``--ranks`` that run inside the user's own job: its launcher started the ranks, not the tester."""

MAX_RANKS: Final = 8
"""The default largest group for a per-rank target (``--max-workers``; 16 for a stacked one)."""

MPI_MAX_RANKS: Final = 4
"""The default largest job for ``--ranks mpi``: a correct ring answered in about 50 s (8 ranks: 1.5-3 min)."""


class Spawn(NamedTuple):
    """How the tester starts an MPI job's ranks (``--ranks mpi``): OpenMPI's ``--mca`` options, the ranks'
    environment variables (``--env``), the launcher's path (``--mpiexec``; ``None``: found)."""

    mca: Mapping[str, str]
    env: Mapping[str, str]
    mpiexec: str | None


def env_names_refused(env: Mapping[str, str]) -> str | None:
    """Why ``env`` (``--env NAME=VALUE``) cannot be an environment, or ``None``.

    >>> env_names_refused({"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"}) is None
    True
    >>> env_names_refused({"1X": "2"})
    "env (--env) names must be NAME=VALUE with NAME letters, digits and '_' (not first a digit); got '1X'"
    """
    bad = [name for name in env if not (name.isidentifier() and name.isascii())]
    if bad:
        return (
            "env (--env) names must be NAME=VALUE with NAME letters, digits and '_' (not first a digit); "
            f"got {', '.join(map(repr, bad))}"
        )
    return None


@dataclass(frozen=True)
class Options:
    """:func:`~ring_ref.difftest.difftest`'s keyword arguments, as given (its docstring says what each
    does); the search reads them from here."""

    modes: str | Iterable[str] = MODES
    examples: int = 100
    seed: int | None = None
    max_workers: int | None = None
    dtypes: Sequence[torch.dtype] | None = None
    label: str | None = None
    """The name the report prints for the target (``None``: its ``TARGET`` string or its qualified name)."""
    timeout: float = DEFAULT_TIMEOUT_S
    isolate: bool | None = None
    ranks: Ranks | None = None
    mca: Mapping[str, str] | None = None
    op: object = None
    schedule: str | Schedule | None = None
    order: str | Path | None = None
    collective: Collective | CollectiveName = Collective.ALL_REDUCE
    group: object = None
    device: str = "cpu"
    framework: Framework = "torch"
    subgroups: bool = False
    env: Mapping[str, str] | None = None
    mpiexec: str | None = None

    @property
    def spawn(self) -> Spawn:
        """How ``--ranks mpi`` starts its jobs."""
        return Spawn(self.mca or {}, self.env or {}, self.mpiexec)


def kinds_refused(options: Options) -> str | None:
    """The first of the rules on what kinds of run ``options`` combine (collective, ranks, framework,
    isolation, ``mca``) that they break, in words; ``None``: none.

    >>> kinds_refused(Options(mca={"btl": "self"}))
    "mca (--mca) options are passed to mpirun: they need ranks='mpi' (--ranks mpi); got ranks=None"
    """
    collective, ranks, framework = options.collective, options.ranks, options.framework
    if collective not in COLLECTIVES:
        return f"collective (--collective) must be one of {list(COLLECTIVES)}; got {collective!r}"
    if ranks is not None and ranks not in RANKS:
        return f"ranks must be one of {list(RANKS)} or None; got {ranks!r}"
    if framework not in FRAMEWORKS or (framework != "torch" and ranks not in (None, "jax")):
        return (
            f"framework (--framework) must be one of {list(FRAMEWORKS)}, and jax is for stacked targets "
            f"or ranks='jax' (--ranks jax); got framework={framework!r}, ranks={ranks!r}"
        )
    if ranks is not None and options.isolate is False:
        return (
            "isolate=False (--in-process) cannot be combined with ranks (--ranks): the ranks are processes "
            f"of their own, which import the target by name; got ranks={ranks!r}"
        )
    if options.mca and ranks != "mpi":
        return (
            "mca (--mca) options are passed to mpirun: they need ranks='mpi' (--ranks mpi); "
            f"got ranks={ranks!r}"
        )
    return auto_in_job_refused(options) or spawn_refused(options)


def auto_in_job_refused(options: Options) -> str | None:
    """Why ``schedule="auto"`` cannot run in the user's job (``None``: not asked there): revealing first
    is a run of its own, which rank 0 cannot start inside the job.

    >>> auto_in_job_refused(Options(schedule="auto", ranks="gloo")) is None
    True
    """
    ranks = options.ranks
    if options.schedule != "auto" or ranks not in IN_JOB:
        return None
    return (
        "--schedule auto reveals the target's order first, which a job cannot do inside difftest: run "
        f"`ring-ref reveal --ranks {ranks} TARGET --json > order.json` in the job, then "
        f"`ring-ref difftest --ranks {ranks} TARGET --order order.json`"
    )


ENV_RANKS: Final = ("gloo", "mpi", "jax", "mlx")
"""The ``--ranks`` whose processes the tester starts, and so can hand ``--env``'s variables."""


def env_refused(env: Mapping[str, str], mpiexec: str | None, ranks: str | None) -> str | None:
    """Why ``env`` (``--env``) and ``mpiexec`` (``--mpiexec``) cannot be used with ``ranks`` (``None``: they
    can): ``env`` needs ranks the tester starts (:data:`ENV_RANKS`) and names an environment holds,
    ``mpiexec`` an MPI job the tester starts.

    >>> env_refused({"X": "1"}, None, "gloo") is None
    True
    >>> env_refused({"X": "1"}, None, "mpi-job")[:52]
    'env (--env) sets variables in the processes that the'
    """
    if mpiexec and ranks != "mpi":
        return (
            "mpiexec (--mpiexec) is the launcher the tester starts an MPI job with: it needs ranks='mpi' "
            f"(--ranks mpi); got ranks={ranks!r}"
        )
    if env and ranks not in ENV_RANKS:
        where = (
            "a stacked TARGET runs in the tester's own process: set the variables in the environment "
            "ring-ref runs in"
            if ranks is None
            else "inside your own job give the variables to its launcher (mpiexec -genv NAME VALUE, mpirun "
            "-x NAME=VALUE, or export NAME=VALUE before torchrun or mlx.launch)"
        )
        return (
            f"env (--env) sets variables in the processes that the tester starts: it needs ranks "
            f"{', '.join(map(repr, ENV_RANKS))}; {where}; got ranks={ranks!r}"
        )
    return env_names_refused(env)


def spawn_refused(options: Options) -> str | None:
    """Why ``options.env`` and ``options.mpiexec`` cannot be used (``None``: they can): :func:`env_refused`.

    >>> spawn_refused(Options(mpiexec="mpiexec", ranks="gloo"))[:45]
    'mpiexec (--mpiexec) is the launcher the teste'
    """
    return env_refused(options.env or {}, options.mpiexec, options.ranks)


def refused_before_torch(options: Options) -> str | None:
    """The first rule ``options`` break of those that read no dtype and no op (``None``: none): what the
    command line checks before it imports torch; :func:`ring_ref.difftest._options.refused` checks them
    all, in its own order.

    >>> refused_before_torch(Options(subgroups=True, ranks="gloo"))[:40]
    'subgroups (--subgroups) tests every smal'
    """
    return kinds_refused(options) or subgroups_refused(options.subgroups, options.ranks)


def subgroups_refused(subgroups: object, ranks: str | None) -> str | None:
    """Why ``subgroups`` cannot be used with ``ranks``, or ``None``.

    >>> subgroups_refused(True, "gloo")[:40]
    'subgroups (--subgroups) tests every smal'
    """
    if not isinstance(subgroups, bool):
        return f"subgroups (--subgroups) must be True or False; got {subgroups!r}"
    if subgroups and ranks not in IN_JOB:
        return (
            "subgroups (--subgroups) tests every smaller N inside a job, through subgroups of its ranks: it "
            f"needs ranks='job' or 'mpi-job' (--ranks job / mpi-job); got ranks={ranks!r} (--ranks gloo and "
            "mpi draw every N up to --max-workers already)"
        )
    return None


def default_max_workers(ranks: Ranks | None) -> int:
    """The largest ``N`` when none is given: 16 stacked, 8 on gloo ranks, 4 in MPI jobs, jax and MLX groups
    (slower to start: every process imports jax or MLX).

    >>> [default_max_workers(r) for r in (None, "gloo", "mpi", "jax", "mlx")]
    [16, 8, 4, 4, 4]
    """
    return MPI_MAX_RANKS if ranks in ("mpi", "jax", "mlx") else MAX_RANKS if ranks else 16


def modes_of(modes: str | Iterable[str]) -> tuple[Mode, ...]:
    """``modes`` as the modes to run, in the order given: one name, ``"all"``, or a list of them.

    >>> modes_of("bound"), modes_of(["bound", "exact", "bound"]), modes_of(["all"]) == MODES
    (('bound',), ('bound', 'exact'), True)
    """
    asked = [modes] if isinstance(modes, str) else list(modes)
    if not asked or any(m not in (*MODES, "all") for m in asked):
        raise ValueError(
            f"each mode must be one of {[*MODES, 'all']}; modes (mode=, --mode) takes one or a "
            f"non-empty list of them; got {asked}"
        )
    return MODES if "all" in asked else tuple(m for m in dict.fromkeys(asked) if m in MODES)


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
