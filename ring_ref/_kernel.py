"""The fast engine's compiled kernel: every element's fold in one pass over the input.

The ring's result for chunk ``c`` is the fold ``((x[w0] + x[w1]) + x[w2]) + ...``
along the chunk's worker order, one rounded addition in the input dtype per
worker.  For the ring's schedule that order is the same cycle of workers for
every chunk, entered at a chunk's own first worker: ``cycle[p], cycle[p + 1],
..., cycle[n - 1], cycle[0], ..., cycle[p - 1]``.  :func:`ring_ref._fast.plan`
proves that from :mod:`ring_ref.schedule` and hands this module the cycle and
each chunk's entry position ``p``; nothing here knows the schedule.

* **Exactly the spec's additions.**  Each step is ``partial = partial +
  x[worker, element]``: the same two operands in the same order, rounded once
  to float32 or float64 (a chunk's first worker's value is copied, then the
  second worker's added: the spec's first addition).  Numba leaves
  ``fastmath`` off: no reassociation, no contraction, no wider accumulator
  (there is no multiplication to fuse anyway).  LLVM vectorises the loop over
  the *elements* of a row -- independent folds side by side -- never over the
  workers of one fold; ``tests/cover/test_fast.py`` reads the compiled code
  to check that.
* **One pass, rows streamed, partial sums in cache.**  A tile is a block of
  consecutive chunks (small chunks) or a block of columns of one chunk (large
  chunks), at most :data:`TILE_BYTES` of partial sums, which stay in the L1
  cache while the tile's band of the input streams by row after row.  Walking
  the rows in cycle order from the tile's first entry position to the end
  adds, to each chunk already entered, the row's contiguous values (pass 1);
  walking from the start again up to the last entry completes the chunks that
  wrap around (pass 2).  Each chunk thus gets its workers in its own order;
  tiling and row order only choose *which elements* are processed when.
* **Finiteness for free.**  Each finished tile is checked while still in cache;
  :func:`fold` returns whether every element of the result is finite.  A
  non-finite input always makes the result non-finite, so only then does the
  caller need the exact input scan.
* **Cores.**  Tiles are shared among up to ``threads`` Python threads; the
  kernel releases the GIL.  Numba's own threading layers are not used: its
  workqueue layer aborts on concurrent calls and GNU OpenMP is not fork-safe,
  while plain threads are both (a forked child starts a pool of its own).
* **Compiled once per machine.**  ``cache=True`` keeps the machine code on disk,
  in ``__pycache__`` beside this file or, where that is read-only, in Numba's
  per-user cache directory (``NUMBA_CACHE_DIR`` overrides both); where neither
  is writable the kernel is compiled in memory once per process.

>>> import numpy as np
>>> x = np.array([[1.0, 2.0], [3.0, 4.0]])  # two workers, one element per chunk
>>> out = np.empty(2)
>>> cycle = np.array([0, 1], dtype=np.uint64)  # worker 0 sends to 1, 1 to 0
>>> entries = np.array([[0, 2, 0]], dtype=np.uint64)  # chunks 0 .. 1 enter at positions 0, 1
>>> fold(x, out, cycle, entries, chunk_size=1, threads=1)
True
>>> out.tolist()  # chunk 0 = x[0, 0] + x[1, 0], chunk 1 = x[1, 1] + x[0, 1]
[4.0, 6.0]
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

import numba
import numpy as np
import numpy.typing as npt

__all__ = [
    "MIN_BYTES_PER_THREAD",
    "OPTIONS",
    "TILE_BYTES",
    "compile_kernel",
    "fold",
    "kernel",
    "signature",
    "tile_shape",
]

TILE_BYTES: Final = 16 << 10
"""Bytes of partial sums per tile: what stays in a 32 KiB L1 data cache beside the streaming input."""

MIN_BYTES_PER_THREAD: Final = 1 << 20
"""Input bytes each thread should have before the work is split: below that, starting threads costs more
than it saves."""

Array = npt.NDArray[Any]

_njit: Any = numba.njit
"""``numba.njit``, called with options its type stubs do not list (``no_cpython_wrapper``)."""

_u: Any = numba.uint64
"""Numba's unsigned 64-bit integer: indices of this type are never wrapped around as negative ones."""


OPTIONS: Final[dict[str, Any]] = {
    "nogil": True,
    "boundscheck": False,
    "fastmath": False,
    "error_model": "numpy",
}
"""Numba's options for the kernel: releases the GIL, no bounds checks, IEEE arithmetic as written, and
no exception paths for integer division (no divisor is ever zero)."""


F = TypeVar("F", bound=Callable[..., Any])


def _helper(function: F) -> F:
    """A function the kernel calls, compiled with it (Numba's decorator, with its type stated)."""
    compiled: F = _njit(no_cpython_wrapper=True, no_cfunc_wrapper=True, **OPTIONS)(function)
    return compiled


@_helper
def _one_chunk(x: Array, out: Array, cycle: Array, p: Any, a: Any, b: Any) -> None:  # noqa: PLR0917
    """The whole fold of elements ``a .. b - 1`` of one chunk entering the cycle at ``p``.

    Up to four workers per pass over the elements: ``((s + x1) + x2) + x3) + x4``
    is four additions in the spec's order, the partial sum ``s`` read and
    written once.
    """
    one = _u(1)
    n = _u(cycle.shape[0])
    four = _u(4)
    j = four if n >= four else _u(2)
    w0 = cycle[p]
    w1 = cycle[(p + one) % n]
    if j == four:
        w2 = cycle[(p + _u(2)) % n]
        w3 = cycle[(p + _u(3)) % n]
        for i in range(a, b):
            out[i] = ((x[w0, i] + x[w1, i]) + x[w2, i]) + x[w3, i]
    else:
        for i in range(a, b):
            out[i] = x[w0, i] + x[w1, i]
    while j + four <= n:
        w0 = cycle[(p + j) % n]
        w1 = cycle[(p + j + one) % n]
        w2 = cycle[(p + j + _u(2)) % n]
        w3 = cycle[(p + j + _u(3)) % n]
        for i in range(a, b):
            out[i] = (((out[i] + x[w0, i]) + x[w1, i]) + x[w2, i]) + x[w3, i]
        j += four
    while j < n:
        w0 = cycle[(p + j) % n]
        for i in range(a, b):
            out[i] = out[i] + x[w0, i]
        j += one


@_helper
def _chunks(  # noqa: PLR0917 - compiled helpers take positional arguments only
    x: Array, out: Array, cycle: Array, lo: Any, hi: Any, p_lo: Any, k: Any, e0: Any, ee: Any
) -> None:
    """The folds of chunks ``lo .. hi - 1`` (entering at ``p_lo, p_lo + 1, ...``), columns ``e0 .. ee - 1``.

    The chunks' elements are ``lo K + e0 .. (hi - 1) K + ee - 1`` of a row:
    every row the tile reads is one contiguous run, added to the partial sums
    that need it.
    """
    one = _u(1)
    n = _u(cycle.shape[0])
    # Pass 1, positions p_lo .. n-1: chunks entered before p add the row; the one entering copies it.
    for p in range(p_lo, n):
        w = cycle[p]
        entering = lo + p - p_lo
        upto = min(entering, hi)
        if upto > lo:
            for i in range(lo * k + e0, (upto - one) * k + ee):
                out[i] = out[i] + x[w, i]
        if entering < hi:
            for i in range(entering * k + e0, entering * k + ee):
                out[i] = x[w, i]
    # Pass 2, positions 0 ..: each chunk adds the rows before its entry position.
    for p in range(_u(0), p_lo + hi - lo - one):
        w = cycle[p]
        since = lo + max(p + one, p_lo) - p_lo
        for i in range(since * k + e0, (hi - one) * k + ee):
            out[i] = out[i] + x[w, i]


def _fold_tiles(  # noqa: PLR0917 - a compiled kernel takes positional arguments only
    x: Array, out: Array, cycle: Array, entries: Array, k: Any, chunks: Any, cols: Any, t0: Any, t1: Any
) -> bool:
    """Fold tiles ``t0 .. t1 - 1`` of ``out`` (``N K`` results, chunk after chunk); all finite?

    ``x`` is ``(N, N K)``: row ``w`` is worker ``w``'s values, chunk ``c`` its
    columns ``c K .. c K + K - 1``.  ``cycle[p]`` is the worker at position
    ``p`` of the ring; ``entries[q] = (start, stop, p)``: the chunks ``start ..
    stop - 1`` enter the cycle at positions ``p, p + 1, ...`` (all below
    ``N``).  A tile is ``chunks`` whole chunks, or ``cols`` columns of one
    chunk.  Every index is unsigned, so Numba emits no negative-index
    wrap-around and LLVM can vectorise the loops over a row's elements.
    """
    one = _u(1)
    n = _u(cycle.shape[0])
    k = _u(k)
    chunks = _u(chunks)
    cols = _u(cols)
    col_tiles = (k + cols - one) // cols
    bad = False
    for t in range(_u(t0), _u(t1)):
        c0 = (t // col_tiles) * chunks
        c1 = min(n, c0 + chunks)
        e0 = (t % col_tiles) * cols
        ee = min(k, e0 + cols)
        for q in range(entries.shape[0]):
            lo = max(entries[q, 0], c0)
            hi = min(entries[q, 1], c1)
            p_lo = entries[q, 2] + lo - entries[q, 0]  # chunk lo + j enters the cycle at p_lo + j
            if hi - lo == one:
                _one_chunk(x, out, cycle, p_lo, lo * k + e0, lo * k + ee)
            elif lo < hi:
                _chunks(x, out, cycle, lo, hi, p_lo, k, e0, ee)
        for i in range(c0 * k + e0, (c1 - one) * k + ee):
            value = out[i]
            bad |= (value - value) != 0  # NaN exactly when value is NaN or infinite
    return not bad


def signature(dtype: str, contiguous: bool) -> Any:
    """The kernel's Numba signature for ``x`` of ``dtype`` (``"float32"``/``"float64"``), C-ordered or any.

    Explicit signatures keep the specialisations to four (a transposed input
    runs the any-strides one instead of compiling its own).
    """
    value = numba.from_dtype(np.dtype(dtype))
    x = numba.types.Array(value, 2, "C" if contiguous else "A", readonly=True)
    index = numba.types.Array(numba.uint64, 1, "C")
    entries = numba.types.Array(numba.uint64, 2, "C")
    out = numba.types.Array(value, 1, "C")
    return numba.types.boolean(x, out, index, entries, *[numba.int64] * 5)


def compile_kernel(dtype: str, contiguous: bool, *, cache: bool = True) -> Any:
    """:func:`_fold_tiles` compiled for one :func:`signature`, the machine code cached on disk if ``cache``.

    Where no cache directory is writable, it is compiled in memory, once per process.
    """
    sig = signature(dtype, contiguous)
    if cache:
        try:
            return _njit(sig, cache=True, **OPTIONS)(_fold_tiles)
        except RuntimeError:  # no writable cache location
            pass
    return _njit(sig, **OPTIONS)(_fold_tiles)


_kernels: dict[tuple[str, bool], Any] = {}


def kernel(dtype: str, contiguous: bool) -> Any:
    """The compiled kernel for ``x`` of ``dtype``, C-ordered or any, compiled (or loaded) on first use."""
    key = (dtype, contiguous)
    if key not in _kernels:
        _kernels[key] = compile_kernel(dtype, contiguous)
    return _kernels[key]


def tile_shape(n: int, k: int, itemsize: int, tiles: int = 1) -> tuple[int, int]:
    """``(chunks, columns)`` per tile for ``n`` chunks of ``k`` columns, at least ``tiles`` tiles.

    >>> tile_shape(8, 1 << 19, 4), tile_shape(1024, 4, 4), tile_shape(1024, 4, 4, tiles=2)
    ((1, 4096), (1024, 4), (512, 4))
    """
    chunks = min(TILE_BYTES // (k * itemsize), -(-n // tiles))
    if chunks >= 1:
        return chunks, k
    return 1, max(1, min(TILE_BYTES // itemsize, -(-k * n // tiles)))


@functools.lru_cache(maxsize=256)
def _split(n: int, k: int, itemsize: int, threads: int, budget: int) -> tuple[int, int, tuple[int, ...]]:
    """``(chunks, cols)`` per tile and the tile ranges of at most ``threads`` threads (``budget``:
    :data:`TILE_BYTES`, a key of the cache)."""
    chunks, cols = tile_shape(n, k, itemsize, threads)
    count = -(-n // chunks) * -(-k // cols)
    threads = min(threads, count)
    return chunks, cols, tuple(count * i // threads for i in range(threads + 1))


_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None


def _executor() -> ThreadPoolExecutor:
    """This process's worker threads (a forked child gets its own: the parent's threads are not in it)."""
    global _pool  # noqa: PLW0603 - one pool per process, created on first use
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="ring_ref"))
        return _pool[1]


def _after_fork_in_child() -> None:
    """A child forked while another thread held the pool's lock must not wait for it forever."""
    global _pool_lock  # noqa: PLW0603 - replaced in the child only
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def fold(x: Array, out: Array, cycle: Array, entries: Array, *, chunk_size: int, threads: int) -> bool:
    """Write the ring's result into ``out``, chunk after chunk; return whether all of it is finite.

    ``x`` is ``(N, N K)`` (float32 or float64, native byte order, aligned, any
    strides, read-only) with ``K = chunk_size``, ``out`` a contiguous ``(N K,)`` array of the same
    dtype; ``cycle`` and ``entries`` as :func:`_fold_tiles` reads them.  The
    tiles are split among at most ``threads`` threads.
    """
    n, k = cycle.shape[0], chunk_size
    threads = max(1, min(threads, x.nbytes // MIN_BYTES_PER_THREAD))
    chunks, cols, bounds = _split(n, k, out.itemsize, threads, TILE_BYTES)
    compiled = kernel(x.dtype.name, bool(x.flags.c_contiguous))
    if len(bounds) == 2:
        return bool(compiled(x, out, cycle, entries, k, chunks, cols, 0, bounds[1]))

    def part(t0: int, t1: int) -> bool:
        return bool(compiled(x, out, cycle, entries, k, chunks, cols, t0, t1))

    others = [_executor().submit(part, bounds[i], bounds[i + 1]) for i in range(1, len(bounds) - 1)]
    finite = part(bounds[0], bounds[1])
    return all([f.result() for f in others]) and finite
