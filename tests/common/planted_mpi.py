"""Per-rank ``mpi4py`` ring all-reduces with one planted bug each, as homework gets them wrong.

Each is a per-rank target ``fn(comm, array)`` (``ring-ref difftest --ranks mpi``):
it reduces this rank's own ``numpy`` array in place and returns ``None``.
They share one plain ring, written here from the textbook description (not
from ``ring_ref``), and each changes one line of it.  ``EXPECTED`` maps each
to the diagnosis code the tester must give it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


def _ring(
    comm: Any,
    array: Array,
    *,
    blocking_sends: bool = False,
    gather_adds: bool = False,
    shift: int = 0,
    loses_on: Callable[[int], bool] = lambda rank: False,
) -> None:
    """Reduce-scatter then all-gather over ``comm``; chunk ``c`` folds ranks ``c, c+1, ...``.

    ``blocking_sends``: every rank sends with a synchronous ``Ssend`` before it
    receives (no rank ever receives first: a deadlock).  ``gather_adds``: the
    all-gather adds what it receives instead of copying it.  ``shift``: the
    all-gather stores what it receives ``shift`` chunks too far.  ``loses_on(rank)``: that rank's
    all-gather drops the chunk it receives last.
    """
    n, rank = comm.Get_size(), comm.Get_rank()
    if n == 1:
        return
    flat = array.reshape(-1)
    size = flat.size // n
    chunks = [flat[c * size : (c + 1) * size] for c in range(n)]
    right, left = (rank + 1) % n, (rank - 1) % n
    incoming = np.empty_like(chunks[0])
    for step in range(n - 1):  # reduce-scatter
        send, recv = (rank - step) % n, (rank - step - 1) % n
        _exchange(comm, chunks[send], incoming, right, left, blocking=blocking_sends)
        chunks[recv] += incoming
    for step in range(n - 1):  # all-gather
        send, recv = (rank + 1 - step) % n, (rank - step) % n
        _exchange(comm, chunks[send], incoming, right, left, blocking=blocking_sends)
        if gather_adds:
            chunks[recv] += incoming
        elif not (step == n - 2 and loses_on(rank)):
            chunks[(recv + shift) % n][...] = incoming


def _exchange(comm: Any, out: Array, into: Array, right: int, left: int, *, blocking: bool) -> None:
    """Send ``out`` right, receive ``into`` from the left, as bytes (MPI has no float16 type)."""
    if blocking:
        comm.Ssend(out.view(np.uint8), dest=right)
        comm.Recv(into.view(np.uint8), source=left)
    else:
        comm.Sendrecv(out.view(np.uint8), dest=right, recvbuf=into.view(np.uint8), source=left)


def plain_ring(comm: Any, array: Array) -> None:
    """The ring without a bug: the spec's fold, bit for bit."""
    _ring(comm, array)


def send_send_deadlock(comm: Any, array: Array) -> None:
    """Every rank sends first with a blocking synchronous send: nobody receives (``timed-out``)."""
    _ring(comm, array, blocking_sends=True)


def gather_adds(comm: Any, array: Array) -> None:
    """The all-gather adds instead of copying (``double-counted``)."""
    _ring(comm, array, gather_adds=True)


def chunk_off_by_one(comm: Any, array: Array) -> None:
    """The all-gather stores each chunk one slot too far; one slot keeps a partial sum (``out-of-bound``)."""
    _ring(comm, array, shift=1)


def gather_drops_last_chunk(comm: Any, array: Array) -> None:
    """Every rank's all-gather drops the last chunk it receives (``out-of-bound``, the lost worker named,
    as for the same ring stacked)."""
    _ring(comm, array, loses_on=lambda rank: True)


def rank_1_raises(comm: Any, array: Array) -> None:
    """Rank 1 raises before sending; the others block in a receive from it (``raised``, rank 1 named,
    after the grace, not the time limit)."""
    if comm.Get_rank() == 1:
        raise RuntimeError("planted: rank 1 gives up")
    if comm.Get_size() > 1:
        comm.Recv(np.empty(1, dtype=np.uint8), source=1)


def exits_mid_call(comm: Any, array: Array) -> None:
    """Rank 1 ends its process with status 3 while the others are in the ring, waiting for it
    (``crashed``, rank 1 named; ``mpirun`` then ends the job)."""
    if comm.Get_rank() == 1:
        os._exit(3)
    _ring(comm, array)


def never_returns(comm: Any, array: Array) -> None:
    """Every rank sleeps in the call for an hour (``timed-out`` at any ``N``, one rank included; not in
    :data:`EXPECTED`, whose bugs the multi-rank tests run)."""
    time.sleep(3600)


EXPECTED: dict[str, str] = {
    "send_send_deadlock": "timed-out",
    "gather_adds": "double-counted",
    "chunk_off_by_one": "out-of-bound",
    "gather_drops_last_chunk": "out-of-bound",
    "rank_1_raises": "raised",
    "exits_mid_call": "crashed",
}
"""Each planted bug's name (``tests.common.planted_mpi:NAME``) and the code it must get."""


# --collective reduce-scatter / all-gather: TARGET(comm, sendbuf, recvbuf), as comm.Reduce_scatter_block
# and comm.Allgather take them.  Every rank's buffer travels as bytes (MPI has no float16 type).


def _gathered(comm: Any, sendbuf: Array) -> Array:
    """Every rank's ``sendbuf``, stacked in rank order (one ``Allgather`` of the bytes)."""
    out = np.empty((comm.Get_size(), *sendbuf.shape), dtype=sendbuf.dtype)
    comm.Allgather(np.ascontiguousarray(sendbuf).view(np.uint8), out.view(np.uint8))
    return out


def _fold_shard(comm: Any, sendbuf: Array, recvbuf: Array, chunk: int) -> None:
    """``recvbuf`` := chunk ``chunk`` of the sum, folded left in the order ``chunk + 1, chunk + 2, ...,
    chunk`` (the spec's reduce-scatter ring), every addition rounded to the dtype."""
    n = comm.Get_size()
    rows = sendbuf.shape[0] // n
    stacked = _gathered(comm, sendbuf)[:, chunk * rows : (chunk + 1) * rows]
    total = stacked[(chunk + 1) % n].copy()
    for j in range(2, n + 1):
        total = total + stacked[(chunk + j) % n]
    recvbuf[...] = total


def reduce_scatter_folded(comm: Any, sendbuf: Array, recvbuf: Array) -> None:
    """A correct reduce-scatter in the spec's reduce-scatter ring order (passes every mode)."""
    _fold_shard(comm, sendbuf, recvbuf, comm.Get_rank())


def reduce_scatter_next_chunk(comm: Any, sendbuf: Array, recvbuf: Array) -> None:
    """Bug: rank r keeps chunk r + 1 of the sum (``wrong-shard``)."""
    _fold_shard(comm, sendbuf, recvbuf, (comm.Get_rank() + 1) % comm.Get_size())


def allgather_bytes(comm: Any, sendbuf: Array, recvbuf: Array) -> None:
    """A correct all-gather of the bytes (passes)."""
    recvbuf.reshape(comm.Get_size(), *sendbuf.shape)[...] = _gathered(comm, sendbuf)


def allgather_adds_zero(comm: Any, sendbuf: Array, recvbuf: Array) -> None:
    """Bug: the gathered values go through an addition of zero: -0 ends +0 (``gather-changed-bits``)."""
    allgather_bytes(comm, sendbuf, recvbuf)
    recvbuf += 0.0


def allgather_reversed(comm: Any, sendbuf: Array, recvbuf: Array) -> None:
    """Bug: rank r's shard lands in slot N - 1 - r (``gather-misplaced``)."""
    recvbuf.reshape(comm.Get_size(), *sendbuf.shape)[...] = _gathered(comm, sendbuf)[::-1]


COLLECTIVE_EXPECTED: dict[str, tuple[str, str | None]] = {
    "reduce_scatter_folded": ("reduce-scatter", None),
    "reduce_scatter_next_chunk": ("reduce-scatter", "wrong-shard"),
    "allgather_bytes": ("all-gather", None),
    "allgather_adds_zero": ("all-gather", "gather-changed-bits"),
    "allgather_reversed": ("all-gather", "gather-misplaced"),
}
"""Each reduce-scatter / all-gather target's name, its ``--collective`` and its code (``None``: passes)."""


def openmpi_reduce_scatter_block(comm: Any, sendbuf: Array, recvbuf: Array) -> None:
    """OpenMPI's own ``MPI_Reduce_scatter_block`` (a finding, not a bug: see testing-collectives.md)."""
    comm.Reduce_scatter_block(sendbuf, recvbuf)


def openmpi_allgather(comm: Any, sendbuf: Array, recvbuf: Array) -> None:
    """OpenMPI's own ``MPI_Allgather`` (a finding, not a bug: docs/guide/testing-collectives.md)."""
    comm.Allgather(sendbuf, recvbuf)
