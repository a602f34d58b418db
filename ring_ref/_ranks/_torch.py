"""``ring_ref.distributed``'s collectives: the ring all-reduce, reduce-scatter and all-gather of the
ranks of a ``torch.distributed`` group (the module docstring of :mod:`ring_ref.distributed` says how).

Each call finds its group (:func:`_group_of`), checks every rank's arguments
(:func:`ring_ref._ranks._transport.check_group`, or on gloo with the first
exchange), and runs the rounds its plan (:mod:`ring_ref._ranks._plans`) calls for.
"""

import datetime
import weakref
from collections.abc import Callable
from typing import Final

import torch
import torch.distributed as dist

from ring_ref._ops import finish_torch, torch_combine_into
from ring_ref._ranks._check import Shards
from ring_ref._ranks._plans import BYTES, SCRATCH, ChainPlan, DoublingPlan, Known, Plan, pipelined, plan_call
from ring_ref._ranks._transport import (
    Waiter,
    chain_pipelined,
    chain_steps,
    check_gloo,
    check_group,
    doubling_steps,
    run_rounds,
)
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, Collective, Phase, RingSchedule, Schedule

__all__ = ["ring_all_gather_", "ring_all_reduce_", "ring_reduce_scatter_"]


_GROUPS: Final[weakref.WeakKeyDictionary[dist.ProcessGroup, tuple[int, int, str]]] = (
    weakref.WeakKeyDictionary()
)


def _group_of(
    group: dist.ProcessGroup | None, call: str = "ring_all_reduce_"
) -> tuple[dist.ProcessGroup, int, int, str]:
    """The group (default: the world), this process's rank in it, its size and its backend."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"{call} needs an initialised default process group; call "
            "torch.distributed.init_process_group(...) first (or launch with torchrun)."
        )
    group = group if group is not None else dist.group.WORLD
    if group is None:
        raise RuntimeError(f"{call}: the default process group has been destroyed.")
    known = _GROUPS.get(group) if isinstance(group, dist.ProcessGroup) else None
    if known is None:
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise ValueError(
                f"this process (global rank {dist.get_rank()}) is not a member of the given group; "
                f"only the group's ranks may call {call} with it."
            )
        known = rank, n, str(dist.get_backend(group))
        if isinstance(group, dist.ProcessGroup):
            _GROUPS[group] = known
    return (group, *known)


def ring_all_reduce_(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    op: object = "sum",
    schedule: str | Schedule = "spec",
    timeout: datetime.timedelta | None = None,
) -> torch.Tensor:
    """Sum ``tensor`` across the ranks of ``group`` in place with the spec's ring; return ``tensor``.

    ``op`` (default ``"sum"``) is any op of ``ring_ref.ring_all_reduce``, by name
    or as a ``torch.distributed.ReduceOp`` (``PRODUCT``, ``MAX``, ``MIN``,
    ``AVG``): the same ring, each rank ending with
    ``ring_all_reduce(torch.stack(inputs), op=op)``'s bits; every rank must pass
    the same op, or all raise.

    Every rank of ``group`` (default: the world) must call it with a tensor of
    the same shape ``(M, ...)``, dtype and device type, ``M`` divisible by the
    group size; chunk ``c`` is rows ``c*M/n ... (c+1)*M/n - 1``.  Afterwards
    every rank's tensor holds the same bits, those of
    ``ring_ref.ring_all_reduce(torch.stack(inputs in group-rank order))``.
    Autograd is bypassed (the data is written through ``tensor.detach()``),
    as with ``torch.distributed.all_reduce``.  Bad input raises the same
    ``TypeError``/``ValueError`` on every rank and leaves every tensor unchanged.
    Ranks named in error messages are ranks within ``group``.

    ``schedule`` (a preset name, ``"spec"``, ``"openmpi-ring"`` or ``"gloo"``, or
    a :class:`ring_ref.schedule.RingSchedule`; the same ring on every rank, or
    all raise) runs another ring of the family, every rank ending with the bits
    of ``ring_all_reduce(torch.stack(inputs), schedule=schedule, op=op)``; the
    layouts ``blocks`` and ``gloo`` accept any ``M``.  ``schedule="gloo"`` gives
    the bits of ``torch.distributed.all_reduce`` on gloo.  ``schedule="chain"``
    (spec section 15, not a ring) gives every rank the left fold over the ranks
    for any ``M``, after the same check; on gloo each segment is sent on as soon as it is
    ready (every receive posted first), elsewhere its steps run one ``batch_isend_irecv`` each.
    ``schedule="recursive-doubling"`` (not a ring either) gives every rank recursive doubling's one tree
    for any ``M`` (clause ``doubling-processes``), each step one ``batch_isend_irecv`` of whole buffers.

    ``timeout`` bounds every wait for a peer (the check before the ring, and
    each send and receive): a peer that never calls, or fails mid-ring, makes
    this rank raise ``RuntimeError`` after about ``timeout`` instead of the
    group's own timeout.  See the module docstring for what the tensor holds
    after such a failure.
    """
    group, rank, n, backend = _group_of(group)
    waiter = Waiter(rank, n, timeout)
    known = _known_or_checked(tensor, group, backend, waiter, op=op, name=schedule)
    if n == 1:  # checked: nothing to exchange
        return tensor
    data = work = flat = None
    if known.sound:  # on every rank, once the check has passed
        assert isinstance(tensor, torch.Tensor)
        data = tensor.detach() if tensor.requires_grad else tensor
        work = data if data.is_contiguous() else data.contiguous()
        flat = work if work.dim() == 1 else work.view(-1)
    _run(tensor, flat, work, known, group, waiter, backend, op=op, name=schedule)
    assert data is not None and work is not None
    if work is not data:
        data.copy_(work)
    if known.reduce_op == "avg":
        data.copy_(finish_torch(known.reduce_op, data, n))
    return tensor


def _known_or_checked(
    args: object, group: dist.ProcessGroup, backend: str, waiter: Waiter, *, op: object, name: object
) -> Known:
    """What a call's metadata decides; checked on every rank now, unless :func:`check_gloo` checks
    it with the first exchange (gloo, ``N > 1``: :func:`_run`)."""
    if pipelined(backend) and waiter.n > 1:
        return plan_call(args, waiter.rank, waiter.n, backend, op=op, name=name)
    return check_group(args, group, backend, waiter, op=op, name=name)


def _run(  # noqa: PLR0917 (the call's own state)
    args: object,
    flat: torch.Tensor | None,
    work: torch.Tensor | None,
    known: Known,
    group: dist.ProcessGroup,
    waiter: Waiter,
    backend: str,
    *,
    op: object,
    name: object,
    phase: Phase | None = None,
    fill: Callable[[], None] | None = None,
    source: torch.Tensor | None = None,
) -> None:
    """The check (on gloo, :func:`check_gloo`) and then the ring's rounds on ``flat``: both phases
    (``phase=None``, all-reduce) or one.  ``fill`` runs once the check has passed, before the
    rounds (all-gather's copy of its input into its slot); ``source`` is what this rank sends
    first when that is not yet in ``flat`` (all-gather's input).  On any failure the scratch buffers
    that a receive may still write into are dropped."""
    combine_into = None if known.reduce_op is None else torch_combine_into(known.reduce_op)
    plan = known.plan
    piped = pipelined(backend)
    slots = (
        None
        if flat is None or not isinstance(plan, Plan) or not piped
        else flat.split_with_sizes(plan.pieces)
    )
    try:
        steps = range(0)
        if isinstance(plan, Plan):
            steps = {
                None: range(len(plan.steps)),
                REDUCE_SCATTER: range(plan.rs_steps),
                ALL_GATHER: range(plan.rs_steps, len(plan.steps)),
            }[phase]
        done, lead = (
            check_gloo(
                args,
                flat,
                known,
                group,
                waiter,
                combine_into,
                op=op,
                name=name,
                first=steps.start,
                source=source,
            )
            if piped
            else (False, None)
        )
        assert plan is not None and combine_into is not None
        assert work is not None and flat is not None
        waiter.right, waiter.left = plan.right, plan.left
        if fill is not None:
            fill()
        if isinstance(plan, ChainPlan) and not done:
            if piped:
                chain_pipelined(flat, plan, group, waiter, combine_into=combine_into)
            else:
                chain_steps(flat, work, plan, group, waiter, combine_into=combine_into)
        elif isinstance(plan, DoublingPlan):
            doubling_steps(flat, work, plan, group, waiter, combine_into=combine_into)
        elif isinstance(plan, Plan) and not done:
            run_rounds(
                flat, slots, work, plan, group, waiter, combine_into=combine_into, lead=lead, steps=steps
            )
    except BaseException:
        for purpose in ("staging", "input", "output"):
            if work is not None:
                SCRATCH.forget(purpose, work)
        SCRATCH.forget("check-in", BYTES)
        SCRATCH.forget("check-out", BYTES)
        raise


def ring_reduce_scatter_(
    output: torch.Tensor,
    input: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: datetime.timedelta | None = None,
    schedule: str | RingSchedule | None = None,
    op: object = "sum",
) -> torch.Tensor:
    """Reduce ``input`` across the ranks of ``group`` with the ring's reduce-scatter; rank ``r``'s
    ``output`` gets chunk ``r`` of the reduction.  Returns ``output``.

    A deterministic drop-in for ``torch.distributed.reduce_scatter_tensor(output, input)``
    (argument order included): every rank passes an ``input`` of the same shape ``(M, ...)``,
    dtype and device type, ``M`` divisible by the group size ``n``, and an ``output`` of shape
    ``(M / n, ...)`` of the same dtype and device; chunk ``c`` is rows ``c*M/n ... (c+1)*M/n - 1``.
    Rank ``r``'s output holds the bits of ``ring_reduce_scatter(torch.stack(inputs), schedule=...,
    op=...)[r]``: the left fold of chunk ``r`` in the order ``r + d, r + 2d, ..., r`` (group
    ranks mod ``n``) of the ring's direction ``d``, every combine rounded to the dtype (spec
    section 13).  ``input`` is left unchanged (it is reduced in a private copy) and may be
    ``output``'s own memory.

    ``schedule`` (default ``None``: ``"spec"``) is resolved by
    :func:`ring_ref.schedule.reduce_scatter_ring`: a preset name takes that preset's direction
    and layout with the offset equal to the direction (so that chunk ``r`` finishes at rank
    ``r``); a :class:`ring_ref.schedule.RingSchedule` whose offset is not its direction mod ``n``
    is refused, as is a layout that does not cut ``input`` into ``n`` equal shards.  ``op`` is any
    op of :func:`ring_all_reduce_` (``"avg"`` divides each rank's finished shard once by ``n``).
    Bad input, on any rank, raises the same ``TypeError``/``ValueError`` on every rank before
    anything is written; ``timeout`` bounds every wait for a peer, as for :func:`ring_all_reduce_`
    (after a failure ``output`` is unchanged: the shard is written only at the end).
    """
    call = "ring_reduce_scatter_"
    group, rank, n, backend = _group_of(group, call)
    waiter = Waiter(rank, n, timeout, call=call)
    args = Shards(Collective.REDUCE_SCATTER, output, input)
    known = _known_or_checked(args, group, backend, waiter, op=op, name=schedule)
    work = None
    if known.sound:  # copied now: on gloo, its first chunk may travel with the check
        work = SCRATCH.get("input", input.numel(), input)
        work.view(input.shape).copy_(input.detach())
    if n > 1:
        _run(args, work, work, known, group, waiter, backend, op=op, name=schedule, phase=REDUCE_SCATTER)
        assert work is not None
        shard = work.view(input.shape).chunk(n)[rank]  # k = d: the ring finishes chunk r at rank r
    else:
        shard = input.detach()
    target = output.detach()
    target.copy_(finish_torch(known.reduce_op, shard, n) if known.reduce_op == "avg" else shard)
    return output


def ring_all_gather_(
    output: torch.Tensor,
    input: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: datetime.timedelta | None = None,
    schedule: str | RingSchedule | None = None,
) -> torch.Tensor:
    """Gather every rank's ``input`` into ``output`` with the ring's all-gather, rank ``r``'s in
    rows ``r*S ... (r+1)*S - 1``.  Returns ``output``.

    A drop-in for ``torch.distributed.all_gather_into_tensor(output, input)``: every rank passes an
    ``input`` of the same shape ``(S, ...)``, dtype and device type and an ``output`` of shape
    ``(n*S, ...)``.  Every bit is copied (NaN payloads, signed zeros, subnormals and infinities
    included: an all-gather checks no values); the schedule (resolved as for
    :func:`ring_reduce_scatter_`) only decides which round carries which shard.  ``input`` may be
    ``output``'s own slot (FSDP2 gathers in place) or any other memory.  Bad input raises the same
    exception on every rank before anything is written; ``timeout`` as for :func:`ring_all_reduce_`
    (after a failure mid-ring, ``output`` holds a mix of shards: treat it as garbage).
    """
    call = "ring_all_gather_"
    group, rank, n, backend = _group_of(group, call)
    waiter = Waiter(rank, n, timeout, call=call)
    args = Shards(Collective.ALL_GATHER, output, input)
    known = _known_or_checked(args, group, backend, waiter, op="sum", name=schedule)
    data = work = None
    if known.sound:
        data = output.detach()
        work = data.view(-1) if data.is_contiguous() else SCRATCH.get("output", data.numel(), data)

    def fill() -> None:
        """Rank ``r``'s shard into slot ``r`` (read whole first when it shares memory with the output)."""
        assert work is not None and data is not None
        slot = work.view(n, -1)[rank].view(input.shape)
        source = input.detach()
        if source.data_ptr() != slot.data_ptr() or source.stride() != slot.stride():
            if source.untyped_storage().data_ptr() == data.untyped_storage().data_ptr():
                source = source.clone()
            slot.copy_(source)

    if n > 1:
        _run(
            args,
            work,
            work,
            known,
            group,
            waiter,
            backend,
            op="sum",
            name=schedule,
            phase=ALL_GATHER,
            fill=fill,
            source=input if known.sound else None,
        )
    else:
        fill()
    assert data is not None and work is not None
    if work.data_ptr() != data.data_ptr():
        data.copy_(work.view(data.shape))
    return output
