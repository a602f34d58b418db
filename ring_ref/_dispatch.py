"""The one definition of :func:`ring_all_reduce`: dispatch to an engine and an array type.

>>> import torch
>>> ring_all_reduce(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
>>> ring_all_reduce(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), engine="fast")
tensor([4., 6.])
"""

from __future__ import annotations

from typing import Final, Literal, TypeVar, overload

import numpy as np
import numpy.typing as npt
import torch

from ring_ref import _fast, _numpy_adapter, _torch_adapter
from ring_ref._ops import op_name
from ring_ref._validate import not_an_array, schedule_of
from ring_ref.schedule import Schedule

__all__ = ["ENGINES", "Engine", "ring_all_reduce"]

Engine = Literal["reference", "fast"]
ENGINES: Final[tuple[Engine, Engine]] = ("reference", "fast")
"""``reference``: the pure-functional core, invariants asserted every round (the default).
``fast``: batched tensor operations per round, bitwise identical (:mod:`ring_ref._fast`)."""

_A = TypeVar("_A", bound=np.generic)


@overload
def ring_all_reduce(
    worker_tensors: torch.Tensor,
    engine: Engine = "reference",
    *,
    op: object = "sum",
    schedule: str | Schedule = "spec",
) -> torch.Tensor: ...
@overload
def ring_all_reduce(
    worker_tensors: npt.NDArray[_A],
    engine: Engine = "reference",
    *,
    op: object = "sum",
    schedule: str | Schedule = "spec",
) -> npt.NDArray[_A]: ...
def ring_all_reduce(
    worker_tensors: torch.Tensor | npt.NDArray[_A],
    engine: Engine = "reference",
    *,
    op: object = "sum",
    schedule: str | Schedule = "spec",
) -> torch.Tensor | npt.NDArray[_A]:
    """Ring all-reduce of ``worker_tensors`` (shape ``(N, M, ...)``); returns worker 0's ``(M, ...)`` sum.

    ``op`` is ``"sum"`` (the default), ``"prod"``, ``"max"``, ``"min"`` or ``"avg"``
    (or a ``torch.distributed.ReduceOp``): the same ring and fold order, with
    the receiver storing ``incoming * own``, the first maximum or minimum in fold
    order, or, for ``avg``, the ring's sum divided once by ``N`` (clauses ``op-*``).

    Accepts a ``torch.Tensor`` (float16, bfloat16, float32, float64; any device;
    autograd kept) or a ``numpy.ndarray`` (float16, float32, float64) and returns
    the same kind, dtype and device.  The input is never modified and the result
    never shares its storage.  See ``spec/ring_all_reduce.md``.

    ``engine="reference"`` (the default) runs the pure-functional core and asserts
    the spec's invariants after every round; ``engine="fast"`` runs the same
    additions as batched tensor operations (:mod:`ring_ref._fast`) and returns the
    same bits, orders of magnitude sooner for large ``N``.  Any other value raises
    ``ValueError`` (``unknown engine``).

    ``schedule`` picks the ring of the family (clauses ``schedule-*``): a preset
    name from :data:`PRESETS` (``"spec"``, the default, ``"openmpi-ring"``,
    ``"gloo"``) or a :class:`RingSchedule` (direction, offset, chunk layout).
    With the layouts ``blocks`` and ``gloo`` ``M`` need not be divisible by ``N``.
    Both engines run every ring of the family, with the same bits.
    ``schedule="chain"`` (a :class:`~ring_ref.schedule.ChainSchedule`, clauses
    ``chain-*``) is not a ring: a pipelined chain reduce and broadcast whose
    result is the left fold ``((x_0 + x_1) + x_2) + ...`` for every ``M``.
    """
    if engine not in ENGINES:
        raise ValueError(
            f"unknown engine {engine!r}; choose engine='reference' (the invariant-checked core, "
            "the default) or engine='fast' (batched, the same bits)."
        )
    reduce_op = op_name(op)
    ring = schedule_of(schedule)
    if isinstance(worker_tensors, torch.Tensor):
        if engine == "fast":
            return _fast.ring_all_reduce_torch(worker_tensors, ring, reduce_op)
        return _torch_adapter.reduce_torch(worker_tensors, reduce_op, ring)
    if isinstance(worker_tensors, np.ndarray):
        if engine == "fast":
            return _fast.ring_all_reduce_numpy(worker_tensors, ring, reduce_op)
        return _numpy_adapter.reduce_numpy(worker_tensors, reduce_op, ring)
    raise not_an_array(worker_tensors).error()


ring_all_reduce.__module__ = (
    "ring_ref"  # its public name: reports and replay lines say ring_ref:ring_all_reduce
)
