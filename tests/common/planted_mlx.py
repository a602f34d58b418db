"""A per-rank MLX target as users write it, planted for ``tests/nocover/test_mlx_ranks.py``.

Imported by name in each rank of ``--ranks mlx`` (never by the tester, which must not import MLX).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from ring_ref._processes._mlx import join_ring
from ring_ref.targets import mlx_all_sum


def converts_with_mx_array(tensor: torch.Tensor) -> torch.Tensor:
    """Bug: ``mlx.core.array`` of the tensor's ``numpy`` array, which makes float32 of float64, so that a
    float64 sum is computed in float32 and only its result widened back (``narrowed-dtype``)."""
    import mlx.core as mx

    summed = mx.distributed.all_sum(mx.array(tensor.numpy()), group=join_ring())
    return torch.from_numpy(np.array(summed)).to(tensor.dtype)


def all_sum_if_told(tensor: torch.Tensor) -> torch.Tensor:
    """:func:`ring_ref.targets.mlx_all_sum` where the rank's environment holds ``RING_REF_ENV_PROBE=on``
    and MLX's own ``MLX_RING_VERBOSE=1`` (``--env``), else it raises."""
    if os.environ.get("RING_REF_ENV_PROBE") != "on" or os.environ.get("MLX_RING_VERBOSE") != "1":
        raise RuntimeError("--env did not reach this MLX rank")
    return mlx_all_sum(tensor)
