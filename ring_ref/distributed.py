"""The spec's ring all-reduce on real processes, over ``torch.distributed`` messages between ring neighbours.

:func:`ring_all_reduce_` is a deterministic drop-in for
``torch.distributed.all_reduce(tensor)`` (sum) when debugging numerics: every
rank of the group calls it with its own ``(M, ...)`` tensor, and every rank
ends with the same bits, equal to ``ring_ref.ring_all_reduce(torch.stack(...))``
of the ranks' inputs in rank order.  Group rank ``i`` plays worker ``i``; each
round sends to and receives from the ring neighbours following
:mod:`ring_ref.schedule` exactly (clauses ``rs-send-chunk``, ``ag-send-chunk``),
with reduce-scatter storing ``incoming + slot`` (``rs-add``) and all-gather
copying (``ag-copy-not-add``).  A reduce-scatter chunk lands in a separate
buffer and is added into its slot only once it has fully arrived, so a value is
never forwarded in the round it arrived (``simultaneous-rounds``).

``schedule=`` runs another ring of the family (:class:`ring_ref.schedule.RingSchedule`:
direction, offset, chunk layout; clause ``schedule-family``), as
``ring_all_reduce(x, schedule=...)`` does, with that call's bits: ``"gloo"``
gives the bits of ``torch.distributed.all_reduce`` on the gloo backend,
``"openmpi-ring"`` those of OpenMPI's ring.  The layouts ``blocks`` and ``gloo``
cut the tensor's elements (row-major) and accept any ``M``; gloo's layout may
leave chunks short or empty (an empty chunk is never sent).

``schedule="chain"`` runs the chain instead (spec section 15: a pipelined chain
reduce and broadcast, not a ring), every rank ending with the left fold over the
ranks.

:func:`ring_hook` plugs the same ring into ``DistributedDataParallel``
(``model.register_comm_hook(None, ring_hook)``).

:func:`ring_reduce_scatter_` and :func:`ring_all_gather_` (torch's ``reduce_scatter_tensor`` and
``all_gather_into_tensor``, argument order included; spec section 13) run one phase each of the
same code: the rounds of that phase alone, with the same check, transports and
timeouts, on a ring that finishes chunk ``r`` at rank ``r``
(:func:`ring_ref.schedule.reduce_scatter_ring`).  :class:`RingReduceScatter` and
:class:`RingAllGather` hand them to FSDP2 (``set_custom_reduce_scatter`` / ``set_custom_all_gather``).

**Speed.**  On gloo each chunk travels in segments (at least
:data:`SEGMENT_BYTES`, or :data:`EXCHANGE_SEGMENT_BYTES` on two ranks, at most
:data:`MAX_SEGMENTS` per chunk; every chunk of a call is cut into the same
number of segments, sized by the largest chunk): as
soon as segment ``s`` of the chunk received in one round has been added into
its slot, segment ``s`` of the next round's chunk (the same slot: every round of
every ring of the family forwards the chunk it has just completed) is sent,
while the remaining segments are still arriving.  The additions that make each
element are exactly the schedule's, in the same order, so the bits do not
depend on the segment size, nor on how the segments travel:

* three or more ranks use point-to-point sends.  A gloo send waits until its
  receiver has posted the receive, so every receive is posted before the first
  send: reduce-scatter's each into its own part of a reused staging buffer
  (``N - 1`` times the largest chunk, kept per thread between calls), and
  all-gather's straight into the slot.  That cannot overwrite bytes still to be
  sent from the slot: the chunk that lands there is final, so every rank's
  contribution to it has already been received, including the one this rank
  sent from that very slot in reduce-scatter.
* two ranks (:data:`_EXCHANGE_RANKS`) run each segment of each round as one
  ``alltoall`` collective, in which each rank sends its piece to the other;
  gloo runs collectives on its own worker thread, and on a busy machine they
  took far less variable time than sends and receives driven from Python.
  Each is a trip through that thread, so two-rank segments are larger.
  Reduce-scatter receives into staging, all-gather straight into the slot.
* when no chunk is larger than :data:`LEAD_BYTES`, the first round (reduce-scatter's,
  or a lone all-gather's) travels with the check below: each rank's signature
  message to its right neighbour also carries the chunk it sends first, so that
  round costs no exchange of its own.
* two ranks reducing at most :data:`SWAP_BYTES` need no rounds at all: a
  two-rank ring's only neighbour is the other rank, and each element's result
  is one combine of the two inputs, made by the rank that receives its chunk in
  reduce-scatter (its value ``own``, the other's ``incoming``) and copied by
  all-gather.  So each rank sends its whole tensor to the other, in the same
  ``alltoall`` message as its signature for the check below, and makes every
  combine itself with those roles: the ring's combines and bits, the same bytes
  on the wire, one exchange in all instead of two (the check carrying
  reduce-scatter, then all-gather), and twice the combines, which is why larger
  tensors take the rounds.

Contiguous tensors are reduced in place; a non-contiguous one is reduced in a
contiguous copy that is written back at the end.  Other backends (NCCL) run
one ``batch_isend_irecv`` per round, unsegmented.  What a call's metadata
decides (its signature, the table's verdict but finiteness, and the index
arithmetic of chunks, segments and steps) is computed once and reused for
later calls with the same shape, strides, dtype, device, group size, rank, op
and schedule.

**Bad input** is rejected with the same exception on *every* rank, before
anything is written.  Each rank checks its own tensor (the spec's bad-input
table, :mod:`ring_ref._validate`) and condenses its shape, dtype, device type,
layout, op, schedule and verdict into a fixed-size signature; one collective
tells every rank every rank's signature: on gloo one ``alltoall`` in which
every rank sends its signature to every rank (all messages at once, where an
``allgather`` or ``allreduce`` passes them round in ``N - 1`` or more steps),
on other backends one ``allgather``; gloo is given the call's ``timeout``.  On
gloo that ``alltoall`` may also carry data (two ranks' whole tensors, or the
first reduce-scatter chunk, above): every rank receives from its two
neighbours (the only ranks any ring of the family sends to first) into room
for the most any rank sends, so a peer with another shape, dtype or ring
cannot overrun it, and the data is combined only once every signature
matches; the collective completes on every rank, so nothing is left pending
for the next call.  Only
when the signatures differ or a verdict is bad do the ranks exchange full
descriptions (``all_gather_object``) so that every rank can word the same
error naming every offending rank.  The finiteness check is a sum of the
tensor (a NaN or infinity anywhere makes it non-finite); only a non-finite sum
(bad input, or an overflowing sum of finite values) pays for the element-wise
scan.

**Failures.**  A peer that fails mid-ring or never calls makes the others raise
``RuntimeError`` naming the round (or the check before the ring) and the
neighbours, after ``timeout`` if given, else after the group's timeout
(``init_process_group(timeout=...)``; gloo's default is 30 minutes).  After a
timeout the group's connections to that peer are closed: destroy the group
and start a new one.  **What the tensor holds after a failure:** a contiguous
tensor is reduced in place, so after a failure mid-ring its elements are a mix
of inputs, partial sums and final sums, an element being received at that
moment may hold a mixture of old and new bytes, and a receive posted before
the failure may still write into it until the group is destroyed; treat it as
garbage (recompute it); nothing is written before the check's exchange is
complete, so a failure there (and in a two-rank swap, whose only exchange it
is) leaves it unchanged.  A non-contiguous
tensor is reduced in a private copy and is left unchanged.  Bad input never
modifies anything.
"""

import datetime
import functools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, which the stubs do not export

if TYPE_CHECKING:  # importing FSDP takes about a second: the classes below implement it structurally
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGather
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatter
else:
    _AllGather = _ReduceScatter = object

from ring_ref._chunks import chunk_bounds
from ring_ref._ops import COMMUTING_OPS, Op, finish_torch, op_name, torch_combine_into
from ring_ref._rank_check import (
    EXACT_DIMS,
    SHARDS_KEYS,
    Description,
    Shards,
    call_key,
    code,
    problem_of,
    ring_for,
    ring_of,
    schedule_key,
    shape_words,
    verdict,
)
from ring_ref._validate import BadInput, rank_shards_problem, rank_tensor_problem
from ring_ref.schedule import (
    ALL_GATHER,
    REDUCE_SCATTER,
    SPEC,
    ChainSchedule,
    Phase,
    RingSchedule,
    Schedule,
    all_rounds,
    rounds_per_phase,
)

__all__ = [
    "EXCHANGE_SEGMENT_BYTES",
    "LEAD_BYTES",
    "MAX_SEGMENTS",
    "SEGMENT_BYTES",
    "SWAP_BYTES",
    "RingAllGather",
    "RingHookState",
    "RingReduceScatter",
    "ring_all_gather_",
    "ring_all_reduce_",
    "ring_hook",
    "ring_reduce_scatter_",
]

SEGMENT_BYTES: Final = 1 << 20
"""Smallest piece a chunk travels in on gloo point-to-point rounds; a chunk no larger than this
goes whole."""
EXCHANGE_SEGMENT_BYTES: Final = 8 << 20
"""Smallest piece a chunk travels in on two-rank gloo rounds (``alltoall`` collectives, each a trip
through gloo's worker thread: on two ranks of a busy 2-core host, cutting 2 MiB chunks in two
made a call about a fifth slower)."""
MAX_SEGMENTS: Final = 4
"""Most pieces per chunk: each send and receive costs a wake-up, dear on a busy machine."""

_PIPELINED_BACKENDS: Final = frozenset({"gloo"})
SWAP_BYTES: Final = 1 << 20
"""Two-rank gloo calls of at most this many bytes swap whole tensors with their signatures
(:func:`_check_gloo`) instead of running the two rounds: one exchange instead of two, and twice
the combines (every element's on both ranks), which pays below about this size and costs above
it.  Every gloo call receives its neighbours' signatures into room for this many bytes more (or
:data:`LEAD_BYTES`, the larger), so it must be the same on every rank (as must every tuning
constant here)."""
LEAD_BYTES: Final = 1 << 20
"""gloo calls that run the rounds send the chunk of their first round (reduce-scatter's; a lone
all-gather's, its input) with their signature when no chunk is larger than this
(:attr:`_Plan.lead`): that round then costs no exchange of its own.  Larger chunks travel after
the check."""
_EXCHANGE_RANKS: Final = 2
"""gloo groups of at most this many ranks run every round as ``alltoall`` collectives.

gloo runs a collective on its own worker thread; point-to-point sends and waits run on the
calling (Python) thread.  Measured on two ranks of a busy 2-core host, the collective's time
varied far less than the two-message exchange's (a tenth of the exchanges took several ms), so
two ranks exchange through it.  gloo's ``alltoall`` also sends an empty message to every other
rank, so from three ranks on the ring's point-to-point sends are cheaper.  (The check before the
ring is one ``alltoall`` for every group size: there every rank does send to every rank.)"""
"""Signature entries that hold the leading dimensions exactly; further ones are folded into a hash."""
_SIGNATURE_LENGTH: Final = 6 + EXACT_DIMS + 3
"""Entries of a signature (17); with the verdict and padding a row of the check (:data:`_ROW_WORDS`)."""
_ROW_WORDS: Final = -(-(_SIGNATURE_LENGTH + 1) // 8) * 8
"""``int64`` words in a row of the check (24, 192 bytes): the signature, the verdict, then zeros to a
multiple of 64 bytes.  Data follows rows in the check's buffers (:func:`_check_gloo`), so a row's
bytes must stay a multiple of every accepted dtype's size (8 at most); at a multiple of 64 the
data starts on a cache line (copying 1 MiB to 144 bytes past one took about 40 % longer here)."""


def _op_problem(op: object) -> tuple[Op | None, BadInput | None]:
    """The op by its name, or the table's error for one that is not an op."""
    try:
        return op_name(op), None
    except ValueError as exc:
        return None, BadInput(ValueError, str(exc))


def _problem(tensor: object, n: int, backend: str, ring: Schedule, *, finite: bool = True) -> BadInput | None:
    """The table's verdict on one rank's tensor (or :class:`Shards`) for ``ring`` (only ``even`` needs
    ``N`` to divide ``M``)."""
    if isinstance(tensor, Shards):
        return rank_shards_problem(
            tensor.collective, tensor.output, tensor.input, n, backend, ring, finite=finite
        )
    return rank_tensor_problem(tensor, n, backend, finite=finite, divisible=ring.layout == "even")


def _describe(tensor: object, n: int, backend: str, op: object = "sum", name: object = "spec") -> Description:
    """Check one rank's arguments on their own; the verdict is applied on every rank after the exchange."""
    reduce_op, op_bad = _op_problem(op)
    ring, ring_bad = ring_for(tensor, name, n)
    bad = ring_bad or (None if ring is None else _problem(tensor, n, backend, ring)) or op_bad
    problem = problem_of(bad)
    key = call_key(tensor, ring, n)
    if isinstance(tensor, Shards):
        tensor = tensor.input
    if not isinstance(tensor, torch.Tensor):
        kind = type(tensor).__name__
        return Description(kind, (kind, key), problem)
    shape = tuple(tensor.shape)
    summary = f"shape {shape} {tensor.dtype} on {tensor.device.type}"
    if reduce_op != "sum":
        summary += f", op {reduce_op or op!r}"
    if key != schedule_key(SPEC, n):
        summary += f", {'' if key.startswith(SHARDS_KEYS) else 'schedule '}{key}"
    signature = (shape, str(tensor.dtype), tensor.device.type, reduce_op, key)
    return Description(summary, signature, problem)


def _verdict(descriptions: list[Description], call: str = "ring_all_reduce_") -> Exception | None:
    """The one exception every rank raises for this set of descriptions, or ``None`` if all is well.

    >>> _verdict([_describe(torch.zeros(6), 3, "gloo")] * 3) is None
    True
    >>> bad = _verdict([_describe(torch.zeros(6), 3, "gloo"), _describe([0.0], 3, "gloo")])
    >>> print(bad)  # doctest: +ELLIPSIS
    ring_all_reduce_ rejected the input on every rank: rank 1: expects a torch.Tensor ...; got list.
    >>> print(_verdict([_describe(torch.zeros(6), 3, "gloo", name=s) for s in ("spec", "gloo")]))
    ... # doctest: +ELLIPSIS
    ring_all_reduce_ rejected ... (rank 0: ... on cpu; rank 1: ... cpu, schedule direction -1, offset 2, ...
    """
    return verdict(
        descriptions,
        call=call,
        things="tensors, ops or schedules",
        same="shape, dtype and device type, the same op and the same schedule",
    )


def _metadata(
    tensor: object, n: int, backend: str, op: object = "sum", name: object = "spec"
) -> tuple[list[int], bool]:
    """This rank's fixed-size signature, and whether its arguments pass every row of the table but
    finiteness (which reads the values; :func:`_signature` adds it)."""
    reduce_op, op_bad = _op_problem(op)
    ring, _ = ring_for(tensor, name, n)
    key = code(call_key(tensor, ring, n))
    args, tensor = tensor, tensor.input if isinstance(tensor, Shards) else tensor
    if not isinstance(tensor, torch.Tensor) or tensor.is_nested or op_bad or ring is None:
        return [0, code(type(tensor).__name__), key, *[0] * (_SIGNATURE_LENGTH - 3)], False
    signature = [
        1,
        code(str(tensor.dtype)),
        code(tensor.device.type),
        code(str(tensor.layout)),
        *shape_words(tuple(tensor.shape), tensor.numel(), exact_dims=EXACT_DIMS),
        code(str(reduce_op)),
        key,
    ]
    return signature, _problem(args, n, backend, ring, finite=False) is None


def _finite(tensor: "torch.Tensor | Shards", n: int, backend: str, ring: Schedule) -> bool:
    """Whether every value of a tensor that passed the other rows is finite, at the cost of one sum.

    A NaN or infinity anywhere makes the sum non-finite; only then (or when finite
    values overflow the sum) are the elements scanned.  An all-gather copies any value.
    """
    if isinstance(tensor, Shards) and tensor.collective == ALL_GATHER:
        return True
    values = tensor.input if isinstance(tensor, Shards) else tensor
    assert isinstance(values, torch.Tensor)
    total = (values.detach() if values.requires_grad else values).sum().item()
    return math.isfinite(total) or _problem(tensor, n, backend, ring) is None


def _signature(
    tensor: object, n: int, backend: str, op: object = "sum", name: object = "spec"
) -> tuple[list[int], bool]:
    """This rank's fixed-size signature and whether its arguments are clean, at the cost of one sum.

    Equal signatures mean equal kind, dtype, device type, layout and shape
    (exactly for up to :data:`EXACT_DIMS` dimensions, by a 61-bit hash of
    the rest beyond), op and ring (offsets taken mod ``n``).

    >>> a, ok = _signature(torch.zeros(6, 2), 3, "gloo")
    >>> ok, a == _signature(torch.ones(6, 2), 3, "gloo")[0], a == _signature(torch.zeros(6), 3, "gloo")[0]
    (True, True, False)
    >>> _signature(torch.tensor([1.0, float("nan"), 0.0]), 3, "gloo")[1]
    False
    >>> a == _signature(torch.zeros(6, 2), 3, "gloo", name=RingSchedule(1, 3, "even"))[0]
    True
    >>> a == _signature(torch.zeros(6, 2), 3, "gloo", name="openmpi-ring")[0]
    False
    """
    signature, sound = _metadata(tensor, n, backend, op, name)
    if not sound:
        return signature, False
    ring, _ = ring_for(tensor, name, n)
    assert isinstance(tensor, (torch.Tensor, Shards)) and ring is not None
    return signature, _finite(tensor, n, backend, ring)


class _Known(NamedTuple):
    """What the metadata of a call decides, kept for the next call with the same metadata."""

    signature: list[int]
    sound: bool
    """Every row of the table but finiteness passes."""
    flags: torch.Tensor | None
    """The clean rank's contribution to the check (:func:`_flags`; ``None`` for NCCL)."""
    ring: Schedule | None
    """The ring (offset taken mod ``n``) or the chain, when ``sound``."""
    reduce_op: Op | None
    plan: "_Plan | _ChainPlan | None"
    """The ring's (or the chain's) steps for this rank, when ``sound`` and ``n > 1``."""


_KNOWN: Final[dict[tuple[object, ...], _Known]] = {}
_KNOWN_MAX: Final = 256
_EXACT_FIELDS: Final = (int, int, str)


def _known_key(
    tensor: object, rank: int, n: int, backend: str, *, op: object, name: object
) -> tuple[object, ...] | None:
    """The key of a call's metadata, or ``None`` when it cannot be told apart by equality alone.

    Only dense tensors with a ``str`` op and a preset name (or ``None``), or a ``RingSchedule``
    of exactly ``int``, ``int``, ``str`` fields, qualify (``1.0 == 1`` and
    ``True == 1``, but the table refuses those fields).  The tuning constants and the
    backends that pipeline are part of the key (the plan and the check's row depend on them).
    A reduce-scatter's or all-gather's key holds both tensors' metadata.
    """
    pair: tuple[object, ...] = ()
    if isinstance(tensor, Shards):
        output = tensor.output
        if not isinstance(output, torch.Tensor) or output.is_nested or output.layout != torch.strided:
            return None
        pair = (tensor.collective, output.shape, output.stride(), output.dtype, output.device)
        tensor = tensor.input
    if not isinstance(tensor, torch.Tensor) or tensor.is_nested or tensor.layout != torch.strided:
        return None
    if type(op) is not str:
        return None
    if (
        name is not None
        and type(name) is not str
        and not (
            type(name) is RingSchedule and all(type(v) is t for v, t in zip(name, _EXACT_FIELDS, strict=True))
        )
    ):
        return None
    tuning = (*_tuning(), _PIPELINED_BACKENDS)
    return (
        tensor.shape,
        tensor.stride(),
        tensor.dtype,
        tensor.device,
        rank,
        n,
        backend,
        op,
        name,
        tuning,
        *pair,
    )


def _tuning(args: object = None) -> tuple[int, int, int, int, int, int]:
    """The tuning constants :func:`_plan` takes, read when called (tests replace them).

    A reduce-scatter or an all-gather never swaps whole tensors (each rank makes only its own
    shard's combines); both send their first round with the check, as an all-reduce does.
    """
    swap = -1 if isinstance(args, Shards) else SWAP_BYTES
    return SEGMENT_BYTES, EXCHANGE_SEGMENT_BYTES, MAX_SEGMENTS, swap, LEAD_BYTES, _EXCHANGE_RANKS


def _buffer_size(args: object) -> tuple[int, int]:
    """Elements and element size of the buffer the ring runs on: the tensor reduced, a
    reduce-scatter's input (copied), an all-gather's output."""
    tensor = args
    if isinstance(args, Shards):
        tensor = args.input if args.collective == REDUCE_SCATTER else args.output
    assert isinstance(tensor, torch.Tensor)
    return tensor.numel(), tensor.element_size()


def _known(tensor: object, rank: int, n: int, backend: str, *, op: object, name: object) -> _Known:
    """:func:`_metadata` of a call and the ring it runs, from the cache for metadata seen before."""
    key = _known_key(tensor, rank, n, backend, op=op, name=name)
    known = None if key is None else _KNOWN.get(key)
    if known is None:
        signature, sound = _metadata(tensor, n, backend, op, name)
        flags = None if backend == "nccl" else _flags(signature, True, n, backend)
        ring = reduce_op = None
        plan: _Plan | _ChainPlan | None = None
        if sound:
            ring, reduce_op = ring_for(tensor, name, n)[0], op_name(op)
            assert ring is not None
            ring = ring.normalized(n)
            if n > 1 and isinstance(ring, ChainSchedule):
                plan = _chain_plan(ring, rank, n, *_buffer_size(tensor))
            elif n > 1:
                plan = _plan(ring, rank, n, *_buffer_size(tensor), *_tuning(tensor))
        known = _Known(signature, sound, flags, ring, reduce_op, plan)
        if key is not None:
            if len(_KNOWN) >= _KNOWN_MAX:
                _KNOWN.clear()
            _KNOWN[key] = known
    return known


def _flags(signature: list[int], clean: bool, n: int, backend: str) -> torch.Tensor:
    """This rank's contribution to the check: its row (signature, verdict, padding to
    :data:`_ROW_WORDS`), ``N`` times on gloo."""
    row = [*signature, 0 if clean else 1]
    row += [0] * (_ROW_WORDS - len(row))
    if backend in _PIPELINED_BACKENDS:
        return torch.tensor(row * n, dtype=torch.int64)
    return torch.tensor(row, dtype=torch.int64, device=_control_device(backend))


def _control_device(backend: str) -> torch.device:
    """Where the backend wants the small check tensor: NCCL needs the current CUDA device."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Waiter:
    """Waits on works with the call's ``timeout``; rewords any failure with the rank and the round."""

    def __init__(
        self,
        rank: int,
        n: int,
        timeout: datetime.timedelta | None,
        right: int = 0,
        left: int = 0,
        *,
        call: str = "ring_all_reduce_",
    ) -> None:
        self.rank, self.n, self.timeout = rank, n, timeout
        self.right, self.left, self.call = right, left, call

    def _failed(self, where: str, exc: RuntimeError) -> RuntimeError:
        return RuntimeError(
            f"{self.call}: rank {self.rank} of {self.n}{where} failed or timed out; a peer "
            f"probably raised, exited or did not call {self.call}. Cause: {exc}"
        )

    def wait(self, work: dist.Work, where: str) -> None:
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(timeout=self.timeout)
        except RuntimeError as exc:
            raise self._failed(where, exc) from exc

    def round(self, work: dist.Work, phase: Phase, r: int) -> None:
        """Wait on one of round ``r``'s sends or receives (its description is worded only on failure)."""
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(timeout=self.timeout)
        except RuntimeError as exc:
            where = (
                f", {phase} round {r}: exchanging chunks with rank {self.right} (send) and rank "
                f"{self.left} (receive)"
            )
            raise self._failed(where, exc) from exc


_CHECKING: Final = ": checking every rank's tensor before the ring"


def _all_to_all(  # noqa: PLR0917 (the collective's own arguments)
    group: dist.ProcessGroup,
    output: torch.Tensor,
    tensor: torch.Tensor,
    output_splits: list[int],
    input_splits: list[int],
    timeout: datetime.timedelta | None,
) -> dist.Work:
    """``alltoall`` on ``group``: ``input_splits[j]`` elements of ``tensor`` go to rank ``j``,
    ``output_splits[j]`` elements of ``output`` come from it; gloo gives up after ``timeout``."""
    return group.alltoall_base(output, tensor, output_splits, input_splits, timeout=timeout)


def _all_gather(
    group: dist.ProcessGroup,
    outputs: list[torch.Tensor],
    tensor: torch.Tensor,
    timeout: datetime.timedelta | None,
) -> dist.Work:
    """``allgather`` on ``group`` into ``outputs`` (one per rank); gloo gives up after ``timeout``."""
    return group.allgather(outputs, tensor, timeout=timeout)


def _gather_signatures(
    flags: torch.Tensor, group: dist.ProcessGroup, waiter: _Waiter
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's row ``flags`` in rank order, and this rank's row as often: one ``allgather``
    (backends other than gloo, which checks with :func:`_check_gloo`).  The two results are equal
    exactly when every rank's row is this rank's.
    """
    n = waiter.n
    gathered = flags.new_empty((n, flags.numel()))
    waiter.wait(_all_gather(group, list(gathered.unbind(0)), flags, waiter.timeout), _CHECKING)
    return gathered.view(-1), flags.repeat(n)


def _check_everywhere(
    tensor: object,
    group: dist.ProcessGroup,
    backend: str,
    waiter: _Waiter,
    *,
    op: object = "sum",
    name: object = "spec",
) -> _Known:
    """Raise the same bad-input error on every rank, or return on every rank; one small collective
    (one rank, or backends other than gloo: :func:`_check_gloo` checks gloo groups).

    Returns what the metadata decided (the ring and this rank's plan among it).
    """
    n = waiter.n
    known = _known(tensor, waiter.rank, n, backend, op=op, name=name)
    clean = known.sound
    if clean:
        assert isinstance(tensor, (torch.Tensor, Shards)) and known.ring is not None
        clean = _finite(tensor, n, backend, known.ring)
    if n > 1:
        flags = known.flags
        if flags is None or not clean:
            flags = _flags(known.signature, clean, n, backend)
        everyone, own = _gather_signatures(flags, group, waiter)
        if clean and torch.equal(everyone, own):
            return known
    elif clean:
        return known
    _refuse_everywhere(tensor, group, backend, waiter, op=op, name=name)
    return known


def _refuse_everywhere(
    tensor: object,
    group: dist.ProcessGroup,
    backend: str,
    waiter: _Waiter,
    *,
    op: object,
    name: object,
) -> None:
    """Exchange full descriptions and raise the one error they call for, the same on every rank."""
    n, call = waiter.n, waiter.call
    descriptions: list[Description | None] = [None] * n
    mine = _describe(tensor, n, backend, op, name)
    try:
        dist.all_gather_object(descriptions, mine, group=group)
    except RuntimeError as exc:
        raise RuntimeError(
            f"{call}: rank {waiter.rank} of {n}: exchanging tensor descriptions before the "
            f"ring failed or timed out; a peer probably raised, exited or did not call "
            f"{call}. Cause: {exc}"
        ) from exc
    error = _verdict([d for d in descriptions if d is not None], call)
    if error is not None:
        raise error


class _Scratch(threading.local):
    """Per-thread reusable buffers (fresh memory costs page faults on every call), and their views."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        self.pieces: dict[
            tuple[str, torch.dtype, torch.device, tuple[int, ...]], tuple[torch.Tensor, ...]
        ] = {}

    def get(self, purpose: str, numel: int, like: torch.Tensor) -> torch.Tensor:
        key = (purpose, like.dtype, like.device)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            self.forget(purpose, like)
            buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self.buffers[key] = buffer
        return buffer[:numel]

    def split(self, purpose: str, sizes: tuple[int, ...], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The buffer's first ``sum(sizes)`` elements cut into consecutive views of ``sizes``."""
        key = (purpose, like.dtype, like.device, sizes)
        pieces = self.pieces.get(key)
        if pieces is None:
            pieces = tuple(self.get(purpose, sum(sizes), like).split_with_sizes(sizes))
            if len(self.pieces) >= _KNOWN_MAX:
                self.pieces.clear()
            self.pieces[key] = pieces
        return pieces

    def forget(self, purpose: str, like: torch.Tensor) -> None:
        """Never reuse a buffer that a receive posted before a failure may still write into."""
        self.buffers.pop((purpose, like.dtype, like.device), None)
        for key in [k for k in self.pieces if k[:3] == (purpose, like.dtype, like.device)]:
            del self.pieces[key]


_SCRATCH: Final = _Scratch()
_BYTES: Final = torch.empty(0, dtype=torch.uint8)
"""The kind of scratch buffer (bytes, on the CPU) that the check's messages are built in."""


class _Plan(NamedTuple):
    """A call's index arithmetic: which chunk each step sends and receives, its segments, its staging.

    Steps are the ``2 (N - 1)`` ``(phase, round)`` pairs of :func:`ring_ref.schedule.all_rounds`.
    Every chunk is cut into the same number ``per_chunk`` of segments, so that segment ``s`` of
    chunk ``c`` is piece ``c * per_chunk + s`` of the flat buffer cut at :attr:`pieces`.
    """

    right: int
    left: int
    steps: tuple[tuple[Phase, int], ...]
    sent: tuple[int, ...]
    """The chunk this rank sends at each step (``ring.send_chunk``)."""
    received: tuple[int, ...]
    """The chunk this rank receives at each step (``ring.recv_chunk``)."""
    chunks: tuple[int, ...]
    """Each chunk's number of elements (``ring.layout``, :func:`ring_ref._chunks.chunk_bounds`)."""
    rs_steps: int
    """Steps ``0 .. rs_steps - 1`` are reduce-scatter's."""
    per_chunk: int
    """Segments per chunk; those of a short chunk may be empty."""
    pieces: tuple[int, ...]
    """The sizes of all segments of all chunks, in the order they lie in the buffer."""
    filled: tuple[tuple[int, ...], ...]
    """Per chunk, its non-empty segments."""
    staging: tuple[int, ...]
    """Staging cut into pieces: per reduce-scatter step ``t`` the segments of chunk
    ``received[t]``, then filler up to the largest chunk (piece ``t * (per_chunk + 1) + s``);
    all-gather receives straight into the slot."""
    splits: tuple[tuple[list[int], list[int]], ...]
    """Per step ``t`` and segment ``s`` (index ``t * per_chunk + s``), the elements an ``alltoall``
    sends to and receives from each rank: the segment to the right neighbour, from the left (only
    for groups of at most :data:`_EXCHANGE_RANKS`, the ones that run rounds as ``alltoall``)."""
    swap: tuple[tuple[int, int, bool], ...]
    """Two ranks (:func:`_check_gloo`): per non-empty chunk of the flat buffer, its ``(start, stop,
    here)``, ``here`` when this rank makes that chunk's combine (it receives the chunk in
    reduce-scatter); empty for ``N > 2`` and above :data:`SWAP_BYTES`."""
    lead: bool
    """The first step a call runs (reduce-scatter's first round, or a lone all-gather's) travels with
    the check (:func:`_check_gloo`): no chunk is larger than :data:`LEAD_BYTES`, which every rank
    decides alike (it depends on no rank)."""


@functools.lru_cache(maxsize=64)
def _plan(  # noqa: PLR0917 (cached by its positional arguments)
    ring: RingSchedule,
    rank: int,
    n: int,
    numel: int,
    itemsize: int,
    segment_bytes: int,
    exchange_segment_bytes: int,
    max_segments: int,
    swap_bytes: int,
    lead_bytes: int,
    exchange_ranks: int,
) -> _Plan:
    """The plan of one call (cached: it depends on nothing else)."""
    steps = all_rounds(n)
    sent = tuple(ring.send_chunk(phase, rank, r, n) for phase, r in steps)
    received = tuple(ring.recv_chunk(phase, rank, r, n) for phase, r in steps)
    # The pipeline forwards each segment as soon as it has arrived: every step sends the chunk the
    # step before it received.  Every ring of the family does (from its closed forms).
    if sent[1:] != received[:-1]:
        raise AssertionError(f"{ring.describe()}: a step does not forward the chunk just received")
    if n == 2 and sent[0] == received[0]:  # _check_gloo: the other rank combines the chunk sent
        raise AssertionError(f"{ring.describe()}: a rank sends the chunk it receives in reduce-scatter")
    rs_steps = rounds_per_phase(n)
    # So a reduce-scatter addition never writes a slot that a send still reads (_ring_pipelined).
    if len(set(sent[:rs_steps])) != rs_steps:
        raise AssertionError(f"{ring.describe()}: reduce-scatter sends a chunk twice")
    bounds = chunk_bounds(ring.layout, n, numel, itemsize=itemsize)
    chunks = tuple(stop - start for start, stop in bounds)
    largest = max(chunks)
    smallest = exchange_segment_bytes if n <= exchange_ranks else segment_bytes
    segment = max(smallest // itemsize, -(-largest // max_segments), 1)
    count = max(-(-largest // segment), 1)
    sizes = [[max(0, min(segment, size - s * segment)) for s in range(count)] for size in chunks]
    right, left = ring.right(rank, n), ring.left(rank, n)
    swap = _swap_runs(bounds, itemsize, received[0], swap_bytes)
    return _Plan(
        right=right,
        left=left,
        steps=steps,
        sent=sent,
        received=received,
        chunks=chunks,
        rs_steps=rs_steps,
        per_chunk=count,
        pieces=tuple(size for chunk in sizes for size in chunk),
        filled=tuple(tuple(s for s, size in enumerate(chunk) if size) for chunk in sizes),
        staging=tuple(
            size for t in range(rs_steps) for size in (*sizes[received[t]], largest - chunks[received[t]])
        ),
        splits=tuple(
            (
                [sizes[sent[t]][s] if j == right else 0 for j in range(n)],
                [sizes[received[t]][s] if j == left else 0 for j in range(n)],
            )
            for t in range(len(steps) if n <= exchange_ranks else 0)
            for s in range(count)
        ),
        swap=swap,
        lead=not swap and largest * itemsize <= lead_bytes,
    )


class _ChainPlan(NamedTuple):
    """A chain call's index arithmetic for one rank (clause ``chain-steps``): per step the segment it
    sends to its right neighbour and the one it receives from its left, ``None`` when it idles."""

    right: int
    left: int
    steps: tuple[tuple[Phase, int], ...]
    sent: tuple[int | None, ...]
    received: tuple[int | None, ...]
    bounds: tuple[tuple[int, int], ...]
    """Each segment's ``(start, stop)`` in the flat buffer (``chain.layout``)."""


@functools.lru_cache(maxsize=64)
def _chain_plan(chain: ChainSchedule, rank: int, n: int, numel: int, itemsize: int) -> _ChainPlan:
    """The chain's steps for ``rank`` (cached: they depend on nothing else)."""
    steps = chain.all_rounds(n)
    return _ChainPlan(
        right=chain.right(rank, n),
        left=chain.left(rank, n),
        steps=steps,
        sent=tuple(chain.send_segment(phase, rank, t, n) for phase, t in steps),
        received=tuple(chain.recv_segment(phase, rank, t, n) for phase, t in steps),
        bounds=tuple(chunk_bounds(chain.layout, n, numel, itemsize=itemsize)),
    )


def _swap_runs(
    bounds: list[tuple[int, int]], itemsize: int, combined_here: int, swap_bytes: int
) -> tuple[tuple[int, int, bool], ...]:
    """:attr:`_Plan.swap` for chunks at ``bounds``: empty unless two ranks reduce at most ``swap_bytes``."""
    if len(bounds) != 2 or bounds[-1][1] * itemsize > swap_bytes:
        return ()
    return tuple((low, high, c == combined_here) for c, (low, high) in enumerate(bounds) if low < high)


def _ring_pipelined(
    slots: tuple[torch.Tensor, ...],
    stages: tuple[torch.Tensor, ...],
    plan: _Plan,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
    lead: tuple[torch.Tensor, ...] | None = None,
    steps: range,
) -> None:
    """The schedule's rounds ``steps`` on the segments ``slots`` of a flat buffer, pipelined.

    ``slots[c * per_chunk + s]`` is segment ``s`` of chunk ``c`` and
    ``stages[t * (per_chunk + 1) + s]`` its staging at step ``t`` (:class:`_Plan`).
    Step ``t`` is the ``t``-th ``(phase, round)`` of :func:`ring_ref.schedule.all_rounds`.
    Every step forwards the chunk the previous step completed (``sent[t + 1] ==
    received[t]``, checked when the plan is made), so segment ``s`` of step
    ``t + 1`` is sent as soon as segment ``s`` of step ``t`` has arrived and
    been added.

    A gloo send goes out only once the receiver has posted its receive, so every
    receive is posted before the first send: each reduce-scatter step into its own
    part of the staging, each all-gather step straight into the slot.  An
    all-gather segment is final, so it comes only after every rank's contribution
    to it has been received, this rank's included, which was sent from the same
    slot segment: it cannot land on bytes still to be sent.
    Empty segments (of short or empty chunks) are neither sent nor received.  ``lead``, when
    given, holds the segments of the first step, already come with the check
    (:func:`_check_gloo`).  ``steps`` are the steps to run: all of them (all-reduce), or one phase's.
    """
    count, received, rounds, filled, rs_steps = (
        plan.per_chunk,
        plan.received,
        plan.steps,
        plan.filled,
        plan.rs_steps,
    )
    right, left = plan.right, plan.left
    # Sends are waited on at the end (a gloo work must be waited on once only): no addition writes
    # a slot a send still reads, as reduce-scatter sends each chunk once and adds into a chunk
    # before it sends it (checked when the plan is made), and all-gather's receives are final.
    sending: list[tuple[int, dist.Work]] = []
    receiving: dict[int, dist.Work] = {}

    def post_send(t: int, piece: int, s: int) -> None:
        sending.append((t, group.send([slots[piece]], right, t * count + s)))

    first = steps.start
    for t in steps[0 if lead is None else 1 :]:
        for s in filled[received[t]]:
            into = stages[t * (count + 1) + s] if t < rs_steps else slots[received[t] * count + s]
            receiving[t * count + s] = group.recv([into], left, t * count + s)
    for s in filled[plan.sent[first]] if lead is None else ():
        post_send(first, plan.sent[first] * count + s, s)

    def arrive(t: int, piece: int, s: int) -> None:
        """Segment ``s`` of step ``t`` has come: in reduce-scatter, add it into its slot; in
        all-gather, copy it there when it came with the check."""
        came = lead[s] if lead is not None and t == first else None
        if came is None:
            waiter.round(receiving.pop(t * count + s), *rounds[t])
        if t < rs_steps:
            stage = stages[t * (count + 1) + s] if came is None else came
            combine_into(stage, slots[piece])  # incoming + own (or the op's): rs-add
        elif came is not None:
            slots[piece].copy_(came)  # ag-copy-not-add

    last = steps.stop - 1
    for t in steps:
        c = received[t]
        for s in range(count):
            piece = c * count + s
            if plan.pieces[piece]:
                arrive(t, piece, s)
                if t < last:
                    post_send(t + 1, piece, s)
    for step, work in sending:
        waiter.round(work, *rounds[step])


class _Layout(NamedTuple):
    """Where the check's messages lie in one rank's ``alltoall`` buffers (:func:`_check_layout`)."""

    receiving: list[int]
    """Bytes this rank receives from each rank: a row, and room after it from either neighbour."""
    offsets: dict[int, int]
    """Where each other rank's message starts in the buffer received."""
    runs: tuple[tuple[int, int], ...]
    """The buffer received as ``(start, stop)`` runs of rows back to back (at most three: only the
    room after a neighbour's row breaks a run); together they hold every other rank's row."""


@functools.lru_cache(maxsize=64)
def _check_layout(n: int, rank: int, head: int, room: int) -> _Layout:
    """The check's receive layout: ``head`` bytes of row from every other rank, and ``room`` more
    from the two next to this rank (the only ranks any ring of the family sends to first)."""
    neighbours = {(rank - 1) % n, (rank + 1) % n}
    receiving = [0 if j == rank else head + (room if j in neighbours else 0) for j in range(n)]
    offsets = {j: sum(receiving[:j]) for j in range(n) if j != rank}
    runs: list[tuple[int, int]] = []
    for start in offsets.values():
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], start + head)
        else:
            runs.append((start, start + head))
    return _Layout(receiving, offsets, tuple(runs))


def _payload(
    flat: torch.Tensor | None, plan: _Plan, first: int, source: torch.Tensor | None
) -> torch.Tensor | None:
    """What a clean call sends with the check (:func:`_check_gloo`): its whole ``flat`` buffer
    (:attr:`_Plan.swap`), the chunk it sends at step ``first`` (:attr:`_Plan.lead`; ``source``
    when given, else read from ``flat``), or nothing."""
    if plan.swap:
        return flat
    if not plan.lead:
        return None
    if source is not None:
        payload = source.detach().reshape(-1)
        assert payload.numel() == plan.chunks[plan.sent[first]], "a lone all-gather sends its input first"
        return payload
    assert flat is not None
    start = sum(plan.chunks[: plan.sent[first]])
    return flat[start : start + plan.chunks[plan.sent[first]]]


def _check_gloo(  # noqa: PLR0917 (the call's own arguments)
    tensor: object,
    flat: torch.Tensor | None,
    known: _Known,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None] | None,
    *,
    op: object,
    name: object,
    first: int = 0,
    source: torch.Tensor | None = None,
) -> tuple[bool, tuple[torch.Tensor, ...] | None]:
    """gloo: the check before the ring in one ``alltoall`` that also carries the first piece of
    data.  Returns whether the reduction is done and, when the rounds are still to run, the
    segments of the chunk the left neighbour sends at step ``first`` (the first step the call
    runs) if it came with the check (:attr:`_Plan.lead`).  ``source``, when given, is what this
    rank sends at that step (a lone all-gather's input, not yet in its slot); otherwise it is
    read from ``flat``.

    Every rank sends every other rank its signature and verdict (:func:`_signature`), all
    messages at once (an ``allgather`` or ``allreduce`` would pass them round the ring in
    ``N - 1`` or more steps).  When its tensor is clean, its message to its right neighbour
    also carries either the bytes of its whole ``flat`` buffer (two ranks, at most
    :data:`SWAP_BYTES`) or the chunk it sends first (at most :data:`LEAD_BYTES`).  Each rank
    receives from its two neighbours (the only ranks a ring of
    the family sends to first, whatever its direction) into room for the larger of the two
    after the row, so unequal tensors cannot overrun it, and nothing is written before every
    row is compared.  Equal clean rows mean equal tensors and rings.

    Two ranks swapping: every element of a chunk this rank receives in reduce-scatter becomes
    ``combine(incoming=theirs, own=mine)`` (``rs-add``), and every element of the chunk it sends
    becomes ``combine(incoming=mine, own=theirs)``, the combine the other rank makes in the ring,
    which all-gather would have copied here (``ag-copy-not-add``), one chunk of
    :attr:`_Plan.swap` after another; for the ops of :data:`ring_ref._ops.COMMUTING_OPS` that is
    ``combine(incoming=theirs, own=mine)``'s bits, made in place.  A first chunk that came is the
    staging of reduce-scatter's first receive, which the rounds then add in.  Otherwise the ranks
    exchange full descriptions (:func:`_refuse_everywhere`).
    """
    n, rank = waiter.n, waiter.rank
    plan = known.plan if isinstance(known.plan, _Plan) else None  # the chain sends no data with the check
    clean = known.sound
    if clean:
        assert isinstance(tensor, (torch.Tensor, Shards)) and known.ring is not None
        clean = _finite(tensor, n, "gloo", known.ring)
    payload = _payload(flat, plan, first, source) if clean and plan is not None else None
    flags = known.flags if clean and known.flags is not None else _flags(known.signature, clean, n, "gloo")
    rows = flags.view(torch.uint8)  # this rank's row N times (cached for clean calls)
    head = rows.numel() // n
    assert head == _ROW_WORDS * flags.element_size(), "a row per rank"
    layout = _check_layout(n, rank, head, max(SWAP_BYTES, LEAD_BYTES))
    sending = [0 if j == rank else head for j in range(n)]
    outbox = rows[: head * (n - 1)]
    if payload is not None:
        assert plan is not None
        size = payload.numel() * payload.element_size()
        sending[plan.right] += size
        cut = (plan.right + (plan.right < rank)) * head  # where the right neighbour's row ends
        outbox = _SCRATCH.get("check-out", head * (n - 1) + size, _BYTES)
        outbox[:cut].copy_(rows[:cut])
        outbox[cut : cut + size].view(payload.dtype).copy_(payload)
        if cut < head * (n - 1):
            outbox[cut + size :].copy_(rows[cut : head * (n - 1)])
    inbox = _SCRATCH.get("check-in", sum(layout.receiving), _BYTES)
    waiter.wait(_all_to_all(group, inbox, outbox, layout.receiving, sending, waiter.timeout), _CHECKING)
    if clean and all(torch.equal(inbox[start:stop], rows[: stop - start]) for start, stop in layout.runs):
        if payload is None:
            return False, None
        assert plan is not None and combine_into is not None
        came = inbox[layout.offsets[plan.left] + head :]
        if not plan.swap:
            count, chunk = plan.per_chunk, plan.received[first]
            arrived = came[: plan.chunks[chunk] * payload.element_size()].view(payload.dtype)
            return False, arrived.split_with_sizes(plan.pieces[chunk * count : (chunk + 1) * count])
        staging = came[: payload.numel() * payload.element_size()].view(payload.dtype)
        for start, stop, here in plan.swap:
            own, incoming = payload[start:stop], staging[start:stop]
            if here or known.reduce_op in COMMUTING_OPS:
                combine_into(incoming, own)
            else:
                combine_into(own, incoming)
                own.copy_(incoming)
        return True, None
    _refuse_everywhere(tensor, group, "gloo", waiter, op=op, name=name)
    return False, None


def _ring_exchanges(
    slots: tuple[torch.Tensor, ...],
    stages: tuple[torch.Tensor, ...],
    plan: _Plan,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
    lead: tuple[torch.Tensor, ...] | None = None,
    steps: range,
) -> None:
    """The schedule's rounds ``steps``, each segment of each round one ``alltoall`` collective, pipelined.

    Segment ``s`` of step ``t``: this rank's piece of chunk ``sent[t]`` goes to the
    right neighbour and the left neighbour's piece of chunk ``received[t]`` comes
    in (every other rank exchanges nothing with it), into staging for
    reduce-scatter (added into the slot once it has arrived) and straight into
    the slot for all-gather.  A collective completes its send and its receive
    together, so no send is pending when a slot is overwritten.  Segment ``s`` of
    step ``t + 1`` is started as soon as segment ``s`` of step ``t`` is done
    (the same slot: :func:`_ring_pipelined`), while the other segments are under way.
    ``lead``, when given, holds the segments of the first step, already come with the check
    (:func:`_check_gloo`).
    """
    count, received, sent, pieces = plan.per_chunk, plan.received, plan.sent, plan.pieces
    works: dict[int, dist.Work] = {}

    def start(t: int, s: int) -> None:
        out, into = sent[t] * count + s, received[t] * count + s
        output = stages[t * (count + 1) + s] if t < plan.rs_steps else slots[into]
        input_splits, output_splits = plan.splits[t * count + s]
        works[t * count + s] = _all_to_all(
            group, output, slots[out], output_splits, input_splits, waiter.timeout
        )

    for s in range(count if lead is None else 0):
        start(steps.start, s)
    last = steps.stop - 1
    for t in steps:
        phase, r = plan.steps[t]
        for s in range(count):
            came = lead[s] if lead is not None and t == steps.start else None
            if came is None:
                waiter.round(works.pop(t * count + s), phase, r)
            if t < plan.rs_steps and pieces[received[t] * count + s]:
                # incoming + own (or the op's), as rs-add states
                incoming = stages[t * (count + 1) + s] if came is None else came
                combine_into(incoming, slots[received[t] * count + s])
            elif came is not None and pieces[received[t] * count + s]:
                slots[received[t] * count + s].copy_(came)  # ag-copy-not-add
            if t < last:
                start(t + 1, s)


def _ring_rounds(
    chunks: tuple[torch.Tensor, ...],
    staging: torch.Tensor,
    plan: _Plan,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
    steps: range,
) -> None:
    """The schedule's rounds ``steps``, one ``batch_isend_irecv`` each (backends that need grouped
    sends: NCCL)."""
    for t in steps:
        phase, r = plan.steps[t]
        out, slot = chunks[plan.sent[t]], chunks[plan.received[t]]
        into = staging[: slot.numel()] if phase == REDUCE_SCATTER else slot
        ops = []
        if out.numel():
            ops.append(dist.P2POp(dist.isend, out, group=group, group_peer=plan.right))
        if slot.numel():
            ops.append(dist.P2POp(dist.irecv, into, group=group, group_peer=plan.left))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                waiter.round(work, phase, r)
        if phase == REDUCE_SCATTER and slot.numel():
            combine_into(into, slot)


def _chain_steps(
    flat: torch.Tensor,
    work: torch.Tensor,
    plan: _ChainPlan,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """The chain's steps on ``flat``, one ``batch_isend_irecv`` each (clause ``chain-steps``).

    In a reduce step the segment received lands in staging and is then added
    into its slot (``incoming + own``); in a broadcast step it lands in the
    slot.  Sender and receiver of a step compute the same segment, and empty
    segments are neither sent nor received.  Every step's links form a chain
    (no cycle), so waiting on each step before the next cannot deadlock.
    """
    segments = [flat[start:stop] for start, stop in plan.bounds]
    staging = _SCRATCH.get("staging", max(stop - start for start, stop in plan.bounds), work)
    for (phase, t), out, slot in zip(plan.steps, plan.sent, plan.received, strict=True):
        ops = []
        if out is not None and segments[out].numel():
            ops.append(dist.P2POp(dist.isend, segments[out], group=group, group_peer=plan.right))
        into = None
        if slot is not None and segments[slot].numel():
            into = staging[: segments[slot].numel()] if phase == REDUCE_SCATTER else segments[slot]
            ops.append(dist.P2POp(dist.irecv, into, group=group, group_peer=plan.left))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                waiter.round(request, phase, t)
        if phase == REDUCE_SCATTER and into is not None and slot is not None:
            combine_into(into, segments[slot])


def _rounds(  # noqa: PLR0917 (the call's own arguments)
    flat: torch.Tensor,
    slots: tuple[torch.Tensor, ...] | None,
    work: torch.Tensor,
    plan: _Plan,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
    lead: tuple[torch.Tensor, ...] | None,
    steps: range,
) -> None:
    """The ring's rounds ``steps`` on ``flat`` over the transport the backend calls for: on gloo
    (``slots``, its segments) ``alltoall`` exchanges or point-to-point sends, elsewhere one batch
    per round.  Only reduce-scatter's steps receive into staging."""
    if slots is None:
        staging = _SCRATCH.get("staging", max(plan.chunks), work)
        chunks = flat.split_with_sizes(plan.chunks)
        _ring_rounds(chunks, staging, plan, group, waiter, combine_into=combine_into, steps=steps)
        return
    stages = _SCRATCH.split("staging", plan.staging, work) if steps.start < plan.rs_steps else ()
    ring = _ring_exchanges if waiter.n <= _EXCHANGE_RANKS else _ring_pipelined
    ring(slots, stages, plan, group, waiter, combine_into=combine_into, lead=lead, steps=steps)


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
    for any ``M``; its steps run one ``batch_isend_irecv`` each, after the same check.

    ``timeout`` bounds every wait for a peer (the check before the ring, and
    each send and receive): a peer that never calls, or fails mid-ring, makes
    this rank raise ``RuntimeError`` after about ``timeout`` instead of the
    group's own timeout.  See the module docstring for what the tensor holds
    after such a failure.
    """
    group, rank, n, backend = _group_of(group)
    waiter = _Waiter(rank, n, timeout)
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
    args: object, group: dist.ProcessGroup, backend: str, waiter: _Waiter, *, op: object, name: object
) -> _Known:
    """What a call's metadata decides; checked on every rank now, unless :func:`_check_gloo` checks
    it with the first exchange (gloo, ``N > 1``: :func:`_run`)."""
    if backend in _PIPELINED_BACKENDS and waiter.n > 1:
        return _known(args, waiter.rank, waiter.n, backend, op=op, name=name)
    return _check_everywhere(args, group, backend, waiter, op=op, name=name)


def _run(  # noqa: PLR0917 (the call's own state)
    args: object,
    flat: torch.Tensor | None,
    work: torch.Tensor | None,
    known: _Known,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    backend: str,
    *,
    op: object,
    name: object,
    phase: Phase | None = None,
    fill: Callable[[], None] | None = None,
    source: torch.Tensor | None = None,
) -> None:
    """The check (on gloo, :func:`_check_gloo`) and then the ring's rounds on ``flat``: both phases
    (``phase=None``, all-reduce) or one.  ``fill`` runs once the check has passed, before the
    rounds (all-gather's copy of its input into its slot); ``source`` is what this rank sends
    first when that is not yet in ``flat`` (all-gather's input).  On any failure the scratch buffers
    that a receive may still write into are dropped."""
    combine_into = None if known.reduce_op is None else torch_combine_into(known.reduce_op)
    plan = known.plan
    pipelined = backend in _PIPELINED_BACKENDS
    slots = (
        None
        if flat is None or not isinstance(plan, _Plan) or not pipelined
        else flat.split_with_sizes(plan.pieces)
    )
    try:
        steps = range(0)
        if isinstance(plan, _Plan):
            steps = {
                None: range(len(plan.steps)),
                REDUCE_SCATTER: range(plan.rs_steps),
                ALL_GATHER: range(plan.rs_steps, len(plan.steps)),
            }[phase]
        done, lead = (
            _check_gloo(
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
            if pipelined
            else (False, None)
        )
        assert plan is not None and combine_into is not None
        assert work is not None and flat is not None
        waiter.right, waiter.left = plan.right, plan.left
        if fill is not None:
            fill()
        if isinstance(plan, _ChainPlan):
            _chain_steps(flat, work, plan, group, waiter, combine_into=combine_into)
        elif not done:
            _rounds(flat, slots, work, plan, group, waiter, combine_into=combine_into, lead=lead, steps=steps)
    except BaseException:
        for purpose in ("staging", "input", "output"):
            if work is not None:
                _SCRATCH.forget(purpose, work)
        _SCRATCH.forget("check-in", _BYTES)
        _SCRATCH.forget("check-out", _BYTES)
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
    waiter = _Waiter(rank, n, timeout, call=call)
    args = Shards(REDUCE_SCATTER, output, input)
    known = _known_or_checked(args, group, backend, waiter, op=op, name=schedule)
    work = None
    if known.sound:  # copied now: on gloo, its first chunk may travel with the check
        work = _SCRATCH.get("input", input.numel(), input)
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
    waiter = _Waiter(rank, n, timeout, call=call)
    args = Shards(ALL_GATHER, output, input)
    known = _known_or_checked(args, group, backend, waiter, op="sum", name=schedule)
    data = work = None
    if known.sound:
        data = output.detach()
        work = data.view(-1) if data.is_contiguous() else _SCRATCH.get("output", data.numel(), data)

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
    n = dist.get_world_size(group)
    buffer = bucket.buffer()
    length = buffer.numel()
    ring, _ = ring_of(name)  # a bad schedule is refused by ring_all_reduce_, on every rank
    if length % n and ring is not None and ring.layout == "even":
        padded = _SCRATCH.get("hook", length + (-length) % n, buffer)
        padded[:length].copy_(buffer)
        padded[length:].zero_()
        try:
            ring_all_reduce_(padded, group, timeout=timeout, schedule=name)
        except BaseException:
            _SCRATCH.forget("hook", buffer)
            raise
        buffer.copy_(padded[:length])
    else:
        ring_all_reduce_(buffer, group, timeout=timeout, schedule=name)
    buffer.div_(n)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
