"""The reference engine for ``numpy.ndarray`` inputs, on top of :mod:`ring_ref.core`.

numpy has no bfloat16; float16, float32 and float64 are supported, each
combine (:mod:`ring_ref._ops`; ``numpy.add`` for the sum) in the input dtype.  The input is only read through
chunk views (:mod:`ring_ref._chunks`); the result is a new array
(``numpy.concatenate`` of worker 0's chunks).  A ``numpy.memmap`` is read as a
plain array.  Bad input is rejected by :mod:`ring_ref._validate`.

>>> import numpy as np
>>> reduce_numpy(np.array([[1.0, 2.0], [3.0, 4.0]]))
array([4., 6.])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ring_ref._chunks import worker_chunks
from ring_ref._cost import warn_if_slow
from ring_ref._ops import Op, finish_numpy, numpy_combine
from ring_ref._validate import check_numpy, plain_array
from ring_ref.core import gather_state, initial_state, never_combine, run_ring
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, SPEC, RingSchedule, Schedule

__all__ = ["gather_numpy", "reduce_numpy", "reduce_scatter_numpy"]

Array = npt.NDArray[Any]


def reduce_numpy(worker_tensors: Array, op: Op = "sum", schedule: Schedule = SPEC) -> Array:
    """Reduce ``(N, M, ...)`` over the worker axis with ``schedule``'s ring; return worker 0's ``(M, ...)``.

    Layouts other than ``even`` cut each worker's elements in row-major order
    (clause ``schedule-layouts``), as :mod:`ring_ref._torch_adapter` does.
    """
    n, _ = check_numpy(worker_tensors, divisible=schedule.layout == "even")
    warn_if_slow(n)
    x = plain_array(worker_tensors)
    state = initial_state(worker_chunks(x, schedule.layout, itemsize=x.itemsize))
    final = np.concatenate(run_ring(state, numpy_combine(op), schedule=schedule)[0])
    return finish_numpy(op, final.reshape(x.shape[1:]), n)


def reduce_scatter_numpy(x: Array, op: Op, ring: RingSchedule) -> Array:
    """:func:`ring_ref._torch_adapter.reduce_scatter_torch` for numpy arrays."""
    n, m = check_numpy(x)
    warn_if_slow(n)
    x = plain_array(x)
    state = initial_state(worker_chunks(x, ring.layout, itemsize=x.itemsize))
    final = run_ring(state, numpy_combine(op), schedule=ring, phases=(REDUCE_SCATTER,))
    shape = (m // n, *x.shape[2:])
    return finish_numpy(op, np.stack([final[r][ring.owned_chunk(r, n)].reshape(shape) for r in range(n)]), n)


def gather_numpy(shards: Array, ring: RingSchedule) -> Array:
    """:func:`ring_ref._torch_adapter.gather_torch` for numpy arrays."""
    n = shards.shape[0]
    warn_if_slow(n)
    x = plain_array(shards)
    final = run_ring(gather_state(tuple(x)), never_combine, schedule=ring, phases=(ALL_GATHER,))
    return np.concatenate(final[0])
