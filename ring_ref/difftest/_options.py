"""What :func:`~ring_ref.difftest.difftest` was asked (one :class:`Options` value), the rules its options
must keep together, and the one table of which launcher serves which ``--ranks`` value.

The command line and the Python API check the same rules (:func:`refused`) with the same words; the
command line turns a broken rule into exit status 2, the API into a ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import torch

from ring_ref._dtypes import TORCH_DTYPES, dtype_name
from ring_ref._ops import op_name
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._mpi import MPI_DTYPES, MpiRanks
from ring_ref.difftest._oracles import SavedOrder
from ring_ref.difftest._ranks import GlooRanks, JaxRanks
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
    Ranks,
)
from ring_ref.schedule import Schedule

__all__ = [
    "RANK_LAUNCHERS",
    "Options",
    "allowed_dtypes",
    "check_order_file_fits",
    "default_max_workers",
    "modes_of",
    "option_problem",
    "rank_launcher",
    "refused",
]


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
    collective: Collective = "all-reduce"
    group: object = None
    device: str = "cpu"
    framework: Framework = "torch"
    subgroups: bool = False


RANK_LAUNCHERS: Final[dict[str, Callable[[str, float, Mapping[str, str] | None], Launcher]]] = {
    "gloo": lambda target, timeout, _mca: GlooRanks(target, timeout),
    "mpi": MpiRanks,
    "jax": lambda target, timeout, _mca: JaxRanks(target, timeout),
}
"""Which launcher serves which ``--ranks`` value (``job`` and ``mpi-job`` have none: the job's ranks are
this process and its peers, :mod:`ring_ref.difftest._job`)."""


def rank_launcher(ranks: str, target: str, timeout: float, mca: Mapping[str, str] | None = None) -> Launcher:
    """The launcher that runs ``TARGET`` on every rank of a gloo group, an MPI job or a
    ``jax.distributed`` group (``mca``: ``mpirun``'s ``--mca`` options, for an MPI job only)."""
    return RANK_LAUNCHERS[ranks](target, timeout, mca)


def allowed_dtypes(ranks: Ranks | None) -> tuple[torch.dtype, ...]:
    """The dtypes a launcher takes: numpy's under MPI (no bfloat16), else all four."""
    return MPI_DTYPES if ranks in ("mpi", "mpi-job") else tuple(DTYPES.values())


def refused(options: Options) -> str | None:  # noqa: PLR0911 - one return a rule
    """The first rule ``options`` break, in words (``None``: none); ``ValueError`` for an unknown op.

    >>> refused(Options(mca={"btl": "self"}))
    "mca (--mca) options are passed to mpirun: they need ranks='mpi' (--ranks mpi); got ranks=None"
    """
    collective, ranks, framework, dtypes = (
        options.collective,
        options.ranks,
        options.framework,
        options.dtypes,
    )
    reduce_op = None if options.op is None else op_name(options.op)
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
    if dtypes is not None and (not dtypes or any(d not in TORCH_DTYPES for d in dtypes)):
        return f"dtypes must be a non-empty subset of {list(DTYPES)}; got {list(dtypes)}"
    allowed = allowed_dtypes(ranks)
    if dtypes is not None and any(d not in allowed for d in dtypes):
        return (
            f"--ranks mpi hands each rank a numpy array, and numpy has no bfloat16: choose dtypes from "
            f"{[dtype_name(d) for d in allowed]}; got {[dtype_name(d) for d in dtypes]}"
        )
    if reduce_op not in (None, "sum") and (options.schedule == "auto" or options.order is not None):
        return (
            f"--op {reduce_op} checks exact against the spec's ring or a named --schedule; --schedule auto "
            "and --order reveal and name sum orders (drop them; order-free and bound need no order)"
        )
    return _subgroups_refused(options.subgroups, ranks)


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


def default_max_workers(ranks: Ranks | None) -> int:
    """The largest ``N`` when none is given: 16 stacked, 8 on gloo ranks, 4 in MPI jobs and jax groups
    (slower to start: every process imports jax).

    >>> [default_max_workers(r) for r in (None, "gloo", "mpi", "jax")]
    [16, 8, 4, 4]
    """
    return MPI_MAX_RANKS if ranks in ("mpi", "jax") else MAX_RANKS if ranks else 16


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


def check_order_file_fits(
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
