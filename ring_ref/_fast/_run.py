"""Running the fast engine's plan as batched array operations, and what its result proves.

Where the compiled kernel cannot run (float16, bfloat16, other devices, layouts
without one stride per element, unaligned data), the plan runs as a few
batched array operations per round (:func:`run_rounds`): a round's additions
over a run of consecutive chunks are one call on a strided *view* of the input
(the own operands ``x[c + off, c]`` lie on one diagonal of the ``(worker,
chunk)`` grid), tile by tile on the CPU so the partial sums stay in cache
(:func:`batch_tile`).  The chain folds its workers one combine over the whole
buffer each (:func:`chain_batched`).  Nothing here knows torch from numpy
beyond the finiteness reductions: :mod:`ring_ref._fast._forward` hands in the
views and the combine.

Finiteness (clause ``bad-input``): an addition or a multiplication with a NaN
or infinite operand never yields a finite value, so a finite sum or product
proves a finite input (:func:`result_proves_finite`).  The batched path checks
each finished tile with one reduction while it is in cache
(:func:`torch_all_finite`, :func:`numpy_all_finite`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._fast._plan import Add
from ring_ref._ops import Op

A = TypeVar("A", torch.Tensor, npt.NDArray[Any])


def run_rounds(
    rounds: Sequence[Sequence[Add]],
    acc: A,
    *,
    diagonal: Callable[[int, int, int], A],
    combine: Callable[[A, A, A], object],
    all_finite: Callable[[A], bool] | None,
    tile: tuple[int, int],
) -> bool:
    """Execute ``rounds`` into ``acc`` (``(N, M/N, ...)``) one tile at a time.

    A tile is ``tile = (chunks, rows)``: that many consecutive chunks, that many
    rows of each; every round runs on a tile before the next tile starts.
    ``diagonal(offset, start, stop)`` is the view of ``x[c + offset, c]`` for chunks
    ``start .. stop - 1``; ``combine(incoming, own, out)`` writes ``incoming ∘ own``
    into ``out``.  Each finished tile is checked with ``all_finite`` (unless it is
    ``None``) while it is still in cache; the return value says whether every
    element of the result is finite (``True`` when nothing was checked).
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
                    combine(first, own if whole else own[:, rows], part)
            if all_finite is not None:
                finite = finite and all_finite(acc[c0:c1] if whole else acc[c0:c1, rows])
    return finite


def batch_tile(n: int, k: int, row_bytes: int, budget: int | None) -> tuple[int, int]:
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


def torch_all_finite(block: torch.Tensor) -> bool:
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


def numpy_all_finite(block: npt.NDArray[Any]) -> bool:
    """True when every element of ``block`` is finite: its maximum and minimum are (NaN propagates)."""
    return bool(np.isfinite(block.max())) and bool(np.isfinite(block.min()))


def result_proves_finite(op: Op) -> bool:
    """Whether a finite result proves a finite input: for a sum or a product (a NaN or infinite operand
    makes either non-finite), not for ``max`` and ``min``, which may drop a NaN or an infinity."""
    return op not in ("max", "min")


def chain_batched(x: A, out: A, order: tuple[int, ...], combine: Callable[[A, A, A], object]) -> None:
    """The chain's fold of the workers of ``x`` into ``out``: one combine over the whole buffer per worker,
    ``out = x[order[0]] ∘ x[order[1]]``, then ``out = out ∘ x[w]`` for the rest of ``order`` (``N >= 2``)."""
    combine(x[order[0]], x[order[1]], out)
    for w in order[2:]:
        combine(out, x[w], out)
