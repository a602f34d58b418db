"""A per-rank MLX target as users write it, planted for ``tests/nocover/test_mlx_ranks.py``.

Imported by name in each rank of ``--ranks mlx`` (never by the tester, which must not import MLX).
"""

from __future__ import annotations

import numpy as np
import torch

from ring_ref._processes._mlx import join_ring


def converts_with_mx_array(tensor: torch.Tensor) -> torch.Tensor:
    """Bug: ``mlx.core.array`` of the tensor's ``numpy`` array, which makes float32 of float64, so that a
    float64 sum is computed in float32 and only its result widened back (``narrowed-dtype``)."""
    import mlx.core as mx

    summed = mx.distributed.all_sum(mx.array(tensor.numpy()), group=join_ring())
    return torch.from_numpy(np.array(summed)).to(tensor.dtype)
