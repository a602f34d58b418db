"""The spec's ring all-reduce on real processes, over ``torch.distributed`` point-to-point sends.

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

:func:`ring_hook` plugs the same ring into ``DistributedDataParallel``
(``model.register_comm_hook(None, ring_hook)``).

**Speed.**  On gloo each chunk travels in segments (at least
:data:`SEGMENT_BYTES`, at most :data:`MAX_SEGMENTS` per chunk):
as soon as segment ``s`` of the chunk received in one round has been added
into its slot, segment ``s`` of the next round's chunk (the same slot: every
round forwards the chunk it has just completed) is sent, while the remaining
segments are still arriving.  The additions that make each element are exactly
the schedule's, in the same order, so the bits do not depend on the segment
size.  A gloo send waits until its receiver has posted the receive, so every
reduce-scatter receive is posted before the first send, each into its own
chunk of a reused staging buffer (``(N - 1) / N`` of the tensor, kept per
thread between calls).  Chunks up to :data:`STAGE_ALL_BYTES` stage the
all-gather steps too and copy them into their slots; larger ones receive
all-gather straight into the slot.  Contiguous tensors are reduced in place;
a non-contiguous one is reduced in a contiguous copy that is written back at
the end.  Other backends (NCCL) run one ``batch_isend_irecv`` per round,
unsegmented.

**Bad input** is rejected with the same exception on *every* rank, before any
chunk is sent.  Each rank checks its own tensor (the spec's bad-input table,
:mod:`ring_ref._validate`) and condenses its shape, dtype, device type, layout
and verdict into a fixed-size signature; one small ``all_reduce`` (``MAX`` of
the signature and of its negation) tells every rank whether all signatures are
equal and all verdicts clean.  Only when they are not do the ranks exchange
full descriptions (``all_gather_object``) so that every rank can word the same
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
garbage (recompute it).  A non-contiguous tensor is reduced in a private copy
and is left unchanged.  Bad input never modifies anything.
"""

import datetime
import threading
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, which the stubs do not export

from ring_ref import schedule
from ring_ref._chunks import chunk_views
from ring_ref._ops import Op, finish_torch, op_name, torch_combine_into
from ring_ref._validate import BadInput, rank_tensor_problem

__all__ = [
    "MAX_SEGMENTS",
    "SEGMENT_BYTES",
    "STAGE_ALL_BYTES",
    "RingHookState",
    "ring_all_reduce_",
    "ring_hook",
]

SEGMENT_BYTES: Final = 1 << 20
"""Smallest piece a chunk travels in on gloo; a chunk no larger than this goes whole."""
MAX_SEGMENTS: Final = 4
"""Most pieces per chunk: each send and receive costs a wake-up, dear on a busy machine."""
STAGE_ALL_BYTES: Final = 1 << 20
"""Chunks up to this size receive every step into staging (all-gather copies out of it); larger
chunks stage reduce-scatter only, and all-gather receives straight into the slot."""

_PIPELINED_BACKENDS: Final = frozenset({"gloo"})
_EXACT_DIMS: Final = 8
"""Signature entries that hold the leading dimensions exactly; further ones are folded into a hash."""
_HASH_MODULUS: Final = (1 << 61) - 1
_SIGNATURE_LENGTH: Final = 6 + _EXACT_DIMS + 2


@dataclass(frozen=True)
class _Description:
    """What one rank passed, as exchanged after a mismatch; ``problem`` is its local error."""

    summary: str
    signature: tuple[object, ...]
    problem: tuple[str, str] | None  # (exception kind, message)


def _op_problem(op: object) -> tuple[Op | None, BadInput | None]:
    """The op by its name, or the table's error for one that is not an op."""
    try:
        return op_name(op), None
    except ValueError as exc:
        return None, BadInput(ValueError, str(exc))


def _describe(tensor: object, n: int, backend: str, op: object = "sum") -> _Description:
    """Check one rank's arguments on their own; the verdict is applied on every rank after the exchange."""
    reduce_op, op_bad = _op_problem(op)
    bad = rank_tensor_problem(tensor, n, backend) or op_bad
    problem = None if bad is None else (bad.kind.__name__, bad.message.rstrip("."))
    if not isinstance(tensor, torch.Tensor):
        name = type(tensor).__name__
        return _Description(name, (name,), problem)
    shape = tuple(tensor.shape)
    summary = f"shape {shape} {tensor.dtype} on {tensor.device.type}"
    if reduce_op != "sum":
        summary += f", op {reduce_op or op!r}"
    return _Description(summary, (shape, str(tensor.dtype), tensor.device.type, reduce_op), problem)


def _verdict(descriptions: list[_Description]) -> Exception | None:
    """The one exception every rank raises for this set of descriptions, or ``None`` if all is well.

    >>> _verdict([_describe(torch.zeros(6), 3, "gloo")] * 3) is None
    True
    >>> bad = _verdict([_describe(torch.zeros(6), 3, "gloo"), _describe([0.0], 3, "gloo")])
    >>> print(bad)  # doctest: +ELLIPSIS
    ring_all_reduce_ rejected the input on every rank: rank 1: expects a torch.Tensor ...; got list.
    """
    prefix = "ring_all_reduce_ rejected the input on every rank"
    failures = [(r, d.problem) for r, d in enumerate(descriptions) if d.problem is not None]
    if failures:
        kind = TypeError if failures[0][1][0] == "TypeError" else ValueError
        lines = "; ".join(f"rank {r}: {problem[1]}" for r, problem in failures)
        return kind(f"{prefix}: {lines}.")
    if len({d.signature for d in descriptions}) > 1:
        listing = "; ".join(f"rank {r}: {d.summary}" for r, d in enumerate(descriptions))
        return ValueError(
            f"{prefix}: the ranks passed different tensors or ops ({listing}). Every rank must pass "
            "the same shape, dtype and device type, and the same op."
        )
    return None


def _code(text: str) -> int:
    """A name as a number, the same in every process (``hash`` of a str is salted per process)."""
    return zlib.crc32(text.encode())


def _signature(tensor: object, n: int, backend: str, op: object = "sum") -> tuple[list[int], bool]:
    """This rank's fixed-size signature and whether its tensor is clean, at the cost of one sum.

    Equal signatures mean equal kind, dtype, device type, layout and shape
    (exactly for up to :data:`_EXACT_DIMS` dimensions, by a 61-bit hash of
    the rest beyond).

    >>> a, ok = _signature(torch.zeros(6, 2), 3, "gloo")
    >>> ok, a == _signature(torch.ones(6, 2), 3, "gloo")[0], a == _signature(torch.zeros(6), 3, "gloo")[0]
    (True, True, False)
    >>> _signature(torch.tensor([1.0, float("nan"), 0.0]), 3, "gloo")[1]
    False
    """
    reduce_op, op_bad = _op_problem(op)
    if not isinstance(tensor, torch.Tensor) or tensor.is_nested or op_bad is not None:
        return [0, _code(type(tensor).__name__), *[0] * (_SIGNATURE_LENGTH - 2)], False
    shape = tuple(tensor.shape)
    rest = 0
    for d in shape[_EXACT_DIMS:]:
        rest = (rest * 1_000_003 + d + 1) % _HASH_MODULUS
    exact = [*shape[:_EXACT_DIMS], *([-1] * (_EXACT_DIMS - len(shape)))]
    signature = [
        1,
        _code(str(tensor.dtype)),
        _code(tensor.device.type),
        _code(str(tensor.layout)),
        len(shape),
        tensor.numel(),
        *exact,
        rest,
        _code(str(reduce_op)),
    ]
    clean = rank_tensor_problem(tensor, n, backend, finite=False) is None and (
        bool(torch.isfinite(tensor.detach().sum())) or rank_tensor_problem(tensor, n, backend) is None
    )
    return signature, clean


def _control_device(backend: str) -> torch.device:
    """Where the backend wants the small check tensor: NCCL needs the current CUDA device."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Waiter:
    """Waits on works with the call's ``timeout``; rewords any failure with the rank and the round."""

    def __init__(self, rank: int, n: int, timeout: datetime.timedelta | None) -> None:
        self.rank, self.n, self.timeout = rank, n, timeout

    def wait(self, work: dist.Work, where: str) -> None:
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(timeout=self.timeout)
        except RuntimeError as exc:
            raise RuntimeError(
                f"ring_all_reduce_: rank {self.rank} of {self.n}{where} failed or timed out; a peer "
                f"probably raised, exited or did not call ring_all_reduce_. Cause: {exc}"
            ) from exc

    def round(self, work: dist.Work, phase: schedule.Phase, r: int) -> None:
        right, left = schedule.right(self.rank, self.n), schedule.left(self.rank, self.n)
        self.wait(
            work,
            f", {phase} round {r}: exchanging chunks with rank {right} (send) and rank {left} (receive)",
        )


def _check_everywhere(
    tensor: object, n: int, group: dist.ProcessGroup, backend: str, waiter: _Waiter, *, op: object = "sum"
) -> None:
    """Raise the same bad-input error on every rank, or return on every rank; one small all-reduce."""
    signature, clean = _signature(tensor, n, backend, op)
    flags = torch.tensor(
        [*signature, *(-v for v in signature), 0 if clean else 1],
        dtype=torch.int64,
        device=_control_device(backend),
    )
    where = ": checking every rank's tensor before the ring"
    waiter.wait(dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group, async_op=True), where)
    k = len(signature)
    highest, lowest, any_bad = flags[:k], -flags[k : 2 * k], int(flags[2 * k])
    if any_bad == 0 and bool(torch.equal(highest, lowest)):
        return
    descriptions: list[_Description | None] = [None] * n
    try:
        dist.all_gather_object(descriptions, _describe(tensor, n, backend, op), group=group)
    except RuntimeError as exc:
        raise RuntimeError(
            f"ring_all_reduce_: rank {waiter.rank} of {n}: exchanging tensor descriptions before the "
            f"ring failed or timed out; a peer probably raised, exited or did not call "
            f"ring_all_reduce_. Cause: {exc}"
        ) from exc
    error = _verdict([d for d in descriptions if d is not None])
    if error is not None:
        raise error


class _Scratch(threading.local):
    """Per-thread reusable buffers (fresh memory costs page faults on every call)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, purpose: str, numel: int, like: torch.Tensor) -> torch.Tensor:
        key = (purpose, like.dtype, like.device)
        buffer = self.buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
            self.buffers[key] = buffer
        return buffer[:numel]

    def forget(self, purpose: str, like: torch.Tensor) -> None:
        """Never reuse a buffer that a receive posted before a failure may still write into."""
        self.buffers.pop((purpose, like.dtype, like.device), None)


_SCRATCH: Final = _Scratch()


def _staged_steps(n: int, chunk_bytes: int) -> int:
    """Steps that receive into staging, a chunk each: all of them for small chunks, else reduce-scatter's."""
    steps = len(schedule.all_rounds(n))
    return steps if chunk_bytes <= STAGE_ALL_BYTES else schedule.rounds_per_phase(n)


def _ring_pipelined(
    chunks: tuple[torch.Tensor, ...],
    staging: torch.Tensor,
    rank: int,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """The schedule's rounds on flat contiguous ``chunks``, each chunk sent in segments, pipelined.

    Step ``t`` is the ``t``-th ``(phase, round)`` of :func:`schedule.all_rounds`.
    Every step forwards the chunk the previous step completed (``send_chunk(t +
    1) == recv_chunk(t)``, from the closed forms), so segment ``s`` of step
    ``t + 1`` is sent as soon as segment ``s`` of step ``t`` has arrived and
    been added.

    A gloo send goes out only once the receiver has posted its receive, so
    receives are posted as early as their buffers allow: every reduce-scatter
    step has its own chunk of ``staging``, and all of them are posted before
    the first send.  All-gather steps of small chunks are staged too (then
    copied into the slot); for large chunks all-gather receives straight into
    the slot, posted once the reduce-scatter send that read that slot segment
    (``n - 1`` steps earlier) has completed.
    """
    n = len(chunks)
    k = chunks[0].numel()
    segment = max(SEGMENT_BYTES // chunks[0].element_size(), -(-k // MAX_SEGMENTS), 1)
    bounds = [(a, min(a + segment, k)) for a in range(0, k, segment)]
    steps = schedule.all_rounds(n)
    right, left = schedule.right(rank, n), schedule.left(rank, n)
    sent = [schedule.send_chunk(phase, rank, r, n) for phase, r in steps]
    received = [schedule.send_chunk(phase, left, r, n) for phase, r in steps]
    staged = _staged_steps(n, k * chunks[0].element_size())
    buffers = [staging[t * k : (t + 1) * k] for t in range(staged)]
    # Sends not yet waited on, by the slot segment they read (a gloo work must be waited on once only).
    sending: dict[tuple[int, int], list[tuple[int, dist.Work]]] = defaultdict(list)
    receiving: dict[tuple[int, int], dist.Work] = {}

    def tag(t: int, s: int) -> int:
        return t * len(bounds) + s

    def settle(c: int, s: int) -> None:
        """Wait for every send that reads slot ``c``'s segment ``s`` (before it is overwritten)."""
        for step, work in sending.pop((c, s), []):
            waiter.round(work, *steps[step])

    def post_recv(t: int, s: int) -> None:
        a, b = bounds[s]
        if t < staged:
            into = buffers[t][a:b]
        else:
            settle(received[t], s)
            into = chunks[received[t]][a:b]
        receiving[t, s] = group.recv([into], left, tag(t, s))

    def post_send(t: int, s: int) -> None:
        a, b = bounds[s]
        work = group.send([chunks[sent[t]][a:b]], right, tag(t, s))
        sending[sent[t], s].append((t, work))

    for t in range(staged):
        for s in range(len(bounds)):
            post_recv(t, s)
    for s in range(len(bounds)):
        post_send(0, s)
    for t, (phase, r) in enumerate(steps):
        for s, (a, b) in enumerate(bounds):
            waiter.round(receiving.pop((t, s)), phase, r)
            slot = chunks[received[t]][a:b]
            if phase == schedule.REDUCE_SCATTER:
                combine_into(buffers[t][a:b], slot)  # incoming + own (or the op's), as rs-add states
            elif t < staged:
                settle(received[t], s)
                slot.copy_(buffers[t][a:b])
            if t + 1 < len(steps):
                post_send(t + 1, s)
            if phase == schedule.REDUCE_SCATTER and staged <= t + n - 1 < len(steps):
                post_recv(t + n - 1, s)  # the all-gather step that overwrites the slot just sent
    for works in sending.values():
        for step, work in works:
            waiter.round(work, *steps[step])


def _ring_rounds(
    chunks: tuple[torch.Tensor, ...],
    staging: torch.Tensor,
    rank: int,
    group: dist.ProcessGroup,
    waiter: _Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """The schedule's rounds, one ``batch_isend_irecv`` each (backends that need grouped sends: NCCL)."""
    n = len(chunks)
    right, left = schedule.right(rank, n), schedule.left(rank, n)
    incoming = staging[: chunks[0].numel()]
    for phase, r in schedule.all_rounds(n):
        out, inc = schedule.send_chunk(phase, rank, r, n), schedule.send_chunk(phase, left, r, n)
        slot = chunks[inc]
        into = incoming if phase == schedule.REDUCE_SCATTER else slot
        ops = [
            dist.P2POp(dist.isend, chunks[out], group=group, group_peer=right),
            dist.P2POp(dist.irecv, into, group=group, group_peer=left),
        ]
        for work in dist.batch_isend_irecv(ops):
            waiter.round(work, phase, r)
        if phase == schedule.REDUCE_SCATTER:
            combine_into(incoming, slot)


def ring_all_reduce_(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    op: object = "sum",
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

    ``timeout`` bounds every wait for a peer (the check before the ring, and
    each send and receive): a peer that never calls, or fails mid-ring, makes
    this rank raise ``RuntimeError`` after about ``timeout`` instead of the
    group's own timeout.  See the module docstring for what the tensor holds
    after such a failure.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ring_all_reduce_ needs an initialised default process group; call "
            "torch.distributed.init_process_group(...) first (or launch with torchrun)."
        )
    group = group if group is not None else dist.group.WORLD
    if group is None:
        raise RuntimeError("ring_all_reduce_: the default process group has been destroyed.")
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError(
            f"this process (global rank {dist.get_rank()}) is not a member of the given group; "
            "only the group's ranks may call ring_all_reduce_ with it."
        )
    backend = str(dist.get_backend(group))
    waiter = _Waiter(rank, n, timeout)
    _check_everywhere(tensor, n, group, backend, waiter, op=op)
    reduce_op = op_name(op)
    if n == 1:
        return tensor
    data = tensor.detach()
    work = data if data.is_contiguous() else data.contiguous()
    chunks = tuple(chunk.view(-1) for chunk in chunk_views(work, n))
    pipelined = backend in _PIPELINED_BACKENDS
    k = chunks[0].numel()
    staged = _staged_steps(n, k * work.element_size()) if pipelined else 1
    staging = _SCRATCH.get("staging", staged * k, work)
    try:
        ring = _ring_pipelined if pipelined else _ring_rounds
        ring(chunks, staging, rank, group, waiter, combine_into=torch_combine_into(reduce_op))
    except BaseException:
        _SCRATCH.forget("staging", work)
        raise
    if work is not data:
        data.copy_(work)
    if reduce_op == "avg":
        data.copy_(finish_torch(reduce_op, data, n))
    return tensor


@dataclass(frozen=True)
class RingHookState:
    """The state :func:`ring_hook` accepts: the group to reduce over and the ring's ``timeout``."""

    group: dist.ProcessGroup | None = None
    timeout: datetime.timedelta | None = None


def ring_hook(
    state: RingHookState | dist.ProcessGroup | None, bucket: GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """A ``DistributedDataParallel`` communication hook that sums gradients with the spec's ring.

    ``model.register_comm_hook(None, ring_hook)``: each gradient bucket is
    summed with :func:`ring_all_reduce_` over the world (or over
    ``state.group``, or over ``state`` itself if it is a process group) and
    divided by the group size, as DDP's default all-reduce averages.  A bucket
    whose length ``L`` is not a multiple of the group size ``n`` is summed as
    the zero-padded bucket of ``L + (-L) % n`` elements, so the bits of the
    averaged bucket are exactly ``ring_all_reduce(torch.stack(padded
    buckets in rank order))[:L] / n``.  (DDP's built-in reduction divides
    *before* summing; this hook sums first, as the spec's ring does.)  Works
    with ``gradient_as_bucket_view=True`` and with ``no_sync()`` accumulation.
    The ring runs when DDP hands over the bucket, and the returned future is
    already complete.
    """
    if isinstance(state, RingHookState):
        group, timeout = state.group, state.timeout
    else:
        group, timeout = state, None
    n = dist.get_world_size(group)
    buffer = bucket.buffer()
    length = buffer.numel()
    if length % n:
        padded = _SCRATCH.get("hook", length + (-length) % n, buffer)
        padded[:length].copy_(buffer)
        padded[length:].zero_()
        try:
            ring_all_reduce_(padded, group, timeout=timeout)
        except BaseException:
            _SCRATCH.forget("hook", buffer)
            raise
        buffer.copy_(padded[:length])
    else:
        ring_all_reduce_(buffer, group, timeout=timeout)
    buffer.div_(n)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
