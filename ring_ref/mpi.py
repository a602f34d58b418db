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
:mod:`ring_ref._ranks._rules`) and condenses kind, dtype, shape and verdict into a
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

from __future__ import annotations  # noqa: I001 (the block keeps the API page's order, below)

import warnings
from typing import TYPE_CHECKING, Any

# In the order of the API page (mkdocstrings lists re-exported names as they are imported).
from ring_ref._ranks._mpi import (
    OPENMPI_ALLREDUCE_ALGORITHMS,
    ring_all_reduce_,
    ring_reduce_scatter_,
    ring_all_gather_,
    openmpi_allreduce_mca,
)

if TYPE_CHECKING:
    import numpy.typing as npt
    from mpi4py import MPI

    from ring_ref.schedule import Schedule

__all__ = [
    "OPENMPI_ALLREDUCE_ALGORITHMS",
    "openmpi_allreduce_mca",
    "ring_all_gather_",
    "ring_all_reduce_",
    "ring_allreduce_",
    "ring_reduce_scatter_",
]


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
