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
from ring_ref.core import initial_state, run_ring
from ring_ref.schedule import SPEC, Schedule

__all__ = ["reduce_numpy"]

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
