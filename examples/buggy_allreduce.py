"""A user's ring all-reduce with a classic bug, for ``make demo`` and the README.

It runs both phases on per-worker buffer copies, but its all-gather *adds* the
received chunk instead of copying it, so some contributions are counted twice.
Try::

    ring-ref difftest examples/buggy_allreduce.py:ring_all_reduce --examples 50

The tester reports ``double-counted`` with a minimal counterexample.
"""

from __future__ import annotations

import torch


def ring_all_reduce(worker_tensors: torch.Tensor) -> torch.Tensor:
    """Sum over axis 0 with a ring (buggy: all-gather adds instead of copying)."""
    n = worker_tensors.shape[0]
    buffers = [list(worker_tensors[i].clone().chunk(n)) for i in range(n)]
    for r in range(n - 1):  # reduce-scatter: add what the left neighbour sends
        sent = [(i, (i - r) % n, buffers[i][(i - r) % n].clone()) for i in range(n)]
        for i, c, data in sent:
            buffers[(i + 1) % n][c] = buffers[(i + 1) % n][c] + data
    for r in range(n - 1):  # all-gather: should copy the finished chunk
        sent = [(i, (i + 1 - r) % n, buffers[i][(i + 1 - r) % n].clone()) for i in range(n)]
        for i, c, data in sent:
            buffers[(i + 1) % n][c] = buffers[(i + 1) % n][c] + data  # BUG: should be `= data`
    return torch.cat(buffers[0])
