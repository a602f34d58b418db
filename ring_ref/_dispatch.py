"""The one definition of :func:`ring_all_reduce`, :func:`ring_reduce_scatter` and :func:`ring_all_gather`:
dispatch to an engine and an array type.

>>> import torch
>>> ring_all_reduce(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
>>> ring_all_reduce(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), engine="fast")
tensor([4., 6.])
>>> ring_reduce_scatter(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([[4.],
        [6.]])
>>> ring_all_gather(torch.tensor([[4.0], [6.0]]))
tensor([4., 6.])
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Final, Literal, TypeVar, overload

import numpy as np
import numpy.typing as npt
import torch

from ring_ref import _fast, _numpy_adapter, _torch_adapter
from ring_ref._ops import op_name
from ring_ref._validate import (
    ALL_GATHER_INPUT,
    REDUCE_SCATTER_INPUT,
    collective_input,
    not_an_array,
    schedule_of,
)
from ring_ref.schedule import Schedule, preset_schedule

if TYPE_CHECKING:
    import jax

__all__ = ["ENGINES", "Engine", "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter"]

Engine = Literal["reference", "fast"]
ENGINES: Final[tuple[Engine, Engine]] = ("reference", "fast")
"""``reference``: the pure-functional core, invariants asserted every round (the default).
``fast``: batched tensor operations per round, bitwise identical (:mod:`ring_ref._fast`)."""

_A = TypeVar("_A", bound=np.generic)


def _check_engine(engine: object) -> None:
    if engine not in ENGINES:
        raise ValueError(
            f"unknown engine {engine!r}; choose engine='reference' (the invariant-checked core, "
            "the default) or engine='fast' (batched, the same bits)."
        )


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
@overload
def ring_all_reduce(
    worker_tensors: jax.Array,
    engine: Engine = "reference",
    *,
    op: object = "sum",
    schedule: str | Schedule = "spec",
) -> jax.Array: ...
def ring_all_reduce(
    worker_tensors: torch.Tensor | npt.NDArray[_A] | jax.Array,
    engine: Engine = "reference",
    *,
    op: object = "sum",
    schedule: str | Schedule = "spec",
) -> torch.Tensor | npt.NDArray[_A] | jax.Array:
    """Ring all-reduce of ``worker_tensors`` (shape ``(N, M, ...)``); returns worker 0's ``(M, ...)`` sum.

    ``op`` is ``"sum"`` (the default), ``"prod"``, ``"max"``, ``"min"`` or ``"avg"``
    (or a ``torch.distributed.ReduceOp``): the same ring and fold order, with
    the receiver storing ``incoming * own``, the first maximum or minimum in fold
    order, or, for ``avg``, the ring's sum divided once by ``N`` (clauses ``op-*``).

    Accepts a ``torch.Tensor`` (float16, bfloat16, float32, float64; any device;
    autograd kept) or a ``numpy.ndarray`` (float16, float32, float64) and returns
    the same kind, dtype and device.  The input is never modified and the result
    never shares its storage.  See ``spec/ring_all_reduce.md``.  A ``jax.Array``
    (float16, bfloat16, float32, float64; the extra ``ring-ref[jax]``) gives a
    ``jax.Array`` on its device; ``jax.grad`` and ``jax.jit`` go through it
    (:mod:`ring_ref._jax_adapter`).

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
    A preset given by name runs what its library runs below ``N`` elements per
    worker (:data:`~ring_ref.schedule.BELOW_N`: OpenMPI's ring hands such calls to
    recursive doubling, MLX's runs the other way round; clause ``schedule-below-n``).
    """
    _check_engine(engine)
    reduce_op = op_name(op)
    ring = schedule_of(schedule)
    nested = isinstance(worker_tensors, torch.Tensor) and worker_tensors.is_nested  # no shape: refused below
    shape: tuple[int, ...] = () if nested else tuple(getattr(worker_tensors, "shape", ()))
    if isinstance(schedule, str) and len(shape) >= 2:  # a preset by name: the library's, at this size
        ring = preset_schedule(schedule, int(shape[0]), math.prod(shape[1:]))
    if isinstance(worker_tensors, torch.Tensor):
        if engine == "fast":
            return _fast.ring_all_reduce_torch(worker_tensors, reduce_op, ring)
        return _torch_adapter.reduce_torch(worker_tensors, reduce_op, ring)
    if isinstance(worker_tensors, np.ndarray):
        if engine == "fast":
            return _fast.ring_all_reduce_numpy(worker_tensors, reduce_op, ring)
        return _numpy_adapter.reduce_numpy(worker_tensors, reduce_op, ring)
    jax_module = sys.modules.get("jax")  # a jax.Array exists only once jax has been imported
    if jax_module is not None and isinstance(worker_tensors, jax_module.Array):
        from ring_ref._jax_adapter import reduce_jax  # (jax is an optional extra)

        return reduce_jax(worker_tensors, reduce_op, ring, engine)
    raise not_an_array(worker_tensors).error()


ring_all_reduce.__module__ = (
    "ring_ref"  # its public name: reports and replay lines say ring_ref:ring_all_reduce
)


@overload
def ring_reduce_scatter(
    x: torch.Tensor,
    engine: Engine = "reference",
    *,
    schedule: str | Schedule | None = None,
    op: object = "sum",
) -> torch.Tensor: ...
@overload
def ring_reduce_scatter(
    x: npt.NDArray[_A],
    engine: Engine = "reference",
    *,
    schedule: str | Schedule | None = None,
    op: object = "sum",
) -> npt.NDArray[_A]: ...
def ring_reduce_scatter(
    x: torch.Tensor | npt.NDArray[_A],
    engine: Engine = "reference",
    *,
    schedule: str | Schedule | None = None,
    op: object = "sum",
) -> torch.Tensor | npt.NDArray[_A]:
    """Ring reduce-scatter of ``x`` (``(N, M, ...)``): ``(N, M / N, ...)``, row ``r`` rank ``r``'s shard.

    Rank ``r``'s shard is chunk ``r`` (rows ``r M / N`` onwards) of the reduction,
    the convention of ``torch.distributed.reduce_scatter_tensor``,
    ``MPI_Reduce_scatter_block`` and NCCL, folded in the order of the ring that
    finishes chunk ``r`` at rank ``r``: for direction ``d``, ``r + d, r + 2d, ..., r``
    (clauses ``rsc-*``).  ``M`` must be divisible by ``N``.

    ``schedule``: ``None`` (the default) is ``"spec"``; a preset name takes that
    preset's direction and layout with offset ``k = d`` (``"spec"``: ``(+1, +1, even)``,
    ``"openmpi-ring"``: ``(+1, +1, blocks)``, ``"gloo"``: ``(-1, -1, gloo)``); a
    :class:`RingSchedule` must have ``k = d`` (mod ``N``) and a layout that cuts equal
    chunks.  ``op`` and ``engine`` as for :func:`ring_all_reduce`; dtype, device and
    autograd are kept and the input is never modified.  For the same ring,
    ``ring_all_gather(ring_reduce_scatter(x, schedule=R), schedule=R)`` is
    ``ring_all_reduce(x, schedule=R)`` bit for bit (clause ``rs-ag-theorem``).
    """
    _check_engine(engine)
    reduce_op = op_name(op)
    ring, _ = collective_input(x, schedule, REDUCE_SCATTER_INPUT)
    if isinstance(x, torch.Tensor):
        if engine == "fast":
            return _fast.ring_reduce_scatter_torch(x, reduce_op, ring)
        return _torch_adapter.reduce_scatter_torch(x, reduce_op, ring)
    assert isinstance(x, np.ndarray)
    if engine == "fast":
        return _fast.ring_reduce_scatter_numpy(x, reduce_op, ring)
    return _numpy_adapter.reduce_scatter_numpy(x, reduce_op, ring)


@overload
def ring_all_gather(
    shards: torch.Tensor, engine: Engine = "reference", *, schedule: str | Schedule | None = None
) -> torch.Tensor: ...
@overload
def ring_all_gather(
    shards: npt.NDArray[_A], engine: Engine = "reference", *, schedule: str | Schedule | None = None
) -> npt.NDArray[_A]: ...
def ring_all_gather(
    shards: torch.Tensor | npt.NDArray[_A],
    engine: Engine = "reference",
    *,
    schedule: str | Schedule | None = None,
) -> torch.Tensor | npt.NDArray[_A]:
    """Ring all-gather of ``shards`` (``(N, S, ...)``): ``(N S, ...)``, rank ``r``'s shard in slot ``r``.

    Every rank ends with every rank's shard; this returns that buffer (clauses
    ``agc-*``).  It is a copy: every bit arrives unchanged, NaN payloads, signed
    zeros, infinities and subnormals included, so non-finite values are accepted.
    ``schedule`` as for :func:`ring_reduce_scatter` (it changes which rounds carry
    which shard, not the result); dtype, device and autograd are kept and the
    input is never modified.
    """
    _check_engine(engine)
    ring, _ = collective_input(shards, schedule, ALL_GATHER_INPUT)
    if isinstance(shards, torch.Tensor):
        if engine == "fast":
            return _fast.ring_all_gather_torch(shards)
        return _torch_adapter.gather_torch(shards, ring)
    assert isinstance(shards, np.ndarray)
    if engine == "fast":
        return _fast.ring_all_gather_numpy(shards)
    return _numpy_adapter.gather_numpy(shards, ring)


ring_reduce_scatter.__module__ = "ring_ref"
ring_all_gather.__module__ = "ring_ref"
