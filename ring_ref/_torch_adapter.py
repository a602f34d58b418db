"""The reference engine for ``torch.Tensor`` inputs, on top of :mod:`ring_ref.core`.

The input is split into chunk *views* (:mod:`ring_ref._chunks`; nothing is
copied or written); every reduce-scatter addition is one ``torch.add`` in the
input dtype on the input's device, so autograd history is kept; the result is
a new tensor (``torch.cat`` of worker 0's final chunks) that never shares
storage with the input.  Bad input is rejected by :mod:`ring_ref._validate`.

>>> import torch
>>> reduce_torch(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
"""

from __future__ import annotations

import torch

from ring_ref._chunks import worker_chunks
from ring_ref._cost import warn_if_slow
from ring_ref._ops import Op, finish_torch, torch_combine
from ring_ref._validate import check_torch
from ring_ref.core import gather_state, initial_state, never_combine, run_ring
from ring_ref.invariants import State
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, SPEC, RingSchedule, Schedule

__all__ = ["chunk_state", "gather_torch", "reduce_scatter_torch", "reduce_torch"]


def chunk_state(worker_tensors: torch.Tensor, schedule: Schedule = SPEC) -> State[torch.Tensor]:
    """Split each worker's tensor into ``N`` chunks (clauses ``chunk-layout``, ``schedule-layouts``).

    ``even``: views of ``M / N`` rows.  ``blocks`` and ``gloo``: ranges of the
    worker's elements in row-major order (views when the worker's tensor is
    contiguous; otherwise ``reshape`` reads it into a new tensor, never writing the input).
    """
    return initial_state(
        worker_chunks(worker_tensors, schedule.layout, itemsize=worker_tensors.element_size())
    )


def reduce_torch(worker_tensors: torch.Tensor, op: Op = "sum", schedule: Schedule = SPEC) -> torch.Tensor:
    """Reduce ``(N, M, ...)`` over the worker axis with ``schedule``'s ring; worker 0's ``(M, ...)``."""
    n, _ = check_torch(worker_tensors, divisible=schedule.layout == "even")
    warn_if_slow(n)
    final = run_ring(chunk_state(worker_tensors, schedule), torch_combine(op), schedule=schedule)
    return finish_torch(op, torch.cat(final[0]).reshape(worker_tensors.shape[1:]), n)


def reduce_scatter_torch(x: torch.Tensor, op: Op, ring: RingSchedule) -> torch.Tensor:
    """Reduce-scatter alone (clause ``rsc-phase``): ``(N, M, ...)`` to ``(N, M / N, ...)``, row ``r``
    rank ``r``'s shard, the chunk it owns after the phase.

    ``ring`` leaves chunk ``r`` at rank ``r`` and cuts equal chunks
    (:func:`ring_ref._validate.collective_input` has checked both).
    """
    n, m = check_torch(x)
    warn_if_slow(n)
    final = run_ring(chunk_state(x, ring), torch_combine(op), schedule=ring, phases=(REDUCE_SCATTER,))
    shape = (m // n, *x.shape[2:])
    return finish_torch(
        op, torch.stack([final[r][ring.owned_chunk(r, n)].reshape(shape) for r in range(n)]), n
    )


def gather_torch(shards: torch.Tensor, ring: RingSchedule) -> torch.Tensor:
    """All-gather alone (clause ``agc-copy``): ``(N, S, ...)`` to worker 0's ``(N S, ...)``, shard ``r``
    in slot ``r``.

    Copies only: every bit of every shard, NaN payloads included, arrives unchanged.
    """
    n = shards.shape[0]
    warn_if_slow(n)
    final = run_ring(gather_state(tuple(shards)), never_combine, schedule=ring, phases=(ALL_GATHER,))
    return torch.cat(final[0])
