"""The fast engine's compiled kernel: every element's fold in one pass over the input.

The ring's result for chunk ``c`` is the fold ``((x[w0] ∘ x[w1]) ∘ x[w2]) ∘ ...``
along the chunk's worker order, one rounded combine (``∘``: ``+``, ``*``, the
first maximum or the first minimum; clauses ``op-*``) in the input dtype per
worker.  For the ring's schedule that order is the same cycle of workers for
every chunk, entered at a chunk's own first worker: ``cycle[p], cycle[p + 1],
..., cycle[n - 1], cycle[0], ..., cycle[p - 1]``.  :func:`ring_ref._fast.plan`
proves that from :mod:`ring_ref.schedule` and hands this module the cycle and
each chunk's entry position ``p``; nothing here knows the schedule.

* **Exactly the spec's combines.**  Each step is ``partial = partial ∘
  x[worker, element]``: the same two operands in the same order, rounded once
  to float32 or float64 (a chunk's first worker's value is copied, then the
  second worker's combined: the spec's first combine).  ``max`` keeps
  ``own`` only if ``own > partial`` (``min``: ``<``), so of equal values the
  first in fold order stays, sign of zero included, as :mod:`ring_ref._ops`
  defines it.  Numba leaves ``fastmath`` off: no reassociation, no
  contraction, no wider accumulator.  LLVM vectorises the loop over the
  *elements* of a row -- independent folds side by side -- never over the
  workers of one fold; ``tests/cover/test_fast.py`` reads the compiled code to
  check that.
* **One pass, rows streamed, partial results in cache.**  A tile is a block of
  consecutive chunks (small chunks) or a block of columns of one chunk (large
  chunks), at most :data:`TILE_BYTES` of partial results, which stay in the L1
  cache while the tile's band of the input streams by row after row.  The
  order of the rows is a small *program* computed once per shape with numpy
  (:func:`program`): walking the cycle from the block's first entry position
  to the end combines each row into the chunks already entered (pass 1), then
  from the start again up to the last entry position completes the chunks
  that wrap around (pass 2).  Each chunk thus gets its workers in its own
  order; tiling and row order only choose *which elements* are processed when.
* **Finiteness for free.**  A sum or product with a NaN or infinite operand
  is never finite, so each finished tile of those is checked while still in
  cache; ``max`` and ``min`` may drop a NaN or infinite operand, so they check
  every input element as it is read instead.  :func:`fold` returns whether
  the input is proven finite; only when it is not does the caller need the
  exact input scan.
* **One small kernel per (dtype, op, stride), compiled on first use.**  The
  kernel is a Numba ``cfunc`` on raw pointers with the op and the unit-stride
  case fixed at compile time, so a call compiles (or loads) only the
  specialisation it needs: no Python wrapper, no helper functions, about a
  third of a second to compile.
* **Cores.**  Tiles are shared among up to ``threads`` Python threads; the
  kernel runs through ``ctypes``, which releases the GIL.  Numba's own
  threading layers are not used: its workqueue layer aborts on concurrent
  calls and GNU OpenMP is not fork-safe, while plain threads are both (a
  forked child starts a pool of its own).
* **Compiled once per machine.**  ``cache=True`` keeps the machine code on disk,
  in ``__pycache__`` beside this file or, where that is read-only, in Numba's
  per-user cache directory (``NUMBA_CACHE_DIR`` overrides both); where neither
  is writable the kernel is compiled in memory once per process.

>>> import numpy as np
>>> x = np.array([[1.0, 2.0], [3.0, 4.0]])  # two workers, one element per chunk
>>> out = np.empty(2)
>>> cycle = np.array([0, 1])  # worker 0 sends to 1, 1 to 0
>>> entries = np.array([[0, 2, 0]])  # chunks 0 .. 1 enter at positions 0, 1
>>> fold(x, out, cycle, entries, chunk_size=1, threads=1)
True
>>> out.tolist()  # chunk 0 = x[0, 0] + x[1, 0], chunk 1 = x[1, 1] + x[0, 1]
[4.0, 6.0]
>>> fold(x, out, cycle, entries, chunk_size=1, threads=1, op="max"), out.tolist()
(True, [3.0, 4.0])
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, NamedTuple

import numba
import numpy as np
import numpy.typing as npt

__all__ = [
    "KERNEL_OPS",
    "MIN_BYTES_PER_THREAD",
    "OPTIONS",
    "TILE_BYTES",
    "Compiled",
    "compile_kernel",
    "fold",
    "kernel",
    "program",
    "signature",
    "tile_shape",
]

TILE_BYTES: Final = 16 << 10
"""Bytes of partial results per tile: what stays in a 32 KiB L1 data cache beside the streaming input."""

MIN_BYTES_PER_THREAD: Final = 1 << 20
"""Input bytes each thread should have before the work is split: below that, starting threads costs more
than it saves."""

KERNEL_OPS: Final = ("sum", "prod", "max", "min")
"""The combines the kernel compiles (``avg`` is the ring's ``sum``, divided by the caller)."""

Array = npt.NDArray[Any]

OPTIONS: Final[dict[str, Any]] = {
    "boundscheck": False,
    "fastmath": False,
    "error_model": "numpy",
}
"""Numba's options for the kernel: no bounds checks, IEEE arithmetic as written, and no exception paths
for integer division (there is none)."""


def _source(op: str, unit_stride: bool) -> Callable[..., bool]:
    """The kernel's Python source for ``op``, with ``x``'s element stride ``1`` (``unit_stride``) or any.

    Both are closure constants: Numba folds every branch on them away, and
    its cache tells the specialisations apart by them.
    """
    prod, larger, smaller = op == "prod", op == "max", op == "min"
    check_inputs = larger or smaller
    unit = unit_stride

    def fold_tiles(  # noqa: PLR0912, PLR0917 - branches on constants fold away; a C function is positional
        x: Any, s0: Any, s1: Any, out: Any, k: Any, steps: Any, tiles: Any, t0: Any, t1: Any
    ) -> bool:
        """Fold tiles ``t0 .. t1 - 1`` of the :func:`program` ``(steps, tiles)`` into ``out``; finite?

        ``x[w s0 + e s1]`` is worker ``w``'s element ``e`` (its chunk ``c``: the
        elements ``c K .. c K + K - 1``, ``K = k``); ``out`` holds ``N K``
        results, chunk after chunk.  ``tiles[6 t .. 6 t + 5]`` is tile ``t``'s
        steps ``lo .. hi - 1``, its columns ``e0 .. ee - 1`` of each chunk and
        the results it finishes; ``steps[4 s .. 4 s + 3]`` = ``(w, a, b, c)``:
        combine worker ``w``'s row into the chunks ``a .. b - 1``, then copy it
        into chunk ``c`` (none if ``c < 0``).
        """
        bad = False
        for t in range(t0, t1):
            e0 = tiles[6 * t + 2]
            ee = tiles[6 * t + 3]
            for s in range(tiles[6 * t], tiles[6 * t + 1]):
                row = steps[4 * s] * s0
                a = steps[4 * s + 1]
                b = steps[4 * s + 2]
                c = steps[4 * s + 3]
                if a < b:
                    for i in range(a * k + e0, (b - 1) * k + ee):
                        v = x[row + i] if unit else x[row + i * s1]
                        if prod:
                            out[i] = out[i] * v
                        elif larger:
                            out[i] = v if v > out[i] else out[i]
                        elif smaller:
                            out[i] = v if v < out[i] else out[i]
                        else:
                            out[i] = out[i] + v
                        if check_inputs:
                            bad |= (v - v) != 0  # NaN exactly when v is NaN or infinite
                if c >= 0:
                    for i in range(c * k + e0, c * k + ee):
                        v = x[row + i] if unit else x[row + i * s1]
                        out[i] = v
                        if check_inputs:
                            bad |= (v - v) != 0
            if not check_inputs:
                for i in range(tiles[6 * t + 4], tiles[6 * t + 5]):
                    value = out[i]
                    bad |= (value - value) != 0
        return not bad

    return fold_tiles


def signature(dtype: str) -> Any:
    """The kernel's C signature for ``x`` and ``out`` of ``dtype`` (``"float32"`` or ``"float64"``)."""
    types: Any = numba.types  # untyped where Numba's partial annotations are seen
    value = types.CPointer(numba.from_dtype(np.dtype(dtype)))
    index = types.CPointer(types.int64)
    i64 = types.int64
    return types.boolean(value, i64, i64, value, i64, index, index, i64, i64)


_ARGTYPES: Final = (
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int64,
)


def compile_kernel(dtype: str, unit_stride: bool, op: str = "sum", *, cache: bool = True) -> Any:
    """The kernel for ``dtype``, ``op`` and unit or any element stride: a Numba ``cfunc``.

    With ``cache`` its machine code is kept on disk; where no cache directory
    is writable, it is compiled in memory, once per process.
    """
    if op not in KERNEL_OPS:
        raise ValueError(f"the kernel computes {', '.join(KERNEL_OPS)}, not {op!r}")
    sig = signature(dtype)
    source = _source(op, unit_stride)
    if cache:
        try:
            return numba.cfunc(sig, cache=True, **OPTIONS)(source)
        except RuntimeError:  # no writable cache location
            pass
    return numba.cfunc(sig, **OPTIONS)(source)


class Compiled(NamedTuple):
    """A compiled kernel: Numba's ``cfunc`` (its machine code, cache statistics) and a ``ctypes`` caller."""

    cfunc: Any
    call: Callable[..., bool]


_kernels: dict[tuple[str, bool, str], Compiled] = {}


def kernel(dtype: str, unit_stride: bool, op: str = "sum") -> Compiled:
    """The kernel for ``x`` of ``dtype``, unit or any element stride, and ``op``, compiled (or loaded)
    on first use."""
    key = (dtype, unit_stride, op)
    if key not in _kernels:
        compiled = compile_kernel(dtype, unit_stride, op)
        call = ctypes.CFUNCTYPE(ctypes.c_bool, *_ARGTYPES)(compiled.address)
        _kernels[key] = Compiled(compiled, call)
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


def program(
    cycle: Array, entries: Array, k: int, chunks: int, cols: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The ``(steps, tiles)`` that :func:`_source`'s kernel runs: every chunk's rows in its fold order.

    Tiles are ``chunks`` whole chunks, or ``cols`` columns of one chunk; the
    tiles over one block of chunks share its steps.  For a run of chunks
    ``lo .. hi - 1`` of the block entering the cycle at ``p, p + 1, ...``, the
    step at position ``p + s`` (pass 1) combines the row of ``cycle[p + s]``
    into the chunks entered before it and copies it into the one entering
    there; the step at position ``q < p + hi - lo - 1`` (pass 2) combines the
    row of ``cycle[q]`` into the chunks entering after ``q``.

    >>> steps, tiles = program(np.array([0, 1, 2]), np.array([[0, 3, 0]]), 1, 3, 1)
    >>> steps.tolist()  # (worker, combine into chunks a .. b - 1, copy into chunk c)
    [[0, 0, 0, 0], [1, 0, 1, 1], [2, 0, 2, 2], [0, 1, 3, -1], [1, 2, 3, -1]]
    >>> tiles.tolist()  # steps 0 .. 4, columns 0 .. 0 of each chunk, results 0 .. 2
    [[0, 5, 0, 1, 0, 3]]
    """
    n = len(cycle)
    order = cycle.astype(np.int64)
    pieces: list[npt.NDArray[np.int64]] = []
    block_starts = [0]
    total = 0
    for c0 in range(0, n, chunks):
        c1 = min(n, c0 + chunks)
        for start, stop, p in entries.tolist():
            lo, hi = max(start, c0), min(stop, c1)
            if lo >= hi:
                continue
            p_lo = p + lo - start  # chunk lo + j enters at p_lo + j
            s = np.arange(n - p_lo)
            one = np.empty((len(s), 4), dtype=np.int64)
            one[:, 0] = order[p_lo + s]
            one[:, 1] = lo
            one[:, 2] = np.minimum(lo + s, hi)
            one[:, 3] = np.where(s < hi - lo, lo + s, -1)
            q = np.arange(p_lo + hi - lo - 1)
            two = np.empty((len(q), 4), dtype=np.int64)
            two[:, 0] = order[q]
            two[:, 1] = lo + np.maximum(q + 1 - p_lo, 0)
            two[:, 2] = hi
            two[:, 3] = -1
            pieces += [one, two]
            total += len(one) + len(two)
        block_starts.append(total)
    steps = np.ascontiguousarray(np.concatenate(pieces))
    col_tiles = -(-k // cols)
    t = np.arange(-(-n // chunks) * col_tiles, dtype=np.int64)
    block = t // col_tiles
    e0 = (t % col_tiles) * cols
    ee = np.minimum(k, e0 + cols)
    c0s = block * chunks
    c1s = np.minimum(n, c0s + chunks)
    starts = np.array(block_starts, dtype=np.int64)
    tiles = np.stack([starts[block], starts[block + 1], e0, ee, c0s * k + e0, (c1s - 1) * k + ee], axis=1)
    return steps, np.ascontiguousarray(tiles)


@functools.lru_cache(maxsize=64)
def _program(
    cycle: bytes, entries: bytes, k: int, chunks: int, cols: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """:func:`program` of a cycle and entries given as int64 bytes, cached (kept alive while in use)."""
    steps, tiles = program(
        np.frombuffer(cycle, dtype=np.int64),
        np.frombuffer(entries, dtype=np.int64).reshape(-1, 3),
        k,
        chunks,
        cols,
    )
    steps.flags.writeable = False
    tiles.flags.writeable = False
    return steps, tiles


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


def fold(
    x: Array, out: Array, cycle: Array, entries: Array, *, chunk_size: int, threads: int, op: str = "sum"
) -> bool:
    """Write the ring's result for ``op`` into ``out``, chunk after chunk; return whether the input is
    proven finite (``False``: it may not be, or the result overflowed).

    ``x`` is ``(N, N K)`` (float32 or float64, native byte order, aligned, any
    strides, only read) with ``K = chunk_size``, ``out`` a contiguous
    ``(N K,)`` array of the same dtype; ``cycle`` holds the workers in ring
    order and ``entries`` the rows ``(start, stop, p)``: the chunks ``start
    .. stop - 1`` enter the cycle at positions ``p, p + 1, ...`` (all below
    ``N``).  The tiles are split among at most ``threads`` threads.
    """
    n, k = cycle.shape[0], chunk_size
    threads = max(1, min(threads, x.nbytes // MIN_BYTES_PER_THREAD))
    chunks, cols, bounds = _split(n, k, out.itemsize, threads, TILE_BYTES)
    steps, tiles = _program(
        cycle.astype(np.int64).tobytes(), entries.astype(np.int64).tobytes(), k, chunks, cols
    )
    s0, s1 = (s // x.itemsize for s in x.strides)
    call = kernel(x.dtype.name, s1 == 1, op).call
    args = (x.ctypes.data, s0, s1, out.ctypes.data, k, steps.ctypes.data, tiles.ctypes.data)
    if len(bounds) == 2:
        return bool(call(*args, 0, bounds[1]))

    def part(t0: int, t1: int) -> bool:
        return bool(call(*args, t0, t1))

    others = [_executor().submit(part, bounds[i], bounds[i + 1]) for i in range(1, len(bounds) - 1)]
    finite = part(bounds[0], bounds[1])
    return all([f.result() for f in others]) and finite
