"""The ring in torch's training loops: FSDP2's custom collectives (:class:`RingReduceScatter`,
:class:`RingAllGather`) and a ``DistributedDataParallel`` communication hook (:func:`ring_hook`)."""

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, which the stubs do not export

if TYPE_CHECKING:  # importing FSDP takes about a second: the classes below implement it structurally
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatter
else:
    _AllGather = _ReduceScatter = object

from ring_ref._ranks._check import ring_of
from ring_ref._ranks._torch import ring_all_gather_, ring_all_reduce_, ring_reduce_scatter_
from ring_ref.schedule import RingSchedule, Schedule

__all__ = ["RingAllGather", "RingHookState", "RingReduceScatter", "all_reduce_flat_", "ring_hook"]


@dataclass(frozen=True)
class _RingComm:
    """What FSDP2's two comms share: the ring's ``schedule`` and ``timeout``, and ``Comm.allocate``,
    a fresh tensor (the ring keeps its own scratch buffers)."""

    schedule: str | RingSchedule | None = None
    timeout: datetime.timedelta | None = None

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """An uninitialised tensor of ``size``, ``dtype`` on ``device``, as FSDP2's default does."""
        return torch.empty(size, dtype=dtype, device=device)


@dataclass(frozen=True)
class RingReduceScatter(_RingComm, _ReduceScatter):
    """FSDP2's gradient reduce-scatter through the ring: ``set_custom_reduce_scatter(RingReduceScatter())``.

    Implements ``torch.distributed.fsdp``'s ``ReduceScatter`` protocol (``allocate`` and
    ``__call__(output_tensor, input_tensor, group, op, async_op=False)``, without importing FSDP):
    each gradient reduce-scatter runs :func:`ring_reduce_scatter_` with FSDP's ``op`` (on the CPU,
    float32 and bfloat16 gradients come with ``ReduceOp.AVG``: the ring's sum divided once by the
    group size) and this object's ``schedule`` and ``timeout``.  The ring completes before the call
    returns, so it returns ``None`` (no pending work), also when ``async_op`` is asked for.
    ``PREMUL_SUM`` (FSDP's ``set_gradient_divide_factor`` with another factor) is refused on every
    rank, as any op the ring does not run.
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: object,
        async_op: bool = False,
    ) -> None:
        """Reduce-scatter ``input_tensor`` into ``output_tensor`` over ``group`` with the ring."""
        ring_reduce_scatter_(
            output_tensor, input_tensor, group=group, op=op, schedule=self.schedule, timeout=self.timeout
        )


@dataclass(frozen=True)
class RingAllGather(_RingComm, _AllGather):
    """FSDP2's parameter all-gather through the ring: ``fsdp_module.set_custom_all_gather(RingAllGather())``.

    Implements ``torch.distributed.fsdp``'s ``AllGather`` protocol (``allocate`` and
    ``__call__(output_tensor, input_tensor, group, async_op=False)``): :func:`ring_all_gather_`,
    every bit copied (FSDP passes ``input_tensor`` as a view of ``output_tensor``'s own slot).
    Returns ``None``: the gather is complete on return.
    """

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> None:
        """All-gather ``input_tensor`` into ``output_tensor`` over ``group`` with the ring."""
        ring_all_gather_(
            output_tensor, input_tensor, group=group, schedule=self.schedule, timeout=self.timeout
        )


@dataclass(frozen=True)
class RingHookState:
    """The state :func:`ring_hook` accepts: the group to reduce over, the ring's ``timeout`` and schedule."""

    group: dist.ProcessGroup | None = None
    timeout: datetime.timedelta | None = None
    schedule: str | Schedule = "spec"


def ring_hook(
    state: RingHookState | dist.ProcessGroup | None, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """A ``DistributedDataParallel`` communication hook that sums gradients with the spec's ring.

    ``model.register_comm_hook(None, ring_hook)``: each gradient bucket is
    summed with :func:`ring_all_reduce_` over the world (or over
    ``state.group``, or over ``state`` itself if it is a process group) and
    divided by the group size, as DDP's default all-reduce averages.  With the
    spec's ring (the default), whose chunks are equal, a bucket whose length
    ``L`` is not a multiple of the group size ``n`` is summed as the
    zero-padded bucket of ``L + (-L) % n`` elements, so the bits of the
    averaged bucket are exactly ``ring_all_reduce(torch.stack(padded buckets
    in rank order))[:L] / n``.  ``RingHookState(schedule=...)`` picks another
    ring of the family; one whose layout is ``blocks`` or ``gloo`` takes any
    length, so the bucket is summed as it is, with the bits of
    ``ring_all_reduce(torch.stack(buckets), schedule=...) / n`` (no padding:
    it would move the chunk boundaries of ``blocks``, so some elements would
    fold in another order; gloo's layout needs none).  (DDP's
    built-in reduction divides *before* summing; this hook sums first, as the
    spec's ring does.)  Works with ``gradient_as_bucket_view=True`` and with
    ``no_sync()`` accumulation.  The ring runs when DDP hands over the bucket,
    and the returned future is already complete.
    """
    if isinstance(state, RingHookState):
        group, timeout, name = state.group, state.timeout, state.schedule
    else:
        group, timeout, name = state, None, "spec"
    buffer = bucket.buffer()
    all_reduce_flat_(buffer, group, op="sum", schedule=name, timeout=timeout)
    buffer.div_(dist.get_world_size(group))
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


def all_reduce_flat_(
    flat: torch.Tensor,
    group: dist.ProcessGroup | None,
    *,
    op: object,
    schedule: str | Schedule,
    timeout: datetime.timedelta | None,
) -> None:
    """:func:`ring_all_reduce_` of a 1-D contiguous tensor of any length ``L``, with the bits of the
    zero-padded tensor of ``L + (-L) % n`` elements on a ring whose layout is ``even`` and whose group
    size ``n`` does not divide ``L`` (each element is reduced on its own, so the padding changes no
    other element's bits); other rings and the chain take it as it is.

    The padded ring is run as the ring of the same direction and offset on ``ceil`` chunks of the
    unpadded tensor: ``ceil(L / n)`` elements per chunk until the tensor ends, which are the padded
    tensor's equal chunks without their zeros, so every element is in the same chunk and folds in the
    same order, with no padded copy.  Ranks whose lengths differ then pass different tensors, which
    the ring's own check refuses on every rank."""
    ring, _ = ring_of(schedule)  # a bad schedule is refused by ring_all_reduce_, on every rank
    if isinstance(ring, RingSchedule) and ring.layout == "even" and flat.numel() % dist.get_world_size(group):
        schedule = ring._replace(layout="ceil")
    ring_all_reduce_(flat, group, op=op, timeout=timeout, schedule=schedule)
