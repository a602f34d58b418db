"""``ring_all_reduce`` for ``torch.Tensor`` inputs, on top of :mod:`ring_ref.core`.

The input is split into chunk *views* (:mod:`ring_ref._chunks`; nothing is
copied or written); every reduce-scatter addition is one ``torch.add`` in the
input dtype on the input's device, so autograd history is kept; the result is
a new tensor (``torch.cat`` of worker 0's final chunks) that never shares
storage with the input.  Bad input is rejected by :mod:`ring_ref._validate`.

>>> import torch
>>> ring_all_reduce(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
"""

from __future__ import annotations

import torch

from ring_ref._chunks import chunk_views
from ring_ref._cost import warn_if_slow
from ring_ref._ops import Op, finish_torch, torch_combine
from ring_ref._validate import check_torch
from ring_ref.core import initial_state, run_ring
from ring_ref.invariants import State

__all__ = ["chunk_state", "ring_all_reduce"]


def chunk_state(worker_tensors: torch.Tensor) -> State[torch.Tensor]:
    """Split each worker's tensor into ``N`` views of ``M / N`` rows (clause ``chunk-layout``)."""
    n = worker_tensors.shape[0]
    return initial_state([chunk_views(worker_tensors[i], n) for i in range(n)])


def ring_all_reduce(worker_tensors: torch.Tensor, op: Op = "sum") -> torch.Tensor:
    """Reduce ``(N, M, ...)`` over the worker axis with the spec's ring; return worker 0's ``(M, ...)``."""
    n, _ = check_torch(worker_tensors)
    warn_if_slow(n)
    final = run_ring(chunk_state(worker_tensors), torch_combine(op))
    return finish_torch(op, torch.cat(final[0]), n)
