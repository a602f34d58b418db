"""``ring_all_reduce`` for ``numpy.ndarray`` inputs, on top of :mod:`ring_ref.core`.

numpy has no bfloat16; float16, float32 and float64 are supported, each addition
being one ``numpy.add`` in the input dtype.  The input is only read through
views; the result is a new array (``numpy.concatenate`` of worker 0's chunks).

>>> import numpy as np
>>> ring_all_reduce(np.array([[1.0, 2.0], [3.0, 4.0]]))
array([4., 6.])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ring_ref import _validate
from ring_ref.core import initial_state, run_ring

SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

Array = npt.NDArray[Any]


def validate(worker_tensors: object) -> tuple[int, int]:
    """Check a numpy input against the spec's bad-input table; return ``(N, M)``."""
    if not isinstance(worker_tensors, np.ndarray):
        raise _validate.expected_type_error(worker_tensors)
    n, m = validate_structure(worker_tensors)
    validate_finite(worker_tensors)
    return n, m


def validate_structure(x: Array) -> tuple[int, int]:
    """The ``bad-input`` checks on an array's metadata (class, dtype, shape); return ``(N, M)``.

    They read no values; finiteness is :func:`validate_finite`.
    """
    if type(x) is not np.ndarray:
        raise TypeError(
            f"worker_tensors is a {type(x).__name__}, an ndarray subclass whose semantics (masks, "
            "matrix products) the ring cannot preserve. Pass a plain array: numpy.asarray(x) "
            "(or x.filled(...) for a masked array)."
        )
    if x.dtype not in SUPPORTED_DTYPES:
        raise _validate.unsupported_dtype(x.dtype, "numpy.float16, float32, float64")
    return _validate.check_layout(x.shape)


def validate_finite(x: Array) -> None:
    """Raise the ``bad-input`` error naming the first NaN or infinity of ``x``, if it holds any.

    Scans one worker at a time, so the temporaries are 1/N of the input; the
    whole-input mask is built only to word the error.
    """
    if not all(np.isfinite(x[i]).all() for i in range(x.shape[0])):
        bad = np.argwhere(~np.isfinite(x))
        raise _validate.non_finite(len(bad), [int(v) for v in bad[0]])


def _add(incoming: Array, own: Array) -> Array:
    # Overflow to +-inf is the correctly rounded sum (clause input-finite), not an error.
    with np.errstate(over="ignore"):
        return np.add(incoming, own)


def ring_all_reduce(worker_tensors: Array) -> Array:
    """Sum ``(N, M, ...)`` over the worker axis with the spec's ring; return worker 0's ``(M, ...)``."""
    n, _ = validate(worker_tensors)
    state = initial_state([np.split(worker_tensors[i], n) for i in range(n)])
    return np.concatenate(run_ring(state, _add)[0])
