"""ring-ref: the formally specified reference implementation of ring all-reduce.

>>> import torch
>>> ring_all_reduce(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
"""

from __future__ import annotations

from typing import TypeVar, overload

import numpy as np
import numpy.typing as npt
import torch

from ring_ref import numpy_adapter, torch_adapter
from ring_ref._validate import expected_type_error
from ring_ref.invariants import InvariantViolation

__all__ = ["InvariantViolation", "ring_all_reduce"]

_A = TypeVar("_A", bound=np.generic)


@overload
def ring_all_reduce(worker_tensors: torch.Tensor) -> torch.Tensor: ...
@overload
def ring_all_reduce(worker_tensors: npt.NDArray[_A]) -> npt.NDArray[_A]: ...
def ring_all_reduce(worker_tensors: torch.Tensor | npt.NDArray[_A]) -> torch.Tensor | npt.NDArray[_A]:
    """Ring all-reduce of ``worker_tensors`` (shape ``(N, M, ...)``); returns worker 0's ``(M, ...)`` sum.

    Accepts a ``torch.Tensor`` (float16, bfloat16, float32, float64; any device;
    autograd kept) or a ``numpy.ndarray`` (float16, float32, float64) and returns
    the same kind, dtype and device.  The input is never modified and the result
    never shares its storage.  See ``spec/ring_all_reduce.md``.
    """
    if isinstance(worker_tensors, torch.Tensor):
        return torch_adapter.ring_all_reduce(worker_tensors)
    if isinstance(worker_tensors, np.ndarray):
        return numpy_adapter.ring_all_reduce(worker_tensors)
    raise expected_type_error(worker_tensors)
