"""The fast engine: the spec's ring as a few batched array operations per round.

It performs exactly the additions the reference core (:mod:`ring_ref.core`)
performs, with the same operands in the same order and dtype, so its result is
bitwise identical (clause ``fold-order``); only the bookkeeping differs:

* **A plan, compiled from the schedule.**  :func:`plan` walks every send of
  :mod:`ring_ref.schedule` once per ``N`` (cached) and records, for each
  reduce-scatter round, which worker's original chunk ``c`` is added to the
  running partial sum of chunk ``c``.  It checks, while walking, the facts the
  engine relies on: each chunk's partial sum travels as one value from worker to
  worker, every addition adds a contribution the partial does not yet hold, and
  all-gather only forwards completed chunks and delivers every one of them to
  worker 0.  A schedule that broke these raises
  :class:`ring_ref.invariants.InvariantViolation` instead of running.
* **One running partial per chunk.**  Worker ``i``'s slot ``c`` is only ever
  read as the sender's partial sum, so the engine keeps one ``(N, M/N, ...)``
  buffer -- the size of the result -- and never materialises the other
  ``N^2 - N`` slots.  The ``N`` additions of a round become at most a few
  batched ``add`` calls: for a run of consecutive chunks, the own operands
  ``x[c + off, c]`` lie on one diagonal of the ``(worker, chunk)`` grid, a
  strided *view* of the input (no copy).
* **All-gather moves bytes the result does not need.**  It copies completed
  chunks between workers and never changes a value; the plan proves it hands
  worker 0 every completed chunk, so the engine returns each completed chunk
  once, in place.
* **Tiles** (CPU): all rounds run on a tile -- a block of whole chunks when
  chunks are small, a range of rows of one chunk when they are large -- before
  the next tile, so the partial sums stay in cache while the input streams by
  once.  Tiling reorders *which elements* are processed when, never the
  additions that make one element.

Finiteness (clause ``bad-input``) is checked on the result rather than the
input: an addition with a NaN or infinite operand never yields a finite value,
so a finite result proves a finite input.  Each finished tile is summed (one
pass, no mask); a NaN or infinity anywhere makes that sum non-finite.  Only a
non-finite sum -- a non-finite result, or rarely a finite one whose sum
overflows -- pays for the exact input scan that tells bad input from a sum that
overflowed (clause ``input-finite``).

Autograd is supported: with a tensor that requires grad (or carries a
forward-mode tangent), the computation runs inside a
:class:`torch.autograd.Function` whose backward passes the output gradient to
every worker unchanged -- what the reference's chain of additions gives, bit
for bit -- and whose forward-mode derivative is the same ring over the
tangents, as the reference's additions give.  numpy arrays (float16, float32,
float64) run through the same plan with ``numpy.add``.

>>> import torch
>>> ring_all_reduce_torch(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
>>> plan(2)
((Add(start=0, stop=1, own=1, incoming=0), Add(start=1, stop=2, own=-1, incoming=0)),)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch.autograd import forward_ad

from ring_ref import _validate, schedule
from ring_ref.invariants import InvariantViolation

TILE_BYTES = 2 << 20
"""Bytes of partial sums per CPU tile with torch operations (best measured here; see ``make bench``)."""

NUMPY_TILE_BYTES = 256 << 10
"""The same with numpy operations, whose lower per-call cost makes smaller tiles pay."""


class Add(NamedTuple):
    """One batched reduce-scatter addition over the chunks ``start .. stop - 1``.

    For each such chunk ``c`` the partial sum becomes ``incoming + x[c + own, c]``
    (worker ``c + own``'s original chunk ``c``), where ``incoming`` is the running
    partial sum of chunk ``c``, or, in the chunk's first addition, worker
    ``c + incoming``'s original chunk ``c``.  Offsets are plain integers: the
    workers are ``c + own`` and ``c + incoming`` exactly, with no wrap-around.
    """

    start: int
    stop: int
    own: int
    incoming: int | None


Plan = tuple[tuple[Add, ...], ...]
"""The batched additions of each reduce-scatter round, in round order."""


def _group(per_chunk: Sequence[tuple[int, int | None] | None]) -> tuple[Add, ...]:
    """Runs of consecutive chunks with the same operand offsets, as :class:`Add` records."""
    adds = []
    start = 0
    for c in range(1, len(per_chunk) + 1):
        if c == len(per_chunk) or per_chunk[c] != per_chunk[start]:
            offsets = per_chunk[start]
            if offsets is not None:
                adds.append(Add(start, c, *offsets))
            start = c
    return tuple(adds)


def _rs_fault(r: int, src: int, c: int, n: int, problem: str) -> InvariantViolation:
    dst = schedule.right(src, n)
    return InvariantViolation(
        f"reduce-scatter round {r}: worker {src} sends chunk {c} to worker {dst}, {problem}"
    )


def _reduce_scatter_plan(n: int) -> tuple[Plan, list[int]]:
    """The batched additions of reduce-scatter, and the worker holding each completed chunk."""
    holder: list[int | None] = [None] * n
    folded = bytearray(n * n)  # folded[c * n + w]: chunk c's partial holds worker w's contribution
    rounds = []
    for r in range(schedule.rounds_per_phase(n)):
        per_chunk: list[tuple[int, int | None] | None] = [None] * n
        for src in range(n):
            c = schedule.send_chunk(schedule.REDUCE_SCATTER, src, r, n)
            dst = schedule.right(src, n)
            if per_chunk[c] is not None:
                raise _rs_fault(r, src, c, n, "but that chunk is already in flight this round")
            incoming: int | None = None
            if holder[c] is None:
                incoming = src - c
                folded[c * n + src] = 1
            elif holder[c] != src:
                raise _rs_fault(r, src, c, n, f"but its partial sum is at worker {holder[c]}")
            if folded[c * n + dst]:
                raise _rs_fault(r, src, c, n, "whose partial sum already holds the receiver's contribution")
            folded[c * n + dst] = 1
            holder[c] = dst
            per_chunk[c] = (dst - c, incoming)
        rounds.append(_group(per_chunk))
    owners = []
    for c, at in enumerate(holder):
        if n > 1 and (at is None or sum(folded[c * n : (c + 1) * n]) != n):
            raise InvariantViolation(f"after reduce-scatter chunk {c} is not complete at any worker")
        owners.append(0 if at is None else at)
    return tuple(rounds), owners


def _check_all_gather(n: int, owners: Sequence[int]) -> None:
    """Walk the all-gather sends: only completed chunks move, and worker 0 ends with all of them."""
    complete = bytearray(n * n)  # complete[w * n + c]: worker w holds completed chunk c
    for c, w in enumerate(owners):
        complete[w * n + c] = 1
    for r in range(schedule.rounds_per_phase(n)):
        arriving = []
        for src in range(n):
            c = schedule.send_chunk(schedule.ALL_GATHER, src, r, n)
            if not complete[src * n + c]:
                raise InvariantViolation(f"all-gather round {r}: worker {src} forwards incomplete chunk {c}")
            arriving.append(schedule.right(src, n) * n + c)
        for slot in arriving:
            complete[slot] = 1
    missing = [c for c in range(n) if not complete[c]]
    if missing:
        raise InvariantViolation(f"after all-gather worker 0 lacks completed chunks {missing}")


@lru_cache(maxsize=16)
def plan(n: int) -> Plan:
    """The reduce-scatter additions of the ring for ``n`` workers, checked against the whole schedule.

    Costs ``O(n^2)`` Python steps once per ``n`` (about a second at ``n = 1024``);
    the result is cached.

    >>> [len(adds) for adds in plan(4)]
    [2, 2, 2]
    """
    rounds, owners = _reduce_scatter_plan(n)
    _check_all_gather(n, owners)
    return rounds


A = TypeVar("A", torch.Tensor, npt.NDArray[Any])


def _run(
    rounds: Plan,
    acc: A,
    *,
    diagonal: Callable[[int, int, int], A],
    add: Callable[[A, A, A], object],
    all_finite: Callable[[A], bool],
    tile: tuple[int, int],
) -> bool:
    """Execute ``rounds`` into ``acc`` (``(N, M/N, ...)``) one tile at a time.

    A tile is ``tile = (chunks, rows)``: that many consecutive chunks, that many
    rows of each; every round runs on a tile before the next tile starts.
    ``diagonal(offset, start, stop)`` is the view of ``x[c + offset, c]`` for chunks
    ``start .. stop - 1``; ``add(a, b, out)`` writes ``a + b`` into ``out``.  Each
    finished tile is checked with ``all_finite`` while it is still in cache; the
    return value says whether every element of the result is finite.
    """
    n, k = acc.shape[0], acc.shape[1]
    block, tile_rows = tile
    finite = True
    for c0 in range(0, n, block):
        c1 = min(n, c0 + block)
        bound = [
            [
                (
                    acc[lo:hi],
                    None if a.incoming is None else diagonal(a.incoming, lo, hi),
                    diagonal(a.own, lo, hi),
                )
                for a in adds
                for lo, hi in [(max(a.start, c0), min(a.stop, c1))]
                if lo < hi
            ]
            for adds in rounds
        ]
        whole = tile_rows >= k
        for r0 in range(0, k, tile_rows):
            rows = slice(r0, min(k, r0 + tile_rows))
            for batch in bound:
                for out, incoming, own in batch:
                    part = out if whole else out[:, rows]
                    first = part if incoming is None else incoming if whole else incoming[:, rows]
                    add(first, own if whole else own[:, rows], part)
            finite = finite and all_finite(acc[c0:c1] if whole else acc[c0:c1, rows])
    return finite


def _tile(n: int, k: int, row_bytes: int, budget: int | None) -> tuple[int, int]:
    """``(chunks, rows)`` per tile: about ``budget`` bytes of partial sums (``None``: everything at once).

    Small chunks are batched, as many whole chunks as fit; a chunk larger than
    the budget is a block of its own, cut into row ranges.
    """
    if budget is None:
        return n, k
    chunks = budget // (k * row_bytes)
    if chunks >= 1:
        return chunks, k
    return 1, max(1, budget // row_bytes)


def _torch_all_finite(block: torch.Tensor) -> bool:
    """True when every element of ``block`` is finite, in reduction passes that build no mask.

    A NaN or infinite element makes the sum NaN or infinite.  The sum may also
    overflow for finite elements: a false alarm that only costs the caller the
    exact check.  float16 and bfloat16 take the maximum and minimum instead
    (NaN propagates through both): their ``sum`` would first copy a strided
    block to float32.
    """
    if block.dtype in (torch.float16, torch.bfloat16):
        return math.isfinite(float(block.amax())) and math.isfinite(float(block.amin()))
    return math.isfinite(float(block.sum()))


def _numpy_all_finite(block: npt.NDArray[Any]) -> bool:
    """True when every element of ``block`` is finite: its maximum and minimum are (NaN propagates)."""
    return bool(np.isfinite(block.max())) and bool(np.isfinite(block.min()))


def _torch_forward(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The result for a tensor that passed ``check_torch_structure``, and whether all of it is finite."""
    n, m = x.shape[0], x.shape[1]
    k = m // n
    trailing = tuple(x.shape[2:])
    row_bytes = math.prod(trailing) * x.element_size()
    if x.is_cpu and x.dtype in (torch.float32, torch.float64) and k * row_bytes > NUMPY_TILE_BYTES:
        # Chunks larger than a tile run as row tiles, many short operations, where numpy's
        # per-call cost is a fraction of torch's. float32/float64 addition is IEEE in both, so the
        # bits are the same; numpy's float16 arithmetic is far slower, and it has no bfloat16.
        result, finite = _numpy_forward(x.detach().numpy())
        return torch.from_numpy(result), finite
    if n == 1:
        copy = torch.clone(x[0], memory_format=torch.contiguous_format)
        return copy, _torch_all_finite(copy)
    acc = torch.empty((n, k, *trailing), dtype=x.dtype, device=x.device)
    s_worker, s_row, *s_trailing = x.stride()
    base = x.storage_offset()

    def diagonal(offset: int, start: int, stop: int) -> torch.Tensor:
        return x.as_strided(
            (stop - start, k, *trailing),
            (s_worker + k * s_row, s_row, *s_trailing),
            base + (start + offset) * s_worker + start * k * s_row,
        )

    def add(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> object:
        return torch.add(a, b, out=out)

    tile = _tile(n, k, row_bytes, TILE_BYTES if x.is_cpu else None)
    finite = _run(plan(n), acc, diagonal=diagonal, add=add, all_finite=_torch_all_finite, tile=tile)
    return acc.view(m, *trailing), finite


class _RingSum(torch.autograd.Function):
    """Autograd for the fast engine: every worker's gradient is the output gradient, unchanged.

    ``forward(x, report)`` appends to the list ``report`` whether the result is finite.
    """

    @staticmethod
    def forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        x, report = args
        ctx.workers = x.shape[0]
        result, finite = _torch_forward(x)
        report.append(finite)
        return result

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        (grad,) = grad_outputs
        return grad.unsqueeze(0).expand(ctx.workers, *grad.shape), None

    @staticmethod
    def jvp(ctx: Any, *grad_inputs: Any) -> Any:
        tangent, _ = grad_inputs
        return _torch_forward(tangent)[0]


_ring_sum: Callable[[torch.Tensor, list[bool]], torch.Tensor] = _RingSum.apply
"""``_RingSum.apply`` with its type stated (torch leaves it untyped)."""

_unpack_dual: Callable[[torch.Tensor], Any] = forward_ad.unpack_dual
"""``forward_ad.unpack_dual`` with its type stated (torch leaves it untyped)."""


def ring_all_reduce_torch(x: torch.Tensor) -> torch.Tensor:
    """The fast engine on a ``torch.Tensor`` of shape ``(N, M, ...)``; returns ``(M, ...)``."""
    _validate.check_torch_structure(x)
    if (x.requires_grad and torch.is_grad_enabled()) or _unpack_dual(x).tangent is not None:
        report: list[bool] = []
        result = _ring_sum(x, report)
        finite = report[0]
    else:
        result, finite = _torch_forward(x)
    if not finite:
        _validate.torch_finite(x)
    return result


def ring_all_reduce_numpy(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """The fast engine on a ``numpy.ndarray`` of shape ``(N, M, ...)``; returns ``(M, ...)``."""
    _validate.check_numpy_structure(x)
    result, finite = _numpy_forward(x)
    if not finite:
        _validate.numpy_finite(x)
    return result


def _numpy_forward(x: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], bool]:
    """The result for an array that passed ``check_numpy_structure``, and whether all of it is finite."""
    n, m = x.shape[0], x.shape[1]
    k = m // n
    trailing = x.shape[2:]
    if n == 1:
        result: npt.NDArray[Any] = np.array(x[0], order="C")
        finite = _numpy_all_finite(result)
    else:
        acc = np.empty((n, k, *trailing), dtype=x.dtype)
        s_worker, s_row, *s_trailing = x.strides

        def diagonal(offset: int, start: int, stop: int) -> npt.NDArray[Any]:
            return np.lib.stride_tricks.as_strided(
                x[start + offset, start * k :],
                (stop - start, k, *trailing),
                (s_worker + k * s_row, s_row, *s_trailing),
                writeable=False,
            )

        def add(a: npt.NDArray[Any], b: npt.NDArray[Any], out: npt.NDArray[Any]) -> object:
            return np.add(a, b, out=out)

        tile = _tile(n, k, math.prod(trailing) * x.itemsize, NUMPY_TILE_BYTES)
        # Overflow to +-inf is the correctly rounded sum (clause input-finite), not an error; an
        # invalid operation (inf - inf) only happens on non-finite input, which is rejected below.
        with np.errstate(over="ignore", invalid="ignore"):
            finite = _run(plan(n), acc, diagonal=diagonal, add=add, all_finite=_numpy_all_finite, tile=tile)
        result = acc.reshape(m, *trailing)
    return result, finite
