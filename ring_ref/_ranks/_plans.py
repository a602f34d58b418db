"""What the metadata of a call on ranks decides, computed once: the ring's plan and the scratch it runs in.

A call's signature and verdict but finiteness, its ring and this rank's plan
(:class:`Plan`: which chunk each step sends and receives, cut into segments, with
its staging; :class:`ChainPlan` for the chain) depend on nothing but its metadata
(shape, strides, dtype, device, group size, rank, op, schedule) and the tuning
constants here, so :func:`plan_call` keeps them for later calls with the same
metadata.  Scratch buffers (:data:`SCRATCH`) are kept per thread between calls.

The tuning constants are read when a plan is made (tests replace them here), and
must be the same on every rank.
"""

from __future__ import annotations

import functools
import threading
from typing import Final, NamedTuple

import torch

from ring_ref._chunks import chunk_bounds
from ring_ref._ops import Op, op_name
from ring_ref._ranks._check import TENSOR_SIGNATURE_LENGTH, Shards, ring_for, tensor_metadata
from ring_ref.schedule import (
    ChainSchedule,
    DoublingSchedule,
    Phase,
    RingSchedule,
    Schedule,
    all_rounds,
    rounds_per_phase,
)

__all__ = [
    "BYTES",
    "EXCHANGE_SEGMENT_BYTES",
    "LEAD_BYTES",
    "MAX_SEGMENTS",
    "ROW_WORDS",
    "SCRATCH",
    "SEGMENT_BYTES",
    "SWAP_BYTES",
    "ChainPlan",
    "DoublingPlan",
    "Known",
    "Layout",
    "Plan",
    "by_exchanges",
    "check_layout",
    "check_room",
    "check_row",
    "pipelined",
    "plan_call",
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
(:func:`check_gloo`) instead of running the two rounds: one exchange instead of two, and twice
the combines (every element's on both ranks), which pays below about this size and costs above
it.  Every gloo call receives its neighbours' signatures into room for this many bytes more (or
:data:`LEAD_BYTES`, the larger), so it must be the same on every rank (as must every tuning
constant here)."""
LEAD_BYTES: Final = 1 << 20
"""gloo calls that run the rounds send the chunk of their first round (reduce-scatter's; a lone
all-gather's, its input) with their signature when no chunk is larger than this
(:attr:`Plan.lead`): that round then costs no exchange of its own.  Larger chunks travel after
the check."""
_EXCHANGE_RANKS: Final = 2
"""gloo groups of at most this many ranks run every round as ``alltoall`` collectives.

gloo runs a collective on its own worker thread; point-to-point sends and waits run on the
calling (Python) thread.  Measured on two ranks of a busy 2-core host, the collective's time
varied far less than the two-message exchange's (a tenth of the exchanges took several ms), so
two ranks exchange through it.  gloo's ``alltoall`` also sends an empty message to every other
rank, so from three ranks on the ring's point-to-point sends are cheaper.  (The check before the
ring is one ``alltoall`` for every group size: there every rank does send to every rank.)"""
ROW_WORDS: Final = -(-(TENSOR_SIGNATURE_LENGTH + 1) // 8) * 8
"""``int64`` words in a row of the check (24, 192 bytes): the signature, the verdict, then zeros to a
multiple of 64 bytes.  Data follows rows in the check's buffers (:func:`check_gloo`), so a row's
bytes must stay a multiple of every accepted dtype's size (8 at most); at a multiple of 64 the
data starts on a cache line (copying 1 MiB to 144 bytes past one took about 40 % longer here)."""


class Known(NamedTuple):
    """What the metadata of a call decides, kept for the next call with the same metadata."""

    signature: list[int]
    sound: bool
    """Every row of the table but finiteness passes."""
    flags: torch.Tensor | None
    """The clean rank's contribution to the check (:func:`check_row`; ``None`` for NCCL)."""
    ring: Schedule | None
    """The ring (offset taken mod ``n``), the chain or recursive doubling, when ``sound``."""
    reduce_op: Op | None
    plan: Plan | ChainPlan | DoublingPlan | None
    """The ring's (the chain's, recursive doubling's) steps for this rank, when ``sound`` and ``n > 1``."""


_KNOWN: Final[dict[tuple[object, ...], Known]] = {}
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
        tensor = args.input if args.collective.scatters else args.output
    assert isinstance(tensor, torch.Tensor)
    return tensor.numel(), tensor.element_size()


def plan_call(tensor: object, rank: int, n: int, backend: str, *, op: object, name: object) -> Known:
    """:func:`tensor_metadata` of a call and the ring it runs, from the cache for metadata seen before."""
    key = _known_key(tensor, rank, n, backend, op=op, name=name)
    known = None if key is None else _KNOWN.get(key)
    if known is None:
        signature, sound = tensor_metadata(tensor, n, backend, op, name)
        flags = None if backend == "nccl" else check_row(signature, True, n, backend)
        ring = reduce_op = None
        plan: Plan | ChainPlan | DoublingPlan | None = None
        if sound:
            ring, reduce_op = ring_for(tensor, name, n)[0], op_name(op)
            assert ring is not None
            ring = ring.normalized(n)
            if n > 1 and isinstance(ring, ChainSchedule):
                plan = _chain_plan(ring, rank, n, *_buffer_size(tensor), _tuning(tensor)[3])
            elif n > 1 and isinstance(ring, DoublingSchedule):
                plan = _doubling_plan(ring, rank, n)
            elif n > 1:
                plan = _plan(ring, rank, n, *_buffer_size(tensor), *_tuning(tensor))
        known = Known(signature, sound, flags, ring, reduce_op, plan)
        if key is not None:
            if len(_KNOWN) >= _KNOWN_MAX:
                _KNOWN.clear()
            _KNOWN[key] = known
    return known


def check_row(signature: list[int], clean: bool, n: int, backend: str) -> torch.Tensor:
    """This rank's contribution to the check: its row (signature, verdict, padding to
    :data:`ROW_WORDS`), ``N`` times on gloo."""
    row = [*signature, 0 if clean else 1]
    row += [0] * (ROW_WORDS - len(row))
    if backend in _PIPELINED_BACKENDS:
        return torch.tensor(row * n, dtype=torch.int64)
    return torch.tensor(row, dtype=torch.int64, device=_control_device(backend))


def _control_device(backend: str) -> torch.device:
    """Where the backend wants the small check tensor: NCCL needs the current CUDA device."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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


SCRATCH: Final = _Scratch()
BYTES: Final = torch.empty(0, dtype=torch.uint8)
"""The kind of scratch buffer (bytes, on the CPU) that the check's messages are built in."""


class Plan(NamedTuple):
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
    """Two ranks (:func:`check_gloo`): per non-empty chunk of the flat buffer, its ``(start, stop,
    here)``, ``here`` when this rank makes that chunk's combine (it receives the chunk in
    reduce-scatter); empty for ``N > 2`` and above :data:`SWAP_BYTES`."""
    lead: bool
    """The first step a call runs (reduce-scatter's first round, or a lone all-gather's) travels with
    the check (:func:`check_gloo`): no chunk is larger than :data:`LEAD_BYTES`, which every rank
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
) -> Plan:
    """The plan of one call (cached: it depends on nothing else)."""
    steps = all_rounds(n)
    sent = tuple(ring.send_chunk(phase, rank, r, n) for phase, r in steps)
    received = tuple(ring.recv_chunk(phase, rank, r, n) for phase, r in steps)
    # The pipeline forwards each segment as soon as it has arrived: every step sends the chunk the
    # step before it received.  Every ring of the family does (from its closed forms).
    if sent[1:] != received[:-1]:
        raise AssertionError(f"{ring.describe()}: a step does not forward the chunk just received")
    if n == 2 and sent[0] == received[0]:  # check_gloo: the other rank combines the chunk sent
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
    return Plan(
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


class ChainPlan(NamedTuple):
    """A chain call's index arithmetic for one rank (clause ``chain-steps``): per step the segment it
    sends to its right neighbour and the one it receives from its left, ``None`` when it idles."""

    right: int
    left: int
    steps: tuple[tuple[Phase, int], ...]
    sent: tuple[int | None, ...]
    received: tuple[int | None, ...]
    bounds: tuple[tuple[int, int], ...]
    """Each segment's ``(start, stop)`` in the flat buffer (``chain.layout``)."""
    swap: tuple[tuple[int, int, bool], ...]
    """Two ranks reducing at most :data:`SWAP_BYTES` (:attr:`Plan.swap`): every element is the one
    combine ``incoming = x_0``, ``own = x_1`` that rank 1 makes in the chain's reduce and rank 0
    receives in its broadcast, so both ranks swap tensors with the check and make it
    (``here`` on rank 1, the chain's receiver); empty otherwise."""


@functools.lru_cache(maxsize=64)
def _chain_plan(  # noqa: PLR0917 (cached by its positional arguments)
    chain: ChainSchedule, rank: int, n: int, numel: int, itemsize: int, swap_bytes: int
) -> ChainPlan:
    """The chain's steps for ``rank`` (cached: they depend on nothing else)."""
    steps = chain.all_rounds(n)
    bounds = chunk_bounds(chain.layout, n, numel, itemsize=itemsize)
    return ChainPlan(
        right=chain.right(rank, n),
        left=chain.left(rank, n),
        steps=steps,
        sent=tuple(chain.send_segment(phase, rank, t, n) for phase, t in steps),
        received=tuple(chain.recv_segment(phase, rank, t, n) for phase, t in steps),
        bounds=tuple(bounds),
        swap=((0, numel, rank == 1),) if n == 2 and 0 < numel * itemsize <= swap_bytes else (),
    )


class DoublingPlan(NamedTuple):
    """A recursive-doubling call's steps for one rank (clause ``doubling-steps``): per step the rank it
    sends its whole buffer to and the one it receives a whole buffer from, ``None`` when it does not."""

    steps: tuple[tuple[Phase, int], ...]
    dest: tuple[int | None, ...]
    source: tuple[int | None, ...]
    right: int
    left: int
    """The first step's peers (or this rank), for a failure's message before the steps."""


@functools.lru_cache(maxsize=64)
def _doubling_plan(doubling: DoublingSchedule, rank: int, n: int) -> DoublingPlan:
    """Recursive doubling's steps for ``rank`` (cached: they depend on nothing else)."""
    steps = doubling.all_rounds(n)

    def dest(phase: Phase, t: int) -> int | None:
        return next((k for k in range(n) if doubling.partner(phase, k, t, n) == rank), None)

    dests = tuple(dest(phase, t) for phase, t in steps)
    sources = tuple(doubling.partner(phase, rank, t, n) for phase, t in steps)
    right = next((p for p in dests if p is not None), rank)
    left = next((p for p in sources if p is not None), rank)
    return DoublingPlan(steps, dests, sources, right, left)


def _swap_runs(
    bounds: list[tuple[int, int]], itemsize: int, combined_here: int, swap_bytes: int
) -> tuple[tuple[int, int, bool], ...]:
    """:attr:`Plan.swap` for chunks at ``bounds``: empty unless two ranks reduce at most ``swap_bytes``."""
    if len(bounds) != 2 or bounds[-1][1] * itemsize > swap_bytes:
        return ()
    return tuple((low, high, c == combined_here) for c, (low, high) in enumerate(bounds) if low < high)


class Layout(NamedTuple):
    """Where the check's messages lie in one rank's ``alltoall`` buffers (:func:`check_layout`)."""

    receiving: list[int]
    """Bytes this rank receives from each rank: a row, and room after it from either neighbour."""
    offsets: dict[int, int]
    """Where each other rank's message starts in the buffer received."""
    runs: tuple[tuple[int, int], ...]
    """The buffer received as ``(start, stop)`` runs of rows back to back (at most three: only the
    room after a neighbour's row breaks a run); together they hold every other rank's row."""


@functools.lru_cache(maxsize=64)
def check_layout(n: int, rank: int, head: int, room: int) -> Layout:
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
    return Layout(receiving, offsets, tuple(runs))


def pipelined(backend: str) -> bool:
    """Whether ``backend`` runs the pipelined rounds and checks with data (gloo), rather than one
    ``batch_isend_irecv`` per round after an ``allgather`` of the rows (NCCL)."""
    return backend in _PIPELINED_BACKENDS


def by_exchanges(n: int) -> bool:
    """Whether a gloo group of ``n`` ranks runs every round as ``alltoall`` collectives."""
    return n <= _EXCHANGE_RANKS


def check_room() -> int:
    """Bytes of data the check's message from a neighbour may carry after its row."""
    return max(SWAP_BYTES, LEAD_BYTES)
