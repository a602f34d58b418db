"""What :func:`~ring_ref.difftest.difftest` was asked (one :class:`Options` value), the rules its options
must keep together, and the one table of which launcher serves which ``--ranks`` value.

The command line and the Python API check the same rules (:func:`refused`) with the same words; the
command line turns a broken rule into exit status 2, the API into a ``ValueError``.  The value and the
rules that read no dtype live in :mod:`ring_ref.difftest._rules`, which imports no torch, so that the
command line refuses those before it imports torch; they are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

import torch

from ring_ref._dtypes import TORCH_DTYPES, dtype_name
from ring_ref._ops import op_name
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._mpi import MPI_DTYPES, MpiRanks
from ring_ref.difftest._oracles import SavedOrder
from ring_ref.difftest._ranks import GlooRanks, JaxRanks, MlxRanks
from ring_ref.difftest._rules import (
    Options,
    Spawn,
    default_max_workers,
    kinds_refused,
    modes_of,
    option_problem,
    subgroups_refused,
)
from ring_ref.difftest._vocabulary import DTYPES, Ranks

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


RANK_LAUNCHERS: Final[dict[str, Callable[[str, float, Spawn], Launcher]]] = {
    "gloo": lambda target, timeout, spawn: GlooRanks(target, timeout, spawn.env),
    "mpi": lambda target, timeout, spawn: MpiRanks(
        target, timeout, spawn.mca, env=spawn.env, mpiexec=spawn.mpiexec
    ),
    "jax": lambda target, timeout, spawn: JaxRanks(target, timeout, spawn.env),
    "mlx": lambda target, timeout, spawn: MlxRanks(target, timeout, spawn.env),
}
"""Which launcher serves which ``--ranks`` value (``job`` and ``mpi-job`` have none: the job's ranks are
this process and its peers, :mod:`ring_ref.difftest._job`)."""


def rank_launcher(
    ranks: str,
    target: str,
    timeout: float,
    mca: Mapping[str, str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    mpiexec: str | None = None,
) -> Launcher:
    """The launcher that runs ``TARGET`` on every rank of a gloo group, an MPI job, a ``jax.distributed``
    group or an MLX ring (``env``, the ranks' environment variables; for an MPI job only: ``mca``,
    ``mpirun``'s ``--mca`` options; ``mpiexec``, the launcher's path)."""
    return RANK_LAUNCHERS[ranks](target, timeout, Spawn(mca or {}, env or {}, mpiexec))


def allowed_dtypes(ranks: Ranks | None) -> tuple[torch.dtype, ...]:
    """The dtypes a launcher takes: numpy's under MPI (no bfloat16), else all four."""
    return MPI_DTYPES if ranks in ("mpi", "mpi-job") else tuple(DTYPES.values())


def refused(options: Options) -> str | None:
    """The first rule ``options`` break, in words (``None``: none); ``ValueError`` for an unknown op.

    >>> refused(Options(mca={"btl": "self"}))
    "mca (--mca) options are passed to mpirun: they need ranks='mpi' (--ranks mpi); got ranks=None"
    """
    reduce_op = None if options.op is None else op_name(options.op)
    kinds = kinds_refused(options)
    if kinds:
        return kinds
    ranks, dtypes = options.ranks, options.dtypes
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
    return subgroups_refused(options.subgroups, ranks)


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
