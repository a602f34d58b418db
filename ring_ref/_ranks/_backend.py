"""The ``torch.distributed`` backend ``"ring_ref"``: every reduction of a process group in one named order.

``import ring_ref.distributed`` registers it; ``dist.init_process_group("ring_ref")`` (or
``new_group(backend="ring_ref")``) then gives a :class:`RingRefProcessGroup`.  Each group
holds an inner gloo group of the same ranks: the reductions (``all_reduce``,
``reduce_scatter_tensor``, ``reduce_scatter``, ``reduce``) run the order's ring
(:func:`ring_ref._ranks._torch.ring_all_reduce_` and its reduce-scatter) over it, and the
collectives that compute nothing (broadcast, the all-gathers, all-to-all, send and receive,
the barrier) are the inner group's own.  The order is chosen once per group
(:class:`RingRefOptions`, else the environment variable :data:`ORDER_ENV`, else ``"spec"``)
and checked equal on every rank when the group is made (clause ``backend-order``).
"""

import datetime
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]  # the last is not in the stubs
    PrefixStore,
    ProcessGroupGloo,
    Store,
    _create_work_from_future,
)
from torch.distributed import distributed_c10d as _c10d

if TYPE_CHECKING:  # torch's stubs overload each collective by its C++ and its Python forms

    class _Group:
        def __init__(self, rank: int, size: int) -> None: ...

else:
    _Group = dist.ProcessGroup

from ring_ref._ops import op_name
from ring_ref._ranks._adapters import all_reduce_flat_
from ring_ref._ranks._torch import ring_reduce_scatter_
from ring_ref._ranks._transport import Waiter
from ring_ref.schedule import PRESETS, RingSchedule

__all__ = ["BACKEND", "ORDER_ENV", "RingRefOptions", "RingRefProcessGroup", "on_cpu"]

BACKEND: Final = "ring_ref"
"""The backend's name, for ``torch.distributed.init_process_group(BACKEND)``."""

ORDER_ENV: Final = "RING_REF_ORDER"
"""The environment variable that names the order (``spec``, ``chain`` or a preset) when no
:class:`RingRefOptions` is given; ``torchrun`` passes its environment to every rank."""


@dataclass(frozen=True)
class RingRefOptions:
    """The backend's options, given as ``init_process_group("ring_ref", pg_options=RingRefOptions(...))``
    or ``new_group(..., pg_options=...)``.

    ``order`` names the order every reduction of the group runs in: ``"spec"`` (the spec's
    ring), ``"chain"`` (the left fold over the ranks, the same bits at every size, position and
    bucket) or any other preset of :data:`ring_ref.schedule.PRESETS`.  ``None`` (the default)
    reads :data:`ORDER_ENV`, and ``"spec"`` where that is unset or empty.
    """

    order: str | None = None


def _order_text(options: object) -> str:
    """What this rank asks for: the options' order, else the environment's, else ``"spec"``."""
    if options is not None and not isinstance(options, RingRefOptions):
        return f"<pg_options of type {type(options).__name__}, not ring_ref.distributed.RingRefOptions>"
    order = options.order if isinstance(options, RingRefOptions) else None
    return order if order is not None else os.environ.get(ORDER_ENV, "") or "spec"


def agree_on_order(store: Store, rank: int, n: int, asked: str) -> str:
    """The group's order: every rank writes what it asks for to the group's store and reads every
    rank's; unless all ask for the same known order, every rank raises the same ``ValueError``."""
    store.set(f"order/{rank}", asked)
    orders = [store.get(f"order/{r}").decode() for r in range(n)]
    if len(set(orders)) > 1:
        listed = "; ".join(f"rank {r}: {o!r}" for r, o in enumerate(orders))
        raise ValueError(
            f"ring_ref backend: every rank of a group must choose the same order; got {listed}. Set "
            f"{ORDER_ENV} alike on every rank (torchrun passes its environment on) or pass the same "
            "RingRefOptions(order=...)."
        )
    if asked not in PRESETS:
        raise ValueError(
            f"ring_ref backend: unknown order {asked!r} (from RingRefOptions(order=...) or {ORDER_ENV}); "
            f"choose one of {', '.join(map(repr, PRESETS))}."
        )
    return asked


def _done(result: object) -> dist.Work:
    """A work that is already complete (every collective here finishes before it returns)."""
    future: torch.futures.Future[object] = torch.futures.Future()
    future.set_result(result)
    work: dist.Work = _create_work_from_future(future)
    return work


def _op_of(opts: Any) -> object:
    """The op of a collective's options by its name (as the ring's check takes it); premul-sum refused."""
    op = opts.reduceOp.op
    if op == dist.ReduceOp.RedOpType.PREMUL_SUM:  # type: ignore[attr-defined]  # not in the stubs
        raise ValueError(
            "ring_ref backend: ReduceOp.PREMUL_SUM (a sum of pre-scaled tensors) is not one of the "
            "ring's ops; scale the tensor first (tensor.mul_(factor)) and reduce with SUM, or use AVG."
        )
    try:
        return op_name(op)  # by its name, on which the ring keeps what a call's metadata decides
    except ValueError:
        return op  # not an op of the ring's: its check refuses it, on every rank


def on_cpu(*tensors: torch.Tensor) -> None:
    """Refuse a reduction of a tensor that is not on the CPU (clause ``backend-devices``): the backend's
    rings run over its gloo connections, and torch hands a Python group every device's tensors."""
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
            raise ValueError(
                f"ring_ref backend: reductions run on CPU tensors only; got a tensor on {tensor.device}. "
                "Move it to the CPU (tensor.cpu()) and back, or, for CUDA tensors in the same order, call "
                "ring_ref.distributed.ring_all_reduce_(tensor, group=...) on an NCCL group; the backend "
                "does not route CUDA tensors to NCCL."
            )


def _flat_into(target: torch.Tensor, fill: Callable[[torch.Tensor], object]) -> None:
    """``fill`` a 1-D view of ``target``'s elements, or a contiguous copy that is written back."""
    data = target.detach()
    flat = data.view(-1) if data.is_contiguous() else data.reshape(-1).clone()
    fill(flat)
    if not data.is_contiguous():
        data.copy_(flat.view(data.shape))


class RingRefProcessGroup(_Group):
    """A process group whose reductions run one named order (:mod:`ring_ref._ranks._backend`).

    Made by torch (``init_process_group("ring_ref")``, ``new_group(backend="ring_ref")``), not by
    hand.  ``order`` is the group's order; ``inner`` its gloo group of the same ranks.
    """

    def __init__(self, opts: Any, options: object) -> None:
        rank, n = int(opts.group_rank), int(opts.group_size)
        super().__init__(rank, n)
        self._rank, self._n = rank, n
        self._group_name = self._group_desc = ""
        store: Store = opts.store
        self.order = agree_on_order(store, rank, n, _order_text(options))
        self._pads = PRESETS[self.order].layout == "even"  # its all-reduce pads (backend-flat)
        self.inner = _inner_gloo(store, opts, rank, n)

    def getBackendName(self) -> str:
        """The backend's name, as ``dist.get_backend(group)`` reports it."""
        return BACKEND

    def setGroupName(self, name: str) -> None:
        """Kept, for ``group.group_name`` (the functional collectives find a group by it)."""
        self._group_name = name

    def getGroupName(self) -> str:
        """The name torch gave the group."""
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        """Kept, for ``group.group_desc``."""
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        """The description torch gave the group."""
        return self._group_desc

    def shutdown(self) -> None:
        """Release the inner gloo group with this one: ``dist.destroy_process_group(group)`` calls this
        (so does the world's, which then forgets every group itself)."""
        if self.inner in _c10d._world.pg_map:
            dist.destroy_process_group(self.inner)

    def __repr__(self) -> str:
        return f"RingRefProcessGroup(rank={self._rank}, size={self._n}, order={self.order!r})"

    # --- the reductions: the order's ring ---------------------------------------------------------

    def _all_reduce(self, tensor: torch.Tensor, op: object) -> None:
        on_cpu(tensor)
        try:
            _flat_into(
                tensor,
                lambda flat: all_reduce_flat_(flat, self.inner, op=op, schedule=self.order, timeout=None),
            )
        except (TypeError, ValueError):  # refused on every rank by the ring's check
            if self._pads:
                self._same_length(tensor)
            raise

    def _same_length(self, tensor: torch.Tensor) -> None:
        """Raise the backend's own error, the same on every rank, where the element counts differ.

        Called on every rank once the ring's check has refused a call of an order that pads
        (``backend-flat``): unequal counts are unequal unpadded tensors to that check, which this
        words as a count error (as before the padding moved into the ring's layout).  The counts
        are exchanged on this refused path only, never before a call."""
        mine = torch.tensor([tensor.numel()])
        everyone = [torch.empty_like(mine) for _ in range(self._n)]
        waiter = Waiter(self._rank, self._n, None, call="the ring_ref backend's all_reduce")
        waiter.wait(
            self.inner.allgather([everyone], [mine]), ": exchanging every rank's length after the check"
        )
        lengths = [int(length) for length in everyone]
        if len(set(lengths)) > 1:
            listed = "; ".join(f"rank {r}: {length}" for r, length in enumerate(lengths))
            raise ValueError(
                f"ring_ref backend: an all-reduce needs the same number of elements on every rank of the "
                f"group; got {listed}. Pass tensors of the same shape on every rank."
            )

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        """``all_reduce``: each tensor as the flat vector of its elements, in the group's order."""
        op = _op_of(opts)
        for tensor in tensors:
            self._all_reduce(tensor, op)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        """Coalesced all-reduce: each tensor on its own, as :meth:`allreduce`."""
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        """``reduce``: the all-reduce's bits on the root; the other ranks' tensors are left unchanged."""
        op = _op_of(opts)
        for tensor in tensors:
            work = tensor.detach().clone()
            self._all_reduce(work, op)
            if self._rank == opts.rootRank:
                tensor.detach().copy_(work)
        return _done(tensors)

    def _reduce_scatter(self, output: torch.Tensor, flat_input: torch.Tensor, op: object) -> None:
        """Rank ``r``'s ``output`` gets chunk ``r`` of the reduction of every rank's ``flat_input``.

        The ring's check compares every rank's output and input (so a rank's wrong size is an error
        on every rank); the chain and recursive doubling, which check only the inputs, check the output
        once they are done."""
        on_cpu(output, flat_input)
        if not isinstance(PRESETS[self.order], RingSchedule):  # the all-reduce, then this rank's chunk
            work = flat_input.detach().clone()
            all_reduce_flat_(work, self.inner, op=op, schedule=self.order, timeout=None)
            if output.numel() * self._n != work.numel():
                raise ValueError(
                    f"ring_ref backend: reduce-scatter needs an input of {self._n} times the output's "
                    f"{output.numel()} elements; got {work.numel()}."
                )
            _flat_into(output, lambda flat: flat.copy_(work.view(self._n, -1)[self._rank]))
            return
        source = flat_input.detach()
        _flat_into(
            output,
            lambda flat: ring_reduce_scatter_(flat, source, group=self.inner, op=op, schedule=self.order),
        )

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work:
        """``reduce_scatter_tensor``: chunk ``r`` of the flat input's reduction to rank ``r``."""
        self._reduce_scatter(output, input.detach().reshape(-1), _op_of(opts))
        return _done([output])

    _reduce_scatter_base = reduce_scatter_single  # torch's older name, which C++ callers still use

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        """Coalesced ``reduce_scatter_tensor``: each pair on its own."""
        op = _op_of(opts)
        for output, input in zip(outputs, inputs, strict=True):
            self._reduce_scatter(output, input.detach().reshape(-1), op)
        return _done(outputs)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # the older name

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any
    ) -> dist.Work:
        """``reduce_scatter`` (lists): rank ``r``'s output, every rank's ``inputs[r]`` reduced."""
        op = _op_of(opts)
        for output, pieces in zip(outputs, inputs, strict=True):
            if len(pieces) != self._n or any(p.numel() != output.numel() for p in pieces):
                raise ValueError(
                    f"ring_ref backend: reduce_scatter needs {self._n} input tensors of the output's "
                    f"{output.numel()} elements each; got {[p.numel() for p in pieces]}."
                )
            self._reduce_scatter(output, torch.cat([p.detach().reshape(-1) for p in pieces]), op)
        return _done(outputs)

    # --- data movement: the inner gloo group's own collectives -------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist.Work:
        """``broadcast``: gloo's."""
        return self.inner.broadcast(tensors, opts)

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        """``all_gather`` (lists): gloo's."""
        return self.inner.allgather(outputs, inputs, opts)

    def allgather_coalesced(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        """``all_gather_coalesced`` (lists): gloo's."""
        return self.inner.allgather_coalesced(outputs, inputs, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> dist.Work:
        """``all_gather_into_tensor``: gloo's."""
        return self.inner.all_gather_single(output, input, opts)

    _allgather_base = all_gather_single  # torch's older name

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
    ) -> dist.Work:
        """Coalesced ``all_gather_into_tensor``: gloo's."""
        return self.inner.all_gather_single_coalesced(outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced  # the older name

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        """``gather``: gloo's."""
        return self.inner.gather(outputs, inputs, opts)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any) -> dist.Work:
        """``scatter``: gloo's."""
        return self.inner.scatter(outputs, inputs, opts)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: Sequence[int],
        input_splits: Sequence[int],
        opts: Any,
    ) -> dist.Work:
        """``all_to_all_single``: gloo's."""
        return self.inner.all_to_all_single(output, input, list(output_splits), list(input_splits), opts)

    alltoall_base = all_to_all_single  # torch's older name

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any) -> dist.Work:
        """``all_to_all`` (lists): gloo's."""
        return self.inner.alltoall(outputs, inputs, opts)

    def barrier(self, opts: Any) -> dist.Work:
        """``barrier``: gloo's."""
        return self.inner.barrier(opts)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist.Work:
        """``send`` (and ``isend``): gloo's; ``dst`` is a rank of this group."""
        return self.inner.send(tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist.Work:
        """``recv`` (and ``irecv``): gloo's."""
        return self.inner.recv(tensors, src, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        """``recv`` from any rank: gloo's."""
        return self.inner.recv_anysource(tensors, tag)


def _inner_gloo(store: Store, opts: Any, rank: int, n: int) -> dist.ProcessGroup:
    """A gloo group of the same ranks, registered with ``torch.distributed`` (so that its ranks,
    backend and point-to-point sends resolve as any group's do) under the outer group's name."""
    inner_store = PrefixStore("ring_ref_gloo/", store)
    timeout: datetime.timedelta = opts.timeout
    inner = dist.ProcessGroup(inner_store, rank, n)
    gloo_type = dist.ProcessGroup.BackendType.GLOO
    inner._set_default_backend(gloo_type)
    gloo = ProcessGroupGloo(PrefixStore("cpu/", inner_store), rank, n, timeout)
    inner._register_backend(torch.device("cpu"), gloo_type, gloo)
    name = _c10d.GroupName(f"{opts.group_id}/ring_ref_gloo")
    inner._set_group_name(name)
    ranks = list(opts.global_ranks_in_group) or list(range(n))
    _c10d._register_pg_in_world(
        inner,
        backend_name="gloo",
        store=inner_store,
        group_name=name,
        backend_config="cpu:gloo",
        rank_mapping={global_rank: r for r, global_rank in enumerate(ranks)},
    )
    return inner


def _create(opts: Any, options: object) -> RingRefProcessGroup:
    """torch's creator for the backend (``extended_api``: the store, ranks, timeout and group id)."""
    return RingRefProcessGroup(opts, options)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
