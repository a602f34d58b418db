"""The spec's ring all-reduce over MPI point-to-point messages (``mpi4py``).

:func:`ring_all_reduce_` is a deterministic drop-in for
``comm.Allreduce(MPI.IN_PLACE, array, op=MPI.SUM)`` when debugging numerics:
every rank of ``comm`` calls it with its own ``(M, ...)`` ``numpy`` array, and
every rank ends with the same bits, equal to
``ring_ref.ring_all_reduce(numpy.stack(inputs in rank order))``.  Rank ``i``
plays worker ``i``; each round posts one receive from the left neighbour and
one send to the right neighbour following :mod:`ring_ref.schedule` exactly
(clauses ``rs-send-chunk``, ``ag-send-chunk``), reduce-scatter storing
``incoming + slot`` (``rs-add``) only once the chunk has fully arrived
(``simultaneous-rounds``) and all-gather copying (``ag-copy-not-add``).  Chunks
travel as raw bytes (``MPI.BYTE``), so float16, which MPI has no type for, is
reduced as well as float32 and float64; the additions are ``numpy.add`` in the
array's dtype.  A C-contiguous array is reduced in place; any other layout in
a contiguous copy written back at the end.

``schedule=`` runs another ring of the family (:mod:`ring_ref.schedule`:
direction, offset, chunk layout; clause ``schedule-family``), as
``ring_all_reduce(x, schedule=...)`` does: ``"openmpi-ring"`` gives the bits of
OpenMPI's own ring ``MPI_Allreduce`` for any ``M`` (its blocks of elements),
float16 included, and ``"gloo"`` those of gloo's.

**Bad input** is rejected with the same exception on *every* rank before any
chunk is sent: each rank checks its own array (the spec's bad-input table,
:mod:`ring_ref._validate`) and condenses kind, dtype, shape and verdict into a
fixed-size signature; one small all-reduce (``MAX`` of the signature and of its
negation) tells every rank whether all are equal and clean.  Only when they are
not do the ranks exchange descriptions (``comm.allgather``) so that every rank
words the same error naming every offending rank.

**Failures.**  ``timeout`` (seconds) bounds every wait for a peer: the check
before the ring and each round.  A peer that never calls, or stops mid-ring,
then makes this rank raise ``RuntimeError`` naming the round and the
neighbours, instead of waiting forever as MPI would.  A peer *process* that
dies makes OpenMPI's ``mpirun`` abort the whole job; a launcher sees that
(:mod:`ring_ref._processes._mpi_job` reports the rank).  After a timeout the
communicator still holds the abandoned messages: abort the job
(``comm.Abort()``) rather than reuse it, and treat the array as garbage (a
receive posted before the failure may still write into it).

``mpi4py`` is imported on first call, so importing this module needs neither
``mpi4py`` nor an MPI library (``pip install 'ring-ref[mpi]'`` brings
``mpi4py``; it needs an MPI library such as OpenMPI).

    mpirun -n 4 python -c "from mpi4py import MPI; import numpy as np; \\
        from ring_ref.mpi import ring_all_reduce_; \\
        print(ring_all_reduce_(MPI.COMM_WORLD, np.full(8, MPI.COMM_WORLD.rank, np.float32)))"
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from ring_ref import schedule
from ring_ref._chunks import layout_views
from ring_ref._rank_check import (
    EXACT_DIMS,
    Description,
    Shards,
    call_key,
    code,
    problem_of,
    ring_for,
    shape_words,
    verdict,
)
from ring_ref._validate import BadInput, rank_array_problem, rank_array_shards_problem
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, ChainSchedule, Phase, RingSchedule, Schedule

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mpi4py import MPI

__all__ = [
    "OPENMPI_ALLREDUCE_ALGORITHMS",
    "openmpi_allreduce_mca",
    "ring_all_gather_",
    "ring_all_reduce_",
    "ring_allreduce_",
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
_SIGNATURE_LENGTH: Final = 5 + EXACT_DIMS + 1
_POLL_MAX_S: Final = 1e-3
_ABANDONED: Final[list[object]] = []
"""Requests (and so their buffers) of rounds abandoned after a timeout: kept alive for MPI to finish."""


def _problem(array: object, n: int, name: object, *, finite: bool = True) -> BadInput | None:
    """The table's verdict on one rank's array (or :class:`ring_ref._rank_check.Shards`)."""
    ring, bad = ring_for(array, name, n)
    if ring is None:
        return bad
    if isinstance(array, Shards):
        return rank_array_shards_problem(array.collective, array.output, array.input, n, ring, finite=finite)
    return rank_array_problem(array, n, finite=finite, divisible=ring.layout == "even")


def _schedule_key(array: object, name: object, n: int) -> str:
    """The same text on every rank for the same collective and ring (offsets taken mod ``n``)."""
    return call_key(array, ring_for(array, name, n)[0], n)


def _describe(array: object, n: int, name: object = "spec") -> Description:
    bad = _problem(array, n, name)
    problem = problem_of(bad)
    key = _schedule_key(array, name, n)
    if isinstance(array, Shards):
        array = array.input
    if not isinstance(array, np.ndarray):
        kind = type(array).__name__
        return Description(f"{kind}, schedule {key}", (kind, key), problem)
    summary = f"shape {array.shape} {array.dtype}, schedule {key}"
    return Description(summary, (array.shape, array.dtype.str, key), problem)


def _verdict(descriptions: Sequence[Description], call: str = "ring_all_reduce_") -> Exception | None:
    """The one exception every rank raises for these descriptions, or ``None`` if all is well.

    >>> _verdict([_describe(np.zeros(6), 3)] * 3) is None
    True
    >>> print(_verdict([_describe(np.zeros(6), 3), _describe([0.0], 3)]))  # doctest: +ELLIPSIS
    ring_all_reduce_ rejected the input on every rank: rank 1: expects a numpy.ndarray ...; got list.
    >>> print(_verdict([_describe(np.zeros(6), 3), _describe(np.zeros(3), 3)]))  # doctest: +ELLIPSIS
    ring_all_reduce_ rejected ...: the ranks passed different arrays (rank 0: shape (6,) float64, schedule ...
    """
    return verdict(descriptions, call=call, things="arrays", same="shape and dtype, and the same schedule")


def _signature(array: object, n: int, name: object = "spec") -> tuple[list[int], bool]:
    """This rank's fixed-size signature and whether its array is clean, at the cost of one sum.

    The signature covers the kind, dtype, shape (the first :data:`EXACT_DIMS`
    dimensions exactly, a hash of the rest) and the schedule.

    >>> a, ok = _signature(np.zeros((6, 2)), 3)
    >>> ok, a == _signature(np.ones((6, 2)), 3)[0], a == _signature(np.zeros(6), 3)[0]
    (True, True, False)
    >>> _signature(np.array([1.0, np.nan, 0.0]), 3)[1]
    False
    """
    key = code(_schedule_key(array, name, n))
    args, array = array, array.input if isinstance(array, Shards) else array
    if not isinstance(array, np.ndarray):
        return [0, code(type(array).__name__), key, *[0] * (_SIGNATURE_LENGTH - 3)], False
    words = shape_words(tuple(array.shape), array.size, exact_dims=EXACT_DIMS)
    signature = [1, code(array.dtype.str), key, *words]
    if _problem(args, n, name, finite=False) is not None:
        return signature, False
    if isinstance(args, Shards) and args.collective == ALL_GATHER:
        return signature, True  # a copy: any value
    with np.errstate(over="ignore", invalid="ignore"):
        total_finite = bool(np.isfinite(np.add.reduce(array, axis=None)))
    return signature, total_finite or _problem(args, n, name) is None


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


def _check_everywhere(comm: MPI.Comm, array: object, n: int, waiter: _Waiter, name: object = "spec") -> None:
    """Raise the same bad-input error on every rank, or return on every rank; one small all-reduce."""
    from mpi4py import MPI

    signature, clean = _signature(array, n, name)
    flags = np.array([*signature, *(-v for v in signature), 0 if clean else 1], dtype=np.int64)
    where = ": checking every rank's array before the ring"
    waiter.wait([comm.Iallreduce(MPI.IN_PLACE, flags, op=MPI.MAX)], where)
    k = len(signature)
    if flags[2 * k] == 0 and np.array_equal(flags[:k], -flags[k : 2 * k]):
        return
    error = _verdict(comm.allgather(_describe(array, n, name)), waiter.call)
    if error is not None:
        raise error


def _bytes(chunk: npt.NDArray[Any]) -> list[Any]:
    from mpi4py import MPI

    return [chunk.view(np.uint8), MPI.BYTE]


def _step(ring: Schedule, phase: schedule.Phase, rank: int, r: int, n: int) -> tuple[int | None, int | None]:
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
    (:func:`_check_everywhere`, which raises the same error on every rank otherwise)."""
    rank, n = comm.Get_rank(), comm.Get_size()
    call = "ring_all_reduce_"
    if isinstance(args, Shards):
        call = "ring_reduce_scatter_" if args.collective == REDUCE_SCATTER else "ring_all_gather_"
    waiter = _Waiter(rank, n, timeout, call=call)
    _check_everywhere(comm, args, n, waiter, schedule)
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
    rank, n, ring, waiter = _checked(comm, Shards(REDUCE_SCATTER, output, input), schedule, timeout)
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
    rank, n, ring, waiter = _checked(comm, Shards(ALL_GATHER, output, input), schedule, timeout)
    work = output if output.flags.c_contiguous else np.empty(output.shape, dtype=output.dtype)
    slot = work.reshape(n, -1)[rank]
    source = np.array(input, copy=True) if np.may_share_memory(input, work) else input
    slot[...] = source.reshape(-1)
    if n > 1:
        _ring(comm, work, rank, ring, waiter, ALL_GATHER)
    if work is not output:
        output[...] = work
    return output


def ring_allreduce_(
    comm: MPI.Comm,
    array: npt.NDArray[Any],
    *,
    timeout: float | None = None,
    schedule: str | Schedule = "spec",
) -> npt.NDArray[Any]:
    """Deprecated: the old name of :func:`ring_all_reduce_` (the same function, named like
    :func:`ring_ref.distributed.ring_all_reduce_`); warns with ``DeprecationWarning``."""
    warnings.warn(
        "ring_ref.mpi.ring_allreduce_ is renamed ring_ref.mpi.ring_all_reduce_ (the name "
        "ring_ref.distributed uses); call ring_all_reduce_ instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    return ring_all_reduce_(comm, array, timeout=timeout, schedule=schedule)


def openmpi_allreduce_mca(algorithm: int | str) -> dict[str, str]:
    """The ``--mca`` options that make OpenMPI's ``MPI_Allreduce`` run ``algorithm`` (a number or a name).

    ``coll_tuned_allreduce_algorithm`` is silently ignored without
    ``coll_tuned_use_dynamic_rules``, so both are given.  Pass them to
    ``mpirun`` (``--mca KEY VALUE`` each) or to :class:`ring_ref._processes._mpi_job.MpiRing`.

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
