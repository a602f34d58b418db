"""``ring_all_reduce`` for ``torch.Tensor`` inputs, on top of :mod:`ring_ref.core`.

The input is split into chunk *views* (nothing is copied or written); every
reduce-scatter addition is one ``torch.add`` in the input dtype on the input's
device, so autograd history is kept; the result is a new tensor
(``torch.cat`` of worker 0's final chunks) that never shares storage with the input.

>>> import torch
>>> ring_all_reduce(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
"""

from __future__ import annotations

import torch

from ring_ref import _validate
from ring_ref.core import initial_state, run_ring

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def validate(worker_tensors: object) -> tuple[int, int]:
    """Check a torch input against the spec's bad-input table; return ``(N, M)``."""
    if not isinstance(worker_tensors, torch.Tensor):
        raise _validate.expected_type_error(worker_tensors)
    n, m = validate_structure(worker_tensors)
    validate_finite(worker_tensors)
    return n, m


def validate_structure(x: torch.Tensor) -> tuple[int, int]:
    """The ``bad-input`` checks on a tensor's metadata (layout, dtype, shape, device); return ``(N, M)``.

    They read no values, so they cost nothing however large the input; finiteness
    is :func:`validate_finite`.
    """
    if x.is_nested or x.layout != torch.strided:
        raise TypeError(
            f"worker_tensors must be a dense strided tensor; got layout {x.layout}"
            f"{' (nested)' if x.is_nested else ''}. Convert with .to_dense() first."
        )
    if x.dtype not in SUPPORTED_DTYPES:
        raise _validate.unsupported_dtype(x.dtype, "torch.float16, bfloat16, float32, float64")
    n, m = _validate.check_layout(tuple(x.shape))
    if x.device.type == "meta":
        raise ValueError("worker_tensors is on the meta device and holds no values to reduce.")
    return n, m


def validate_finite(x: torch.Tensor) -> None:
    """Raise the ``bad-input`` error naming the first NaN or infinity of ``x``, if it holds any.

    Scans one worker at a time, so the temporaries are 1/N of the input; the
    whole-input mask is built only to word the error.
    """
    x = x.detach()
    if not all(bool(torch.isfinite(x[i]).all()) for i in range(x.shape[0])):
        bad = (~torch.isfinite(x)).nonzero()
        raise _validate.non_finite(int(bad.shape[0]), [int(v) for v in bad[0]])


def chunk_state(worker_tensors: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], ...]:
    """Split each worker's tensor into ``N`` views of ``M / N`` rows (clause ``chunk-layout``)."""
    n, m = worker_tensors.shape[0], worker_tensors.shape[1]
    return initial_state([torch.split(worker_tensors[i], m // n) for i in range(n)])


def ring_all_reduce(worker_tensors: torch.Tensor) -> torch.Tensor:
    """Sum ``(N, M, ...)`` over the worker axis with the spec's ring; return worker 0's ``(M, ...)``."""
    validate(worker_tensors)
    final = run_ring(chunk_state(worker_tensors), torch.add)
    return torch.cat(final[0])
