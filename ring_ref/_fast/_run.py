"""Running the fast engine's plan: on the compiled kernel, or as batched array operations.

* **float32 and float64 on the CPU: one compiled pass** (:mod:`ring_ref._fast._kernel`,
  through :func:`fold` and :func:`chain_fold`).  Every element's fold runs in
  machine code over cache-sized tiles, the input read once, on up to
  ``torch.get_num_threads()`` threads; each op's kernel is compiled on its
  first use.  This covers every layout whose ``(M, ...)`` part is one stride
  apart per element (:func:`element_stride`: contiguous, sliced, transposed,
  expanded workers, negative numpy strides).
* **Everything else: a few batched array operations per round**
  (:func:`run_rounds`).  A round's additions over a run of consecutive chunks
  are one call on a strided *view* of the input (the own operands ``x[c + off,
  c]`` lie on one diagonal of the ``(worker, chunk)`` grid), tile by tile on
  the CPU so the partial sums stay in cache (:func:`batch_tile`).

Both report whether the input is proven finite: an addition or a
multiplication with a NaN or infinite operand never yields a finite value, so
a finite sum or product proves a finite input (:func:`result_proves_finite`).
The kernel checks each finished tile while it is in cache; the batched path
checks each tile with one reduction (:func:`torch_all_finite`,
:func:`numpy_all_finite`).  Nothing here knows torch from numpy beyond those
two checks: :mod:`ring_ref._fast._forward` hands in the views and the combine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._fast._plan import Add, Cycle
from ring_ref._ops import Op, numpy_combine_out

__all__ = [
    "batch_tile",
    "chain_batched",
    "chain_fold",
    "element_stride",
    "fold",
    "numpy_all_finite",
    "result_proves_finite",
    "run_rounds",
    "torch_all_finite",
]

A = TypeVar("A", torch.Tensor, npt.NDArray[Any])
Array = npt.NDArray[Any]


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


# --- the compiled kernel -------------------------------------------------------------------------

_kernel_module: ModuleType | None = None


def _kernel() -> ModuleType:
    """:mod:`ring_ref._fast._kernel`, imported on first use (it imports llvmlite, LLVM itself)."""
    global _kernel_module  # noqa: PLW0603 - a lazily imported module
    if _kernel_module is None:
        from ring_ref._fast import _kernel as module

        _kernel_module = module
    return _kernel_module


def element_stride(shape: Sequence[int], strides: Sequence[int]) -> int | None:
    """The one stride that steps through a worker's ``(M, ...)`` elements in order, or ``None``.

    ``shape`` and ``strides`` are the whole ``(N, M, ...)`` input's.  Size-1
    dimensions do not count; any stride (zero, negative) is fine as long as each
    dimension steps over exactly the one inside it.

    >>> element_stride((4, 8, 3), (24, 3, 1)), element_stride((4, 8, 3), (24, 1, 8))
    (1, None)
    """
    dims = [(size, stride) for size, stride in zip(shape[1:], strides[1:], strict=True) if size != 1]
    if not dims:
        return 1
    inner = expected = dims[-1][1]
    for size, stride in reversed(dims):
        if stride != expected:
            return None
        expected = stride * size
    return inner


def fold(x2d: Array, out: Array, cycle: Cycle, op: Op) -> bool:
    """The compiled fold of ``x2d`` (``(N, M ...)`` flattened to two axes) into ``out`` (flat).

    ``avg`` folds the sum (the caller divides).  Returns whether the input is proven finite.
    """
    n = x2d.shape[0]
    return bool(
        _kernel().fold_chunks(
            x2d,
            out,
            cycle.order,
            cycle.entries,
            chunk_size=out.size // n,
            threads=torch.get_num_threads(),
            op="sum" if op == "avg" else op,
        )
    )


def chain_fold(x2d: Array, out: Array, order: tuple[int, ...], op: Op) -> bool:
    """The chain's fold (``order`` for every element) of ``x2d`` (``(N, L)``) into ``out`` (flat), compiled.

    Every element folds alike, so the first ``N K`` elements (``K = L // N``) go
    through :func:`fold` as ``N`` chunks of ``K`` that all enter the cycle
    ``order`` at its start, and the last ``L mod N`` through one batched
    combine per worker.  Returns whether the input is proven finite.
    """
    n, length = x2d.shape
    split = length - length % n
    entries = np.array([[c, c + 1, 0] for c in range(n)], dtype=np.int64)  # every chunk enters at order[0]
    cycle = Cycle(np.array(order, dtype=np.int64), entries)
    finite = fold(x2d[:, :split], out[:split], cycle, op) if split else True
    if split == length:
        return finite
    rest = out[split:]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        chain_batched(x2d[:, split:], rest, order, numpy_combine_out(op))
    return finite and numpy_all_finite(rest if result_proves_finite(op) else x2d[:, split:])


def chain_batched(x: A, out: A, order: tuple[int, ...], combine: Callable[[A, A, A], object]) -> None:
    """The chain's fold of the workers of ``x`` into ``out``: one combine over the whole buffer per worker,
    ``out = x[order[0]] ∘ x[order[1]]``, then ``out = out ∘ x[w]`` for the rest of ``order`` (``N >= 2``)."""
    combine(x[order[0]], x[order[1]], out)
    for w in order[2:]:
        combine(out, x[w], out)
