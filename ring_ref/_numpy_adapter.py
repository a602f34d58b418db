"""``ring_all_reduce`` for ``numpy.ndarray`` inputs, on top of :mod:`ring_ref.core`.

numpy has no bfloat16; float16, float32 and float64 are supported, each addition
being one ``numpy.add`` in the input dtype.  The input is only read through
chunk views (:mod:`ring_ref._chunks`); the result is a new array
(``numpy.concatenate`` of worker 0's chunks).  A ``numpy.memmap`` is read as a
plain array.  Bad input is rejected by :mod:`ring_ref._validate`.

>>> import numpy as np
>>> ring_all_reduce(np.array([[1.0, 2.0], [3.0, 4.0]]))
array([4., 6.])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ring_ref._chunks import chunk_views
from ring_ref._validate import check_numpy, plain_array
from ring_ref.core import initial_state, run_ring

__all__ = ["ring_all_reduce"]

Array = npt.NDArray[Any]


def _add(incoming: Array, own: Array) -> Array:
    # Overflow to +-inf is the correctly rounded sum (clause input-finite), not an error.
    with np.errstate(over="ignore"):
        return np.add(incoming, own)


def ring_all_reduce(worker_tensors: Array) -> Array:
    """Sum ``(N, M, ...)`` over the worker axis with the spec's ring; return worker 0's ``(M, ...)``."""
    n, _ = check_numpy(worker_tensors)
    x = plain_array(worker_tensors)
    state = initial_state([chunk_views(x[i], n) for i in range(n)])
    return np.concatenate(run_ring(state, _add)[0])
