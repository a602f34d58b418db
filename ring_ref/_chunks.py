"""Chunk views: the one place that cuts a buffer into the ring's chunks.

Clauses ``chunk-layout`` and ``schedule-layouts``.

The spec's layout (``even``): a buffer of ``M`` rows (its leading axis) is cut
into ``N`` chunks of ``M / N`` consecutive rows each; trailing dimensions stay
whole.  The other layouts of the schedule family cut the ``S`` elements of a
buffer, in row-major order, into ``N`` consecutive ranges of any sizes, as the
libraries they come from see a flat buffer: ``blocks`` (OpenMPI: the first
``S mod N`` chunks one element longer), ``gloo`` (gloo's segments: the last
chunks may be short or empty), ``ceil`` (MPICH, MLX: ``ceil(S / N)`` elements
per chunk, the last ones short or empty) and ``floor`` (Intel MPI: ``floor(S /
N)`` elements per chunk, the rest on the last).  The chunks are views (basic slicing), so
nothing is copied, for ``torch.Tensor`` and ``numpy.ndarray`` alike.

>>> import numpy as np
>>> [c.tolist() for c in chunk_views(np.arange(6), 3)]
[[0, 1], [2, 3], [4, 5]]
>>> chunk_rows(6, 3)
[(0, 2), (2, 4), (4, 6)]
>>> chunk_bounds("blocks", 3, 7), chunk_bounds("gloo", 3, 7, itemsize=4)
([(0, 3), (3, 5), (5, 7)], [(0, 4), (4, 7), (7, 7)])
>>> chunk_bounds("ceil", 4, 9), chunk_bounds("floor", 4, 9)
([(0, 3), (3, 6), (6, 9), (9, 9)], [(0, 2), (2, 4), (4, 6), (6, 9)])
"""

from __future__ import annotations

import itertools
from typing import Final, Protocol, Self, TypeVar

from ring_ref.schedule import Layout

__all__ = [
    "GLOO_MAX_SEGMENT_BYTES",
    "chunk_bounds",
    "chunk_of_elements",
    "chunk_rows",
    "chunk_views",
    "layout_views",
    "worker_chunks",
]


class _Sliceable(Protocol):
    def __getitem__(self, index: slice, /) -> Self: ...

    def __len__(self) -> int: ...


B = TypeVar("B", bound=_Sliceable)


class _Stack(_Sliceable, Protocol):
    """An ``(N, M, ...)`` tensor or array: indexing gives a worker's buffer, ``reshape(-1)`` flattens it."""

    def __getitem__(self, index: slice | int, /) -> Self: ...

    def reshape(self, shape: int, /) -> Self: ...


W = TypeVar("W", bound=_Stack)

GLOO_MAX_SEGMENT_BYTES: Final = 1 << 20
"""gloo's ``AllreduceOptions::kMaxSegmentSize``: the largest segment its ring moves at once."""


def chunk_rows(m: int, n: int) -> list[tuple[int, int]]:
    """``(start, stop)`` rows of each of the ``n`` chunks of ``m`` rows (``m`` a multiple of ``n``)."""
    k = m // n
    return [(c * k, (c + 1) * k) for c in range(n)]


def chunk_views(buffer: B, n: int) -> tuple[B, ...]:
    """The ``n`` chunks of ``buffer`` along its leading axis, as views."""
    return tuple(buffer[start:stop] for start, stop in chunk_rows(len(buffer), n))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _gloo_chunk_elements(n: int, s: int, itemsize: int) -> int:
    """Elements per chunk in gloo's ring allreduce (``gloo/allreduce.cc``, function ``ring``).

    gloo cuts the buffer into ``numSegments`` segments: the number of segments of
    at most ``maxSegmentSize`` bytes, at least ``2 n``, rounded up to a multiple
    of ``n``; a segment holds ``ceil(s / numSegments)`` elements and rank ``c``'s
    chunk is segments ``c * numSegments / n`` onwards.  Offsets past the end are
    clipped, so the last chunks may be short or empty.
    """
    max_segment = itemsize * max(1, GLOO_MAX_SEGMENT_BYTES // itemsize)
    segments = max(_ceil_div(s * itemsize, max_segment), 2 * n)
    segments = _ceil_div(segments, n) * n
    return (segments // n) * _ceil_div(s, segments)


def chunk_bounds(layout: Layout, n: int, s: int, *, itemsize: int = 4) -> list[tuple[int, int]]:
    """``(start, stop)`` element ranges of the ``n`` chunks of ``s`` elements under ``layout``.

    ``even`` needs ``s`` divisible by ``n`` (chunks of ``s / n``); ``blocks`` gives
    the first ``s mod n`` chunks ``ceil(s / n)`` elements and the rest
    ``floor(s / n)``; ``gloo`` depends on the element size ``itemsize`` (bytes)
    once a chunk exceeds gloo's segment limit; ``ceil`` gives every chunk
    ``ceil(s / n)`` elements until the buffer ends (the last ones short or
    empty); ``floor`` gives every chunk ``floor(s / n)`` and the last the rest.

    >>> chunk_bounds("gloo", 4, 4, itemsize=8)
    [(0, 2), (2, 4), (4, 4), (4, 4)]
    """
    if layout == "even":
        return chunk_rows(s, n)
    if layout == "blocks":
        small, extra = divmod(s, n)
        starts = [c * small + min(c, extra) for c in range(n + 1)]
        return list(itertools.pairwise(starts))
    if layout == "floor":
        return [(c * (s // n), s if c == n - 1 else (c + 1) * (s // n)) for c in range(n)]
    size = _ceil_div(s, n) if layout == "ceil" else _gloo_chunk_elements(n, s, itemsize)
    return [(min(c * size, s), min((c + 1) * size, s)) for c in range(n)]


def chunk_of_elements(layout: Layout, n: int, s: int, *, itemsize: int = 4) -> list[int]:
    """The chunk each of the ``s`` elements belongs to under ``layout``.

    >>> chunk_of_elements("blocks", 2, 3)
    [0, 0, 1]
    """
    return [
        c
        for c, (start, stop) in enumerate(chunk_bounds(layout, n, s, itemsize=itemsize))
        for _ in range(start, stop)
    ]


def layout_views(flat: B, layout: Layout, n: int, *, itemsize: int) -> tuple[B, ...]:
    """The ``n`` chunks of a one-dimensional buffer of elements under ``layout``, as views."""
    return tuple(flat[start:stop] for start, stop in chunk_bounds(layout, n, len(flat), itemsize=itemsize))


def worker_chunks(worker_tensors: W, layout: Layout, *, itemsize: int) -> list[tuple[W, ...]]:
    """Each worker's ``N`` chunks of an ``(N, M, ...)`` stack under ``layout``, as views where possible.

    ``even``: ``M / N`` rows each, trailing dimensions whole.  The other
    layouts: ranges of the worker's elements in row-major order (views when the
    worker's buffer is contiguous; otherwise ``reshape`` reads it into a new
    buffer, never writing the input).  Both adapters cut their input here.

    >>> import numpy as np
    >>> [[c.tolist() for c in w] for w in worker_chunks(np.arange(6).reshape(2, 3), "blocks", itemsize=8)]
    [[[0, 1], [2]], [[3, 4], [5]]]
    """
    n = len(worker_tensors)
    if layout == "even":
        return [chunk_views(worker_tensors[i], n) for i in range(n)]
    return [layout_views(worker_tensors[i].reshape(-1), layout, n, itemsize=itemsize) for i in range(n)]
