"""Chunk views: the one place that cuts a buffer into the ring's chunks (clause ``chunk-layout``).

A buffer of ``M`` rows (its leading axis) is cut into ``N`` chunks of ``M / N``
consecutive rows each; trailing dimensions stay whole.  The chunks are views
(basic slicing), so nothing is copied, for ``torch.Tensor`` and
``numpy.ndarray`` alike.

>>> import numpy as np
>>> [c.tolist() for c in chunk_views(np.arange(6), 3)]
[[0, 1], [2, 3], [4, 5]]
>>> chunk_rows(6, 3)
[(0, 2), (2, 4), (4, 6)]
"""

from __future__ import annotations

from typing import Protocol, Self, TypeVar

__all__ = ["chunk_rows", "chunk_views"]


class _Sliceable(Protocol):
    def __getitem__(self, index: slice, /) -> Self: ...

    def __len__(self) -> int: ...


B = TypeVar("B", bound=_Sliceable)


def chunk_rows(m: int, n: int) -> list[tuple[int, int]]:
    """``(start, stop)`` rows of each of the ``n`` chunks of ``m`` rows (``m`` a multiple of ``n``)."""
    k = m // n
    return [(c * k, (c + 1) * k) for c in range(n)]


def chunk_views(buffer: B, n: int) -> tuple[B, ...]:
    """The ``n`` chunks of ``buffer`` along its leading axis, as views."""
    return tuple(buffer[start:stop] for start, stop in chunk_rows(len(buffer), n))
