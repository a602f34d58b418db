"""``ring_ref.mpi``'s collectives: the ring all-reduce, reduce-scatter and all-gather over MPI
point-to-point messages (``mpi4py``, imported on first call; the module docstring of
:mod:`ring_ref.mpi` says how), and the ``--mca`` options that pick OpenMPI's own allreduce.

Each call checks every rank's array (:func:`_check_comm`, the shared check of
:mod:`ring_ref._ranks._check` over one small all-reduce) and runs the rounds
(:func:`_ring`), one receive and one send per round.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from ring_ref import schedule
from ring_ref._chunks import layout_views
from ring_ref._ranks._check import (
    ARRAYS,
    Description,
    Shards,
    array_signature,
    check_everywhere,
    describe_array,
    ring_for,
)
from ring_ref.schedule import (
    ALL_GATHER,
    REDUCE_SCATTER,
    ChainSchedule,
    Collective,
    DoublingSchedule,
    Phase,
    RingSchedule,
    Schedule,
)

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = [
    "OPENMPI_ALLREDUCE_ALGORITHMS",
    "openmpi_allreduce_mca",
    "ring_all_gather_",
    "ring_all_reduce_",
    "ring_reduce_scatter_",
]

OPENMPI_ALLREDUCE_ALGORITHMS: Final = {
    "basic_linear": 1,
    "nonoverlapping": 2,
    "recursive_doubling": 3,
    "ring": 4,
    "segmented_ring": 5,
    "rabenseifner": 6,
}
"""OpenMPI 4's ``coll_tuned_allreduce_algorithm`` values (``ompi_info --param coll tuned --level 9``)."""

_TAG: Final = 0x5249
"""The tag of every ring message; MPI keeps messages between two ranks in order, so one tag suffices."""
_POLL_MAX_S: Final = 1e-3
_ABANDONED: Final[list[object]] = []
"""Requests (and so their buffers) of rounds abandoned after a timeout: kept alive for MPI to finish."""


class _Waiter:
    """Completes requests, within ``timeout`` if given; rewords any failure with the rank and the step."""

    def __init__(self, rank: int, n: int, timeout: float | None, call: str = "ring_all_reduce_") -> None:
        self.rank, self.n, self.timeout, self.call = rank, n, timeout, call

    def wait(self, requests: list[MPI.Request], where: str) -> None:
        from mpi4py import MPI

        try:
            if self.timeout is None:
                MPI.Request.Waitall(requests)
                return
            deadline = time.monotonic() + self.timeout
            pause = 1e-5
            while not MPI.Request.Testall(requests):
                if time.monotonic() >= deadline:
                    _ABANDONED.append(requests)
                    raise RuntimeError(
                        f"{self.call}: rank {self.rank} of {self.n}{where} timed out after "
                        f"{self.timeout:g} s; a peer probably raised, stopped or did not call "
                        f"{self.call}. Abort the job (comm.Abort()) rather than reuse the communicator."
                    )
                time.sleep(pause)
                pause = min(2 * pause, _POLL_MAX_S)
        except MPI.Exception as exc:
            raise RuntimeError(f"{self.call}: rank {self.rank} of {self.n}{where} failed: {exc}") from exc


class _CommExchange:
    """:class:`ring_ref._ranks._check.Exchange` over an MPI communicator: one small all-reduce
    (``MAX`` of the signature and of its negation, and of the verdict), then ``comm.allgather``."""

    def __init__(self, comm: MPI.Comm, waiter: _Waiter) -> None:
        self.comm, self.waiter = comm, waiter

    def agree(self, signature: list[int], clean: bool) -> bool:
        from mpi4py import MPI

        flags = np.array([*signature, *(-v for v in signature), 0 if clean else 1], dtype=np.int64)
        where = ": checking every rank's array before the ring"
        self.waiter.wait([self.comm.Iallreduce(MPI.IN_PLACE, flags, op=MPI.MAX)], where)
        k = len(signature)
        return bool(flags[2 * k] == 0 and np.array_equal(flags[:k], -flags[k : 2 * k]))

    def descriptions(self, mine: Description) -> list[Description]:
        return list(self.comm.allgather(mine))


def _check_comm(comm: MPI.Comm, array: object, n: int, waiter: _Waiter, name: object = "spec") -> None:
    """Raise the same bad-input error on every rank, or return on every rank; one small all-reduce."""
    signature, clean = array_signature(array, n, name)
    exchange = _CommExchange(comm, waiter)
    check_everywhere(exchange, signature, clean, lambda: describe_array(array, n, name), ARRAYS, waiter.call)


def _bytes(chunk: npt.NDArray[Any]) -> list[Any]:
    from mpi4py import MPI

    return [chunk.view(np.uint8), MPI.BYTE]


def _doubling(
    comm: MPI.Comm, work: npt.NDArray[Any], rank: int, doubling: DoublingSchedule, waiter: _Waiter
) -> None:
    """Recursive doubling's steps on the C-contiguous ``work`` (clause ``doubling-steps``): per step the
    whole buffer to the worker that receives from this rank, from the one this rank receives from; a
    reduce step stores ``lower + upper``, the post-step copies."""
    n = comm.Get_size()
    flat = work.reshape(-1)
    staging = np.empty_like(flat)
    for phase, t in doubling.all_rounds(n):
        source = doubling.partner(phase, rank, t, n)
        dest = next((k for k in range(n) if doubling.partner(phase, k, t, n) == rank), None)
        requests = []
        if source is not None:
            into = staging if phase == schedule.REDUCE_SCATTER else flat
            requests.append(comm.Irecv(_bytes(into), source=source, tag=_TAG))
        if dest is not None:
            requests.append(comm.Isend(_bytes(flat), dest=dest, tag=_TAG))
        waiter.wait(
            requests,
            f", recursive doubling {phase} step {t}: with rank {dest} (send) and rank {source} (receive)",
        )
        if phase == schedule.REDUCE_SCATTER and source is not None:
            lower, upper = (staging, flat) if source < rank else (flat, staging)
            with np.errstate(over="ignore"):  # overflow to +-inf is the rounded sum (input-finite)
                np.add(lower, upper, out=flat)


def _step(
    ring: RingSchedule | ChainSchedule, phase: schedule.Phase, rank: int, r: int, n: int
) -> tuple[int | None, int | None]:
    """The chunk (the chain: segment) ``rank`` sends and the one it receives in round (step) ``r``."""
    if isinstance(ring, ChainSchedule):
        return ring.send_segment(phase, rank, r, n), ring.recv_segment(phase, rank, r, n)
    return ring.send_chunk(phase, rank, r, n), ring.recv_chunk(phase, rank, r, n)


def _ring(  # noqa: PLR0917 (the ring's state)
    comm: MPI.Comm,
    work: npt.NDArray[Any],
    rank: int,
    ring: Schedule,
    waiter: _Waiter,
    only: Phase | None = None,
) -> None:
    """The schedule's rounds on the C-contiguous ``work`` cut into its chunks (the chain: segments), both
    phases or ``only`` one: per round one receive and one send (the chain's steps: each only where the
    rank does not idle, clause ``chain-steps``)."""
    n = comm.Get_size()
    if isinstance(ring, DoublingSchedule):
        _doubling(comm, work, rank, ring, waiter)
        return
    chunks = layout_views(work.reshape(-1), ring.layout, n, itemsize=work.itemsize)
    right, left = ring.right(rank, n), ring.left(rank, n)
    staging = np.empty(max(len(c) for c in chunks), dtype=chunks[0].dtype)
    for phase, r in ring.all_rounds(n):
        if only not in (None, phase):
            continue
        out, inc = _step(ring, phase, rank, r, n)
        requests = []
        if inc is not None:
            slot = chunks[inc]
            incoming = staging[: len(slot)]
            into = incoming if phase == schedule.REDUCE_SCATTER else slot
            requests.append(comm.Irecv(_bytes(into), source=left, tag=_TAG))
        if out is not None:
            requests.append(comm.Isend(_bytes(chunks[out]), dest=right, tag=_TAG))
        waiter.wait(
            requests,
            f", {phase} round {r}: exchanging chunks with rank {right} (send) and rank {left} (receive)",
        )
        if phase == schedule.REDUCE_SCATTER and inc is not None:
            with np.errstate(over="ignore"):  # overflow to +-inf is the rounded sum (input-finite)
                np.add(incoming, slot, out=slot)  # incoming + own, as rs-add states


def _checked(
    comm: MPI.Comm, args: object, schedule: object, timeout: float | None
) -> tuple[int, int, Schedule, _Waiter]:
    """This rank, the size, the ring and the waiter of a call whose arguments every rank has checked
    (:func:`_check_comm`, which raises the same error on every rank otherwise)."""
    rank, n = comm.Get_rank(), comm.Get_size()
    call = "ring_all_reduce_"
    if isinstance(args, Shards):
        call = "ring_reduce_scatter_" if args.collective.scatters else "ring_all_gather_"
    waiter = _Waiter(rank, n, timeout, call=call)
    _check_comm(comm, args, n, waiter, schedule)
    ring, _ = ring_for(args, schedule, n)
    assert ring is not None
    return rank, n, ring, waiter


def ring_all_reduce_(
    comm: MPI.Comm,
    array: npt.NDArray[Any],
    *,
    timeout: float | None = None,
    schedule: str | Schedule = "spec",
) -> npt.NDArray[Any]:
    """Sum ``array`` across the ranks of ``comm`` in place with the spec's ring; return ``array``.

    Every rank must call it with a writeable ``numpy`` array of the same shape
    ``(M, ...)`` and dtype (float16, float32 or float64), ``M`` divisible by
    ``comm.Get_size()``; chunk ``c`` is rows ``c*M/n ... (c+1)*M/n - 1``.
    Afterwards every rank's array holds the bits of
    ``ring_ref.ring_all_reduce(numpy.stack(inputs in rank order))``.  Bad input
    raises the same ``TypeError``/``ValueError`` on every rank and leaves every
    array unchanged.  ``timeout`` (seconds) bounds each wait for a peer; see
    the module docstring for what a failure leaves behind.  ``schedule`` (a
    preset name or a :class:`ring_ref.schedule.RingSchedule`, the same on every
    rank) picks another ring of the family, with the bits of
    ``ring_all_reduce(stacked, schedule=schedule)``; a layout other than
    ``even`` accepts any ``M``.  ``schedule="chain"`` runs the chain (clauses
    ``chain-*``, not a ring): every rank ends with the left fold over the ranks.
    """
    rank, n, ring, waiter = _checked(comm, array, schedule, timeout)
    if n == 1:
        return array
    work = array if array.flags.c_contiguous else np.ascontiguousarray(array)
    _ring(comm, work, rank, ring, waiter)
    if work is not array:
        array[...] = work
    return array


def ring_reduce_scatter_(
    comm: MPI.Comm,
    output: npt.NDArray[Any],
    input: npt.NDArray[Any],
    *,
    timeout: float | None = None,
    schedule: str | RingSchedule | None = None,
) -> npt.NDArray[Any]:
    """Reduce-scatter ``input`` across the ranks of ``comm`` with the ring; rank ``r``'s ``output``
    gets chunk ``r`` of the sum.  Returns ``output``.

    The twin of :func:`ring_ref.distributed.ring_reduce_scatter_` (its argument order, ``output``
    first; ``MPI_Reduce_scatter_block`` takes the send buffer first) for the sum: every rank
    passes an ``input`` of the same shape ``(M, ...)`` and dtype, ``M`` divisible by the size
    ``n``, and a writeable ``output`` of shape ``(M / n, ...)``; rank ``r`` ends with chunk ``r``
    folded over the ranks ``r + d, r + 2d, ..., r``.  ``schedule`` as there
    (:func:`ring_ref.schedule.reduce_scatter_ring`); ``input`` is left unchanged.  Bad input
    raises the same exception on every rank before anything is written; ``timeout`` (seconds)
    as for :func:`ring_all_reduce_`.
    """
    rank, n, ring, waiter = _checked(
        comm, Shards(Collective.REDUCE_SCATTER, output, input), schedule, timeout
    )
    work = np.array(input, order="C", copy=True)
    if n > 1:
        _ring(comm, work, rank, ring, waiter, REDUCE_SCATTER)
    output[...] = work.reshape(n, -1)[rank].reshape(output.shape)  # k = d: chunk r finishes at rank r
    return output


def ring_all_gather_(
    comm: MPI.Comm,
    output: npt.NDArray[Any],
    input: npt.NDArray[Any],
    *,
    timeout: float | None = None,
    schedule: str | RingSchedule | None = None,
) -> npt.NDArray[Any]:
    """All-gather every rank's ``input`` into ``output`` with the ring, rank ``r``'s in rows
    ``r*S ... (r+1)*S - 1``, every bit copied (the twin of
    :func:`ring_ref.distributed.ring_all_gather_`, ``output`` first).  Returns ``output``.

    Every rank passes an ``input`` of the same shape ``(S, ...)`` and dtype and a writeable
    ``output`` of shape ``(n*S, ...)``; ``input`` may be any memory, ``output``'s own slot
    included.  Checked and timed out as :func:`ring_reduce_scatter_`.
    """
    rank, n, ring, waiter = _checked(comm, Shards(Collective.ALL_GATHER, output, input), schedule, timeout)
    work = output if output.flags.c_contiguous else np.empty(output.shape, dtype=output.dtype)
    slot = work.reshape(n, -1)[rank]
    source = np.array(input, copy=True) if np.may_share_memory(input, work) else input
    slot[...] = source.reshape(-1)
    if n > 1:
        _ring(comm, work, rank, ring, waiter, ALL_GATHER)
    if work is not output:
        output[...] = work
    return output


def openmpi_allreduce_mca(algorithm: int | str) -> dict[str, str]:
    """The ``--mca`` options that make OpenMPI's ``MPI_Allreduce`` run ``algorithm`` (a number or a name).

    ``coll_tuned_allreduce_algorithm`` is silently ignored without
    ``coll_tuned_use_dynamic_rules``, so both are given.  Pass them to
    ``mpirun`` (``--mca KEY VALUE`` each) or to :class:`ring_ref._processes._mpi_job.MpiJob`.

    >>> openmpi_allreduce_mca("ring")
    {'coll_tuned_use_dynamic_rules': '1', 'coll_tuned_allreduce_algorithm': '4'}
    """
    number = OPENMPI_ALLREDUCE_ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else algorithm
    if number not in OPENMPI_ALLREDUCE_ALGORITHMS.values():
        raise ValueError(
            f"unknown OpenMPI allreduce algorithm {algorithm!r}; choose one of "
            f"{', '.join(f'{k} ({v})' for k, v in OPENMPI_ALLREDUCE_ALGORITHMS.items())}."
        )
    return {"coll_tuned_use_dynamic_rules": "1", "coll_tuned_allreduce_algorithm": str(number)}
