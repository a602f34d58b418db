"""Placements: where the probe region sits (a buffer of ``M`` elements, from offset ``O``), and the wrapper
that shows a target's answer for that region alone.

:class:`Embedded` turns a target of ``(N, M)`` inputs into one of ``(N, K)``
inputs: it writes the ``K`` probed columns at offset ``O`` of an ``(N, M)``
buffer (zeros elsewhere, or a given fill), calls the target and returns
``[O : O + K]`` of its ``(M,)`` result (clause ``invariance-embedding``).  So
:func:`ring_ref._reveal.reveal` reveals the trees of the probed elements in
that placement without knowing about placements.  It is a module-level class,
so it pickles whenever the target does.  Placements at one size that do not
overlap share one buffer (:func:`batches`, ``Embedded(..., also=...)``): one
reveal then serves them all, its ``K``-column blocks one per placement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import torch

from ring_ref._chunks import chunk_bounds
from ring_ref._names import INVARIANCE_PROBE
from ring_ref._reveal import RevealError
from ring_ref._reveal._target import call_target
from ring_ref.schedule import LAYOUTS

__all__ = [
    "DEFAULT_PROBE",
    "Embedded",
    "InvarianceError",
    "Placement",
    "batches",
    "chunk_offsets",
    "placements",
]

DEFAULT_PROBE: Final = INVARIANCE_PROBE
"""Probed elements ``K`` when none is given (fewer when the smallest size is smaller)."""


class InvarianceError(ValueError):
    """Sizes, offsets or a probe that cannot be placed (``ring-ref invariance`` exits 2 with this message)."""


class Placement(NamedTuple):
    """The probe region inside a buffer of ``m`` elements per worker, from element ``offset``."""

    m: int
    offset: int

    def text(self) -> str:
        """``M = 64, offset 3``."""
        return f"M = {self.m}, offset {self.offset}"


def chunk_offsets(n: int, m: int, k: int, *, itemsize: int = 4) -> list[int]:
    """The default offsets at size ``m`` (clause ``invariance-placements``): the fewest regions of ``k``
    elements that probe every chunk of every layout of the ring family at ``n`` workers, and the last element.

    Each chunk's first element (``even`` where ``n`` divides ``m``, ``blocks``, ``ceil``, ``floor``,
    ``gloo`` for elements of ``itemsize`` bytes) and element ``m - 1`` are points to cover; a region starts
    at the first point not yet covered, moved back to ``m - k`` where it would run past the end.

    >>> chunk_offsets(3, 64, 7), chunk_offsets(4, 16, 16), chunk_offsets(3, 4096, 32)
    ([0, 21, 42, 57], [0], [0, 1365, 2730, 4064])
    """
    points = {m - 1}
    for layout in LAYOUTS:
        if layout != "even" or m % n == 0:
            points.update(lo for lo, hi in chunk_bounds(layout, n, m, itemsize=itemsize) if hi > lo)
    offsets: list[int] = []
    for point in sorted(points):
        if not offsets or point >= offsets[-1] + k:
            offsets.append(min(point, m - k))
    return offsets


def placements(
    sizes: Sequence[int],
    offsets: Sequence[int] | None,
    probe: int | None,
    *,
    n: int = 1,
    itemsize: int = 4,
) -> tuple[int, list[Placement]]:
    """``(K, placements)``: every offset in every size where the ``K`` probed elements fit, by ``(M, O)``.

    ``offsets=None`` (the default of ``ring-ref invariance``) gives each size its own offsets, those of
    :func:`chunk_offsets` for ``n`` workers, so that every chunk of a ring at that size is probed.
    ``probe=None`` is ``min(32, smallest M - smallest O)``.  Every size must hold the region at some offset
    and every offset must fit in some size, else :class:`InvarianceError` names the one that does not.

    >>> placements([8, 4], [0, 2], 4)
    (4, [Placement(m=4, offset=0), Placement(m=8, offset=0), Placement(m=8, offset=2)])
    >>> placements([8, 4], None, None, n=2)
    (4, [Placement(m=4, offset=0), Placement(m=8, offset=0), Placement(m=8, offset=4)])
    """
    if not sizes or any(not isinstance(m, int) or m < 1 for m in sizes):
        raise InvarianceError(f"sizes must be one or more integers >= 1 (elements per worker); got {sizes}")
    if offsets is not None and (not offsets or any(not isinstance(o, int) or o < 0 for o in offsets)):
        raise InvarianceError(f"offsets must be one or more integers >= 0; got {offsets}")
    if offsets is None and n < 1:  # the default offsets cut the size among n workers
        raise InvarianceError(f"N = {n} must be at least 1")
    ms, os_ = sorted(set(sizes)), sorted(set(offsets or [0]))
    k = min(DEFAULT_PROBE, ms[0] - os_[0]) if probe is None else probe
    if not isinstance(k, int) or k < 1:
        raise InvarianceError(
            f"the probe region needs at least 1 element; got K = {k} (give --probe K, or sizes larger "
            "than the smallest offset)"
        )
    per_size = {
        m: os_ if offsets is not None else chunk_offsets(n, m, k, itemsize=itemsize) if k <= m else []
        for m in ms
    }
    found = [Placement(m, o) for m in ms for o in per_size[m] if o + k <= m]
    for m in ms:
        if not any(p.m == m for p in found):
            raise InvarianceError(
                f"M = {m} cannot hold the {k} probed elements at any offset {os_}: give a smaller --probe "
                f"(at most {m - os_[0]}) or drop that size"
            )
    for o in os_:
        if not any(p.offset == o for p in found):
            raise InvarianceError(
                f"offset {o} leaves no room for the {k} probed elements in any size {ms}: give a larger size "
                f"(at least {o + k}) or drop that offset"
            )
    return k, found


def batches(placed: Sequence[Placement], k: int) -> list[list[Placement]]:
    """``placed`` cut, in order, into runs of placements at one size whose ``k``-element regions do not
    overlap, each to be revealed in one buffer (clause ``invariance-reveal``).

    >>> placed = [Placement(8, 0), Placement(8, 4), Placement(8, 6), Placement(9, 0)]
    >>> [[p.offset for p in run] for run in batches(placed, 4)]
    [[0, 4], [6], [0]]
    """
    runs: list[list[Placement]] = []
    for p in placed:
        last = runs[-1][-1] if runs else None
        if last is not None and last.m == p.m and p.offset >= last.offset + k:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


@dataclass(frozen=True)
class Embedded:
    """``target`` seen through a placement: ``(N, K)`` probe in, ``(K,)`` out (see the module docstring).

    ``fill``: the ``(N, M)`` values around the region (``None``: zeros).  ``also``: further offsets in
    the same buffer, regions that do not overlap; the probe's columns are then cut into ``1 + len(also)``
    equal blocks, block ``i`` placed at the ``i``-th offset, and the answer is the blocks' results in turn.
    """

    target: Callable[[torch.Tensor], object]
    placement: Placement
    fill: torch.Tensor | None = None
    also: tuple[int, ...] = ()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The target's answer for the columns of ``x`` placed at the offsets of an ``M``-buffer."""
        n, m = int(x.shape[0]), self.placement.m
        offsets = (self.placement.offset, *self.also)
        k = int(x.shape[1]) // len(offsets)
        if self.fill is None:
            buffer = torch.zeros((n, m), dtype=x.dtype)
        else:
            if tuple(self.fill.shape) != (n, m) or self.fill.dtype != x.dtype:
                raise RevealError(
                    f"the fill must be ({n}, {m}) {x.dtype}; got {tuple(self.fill.shape)} {self.fill.dtype}"
                )
            buffer = self.fill.clone()
        for i, offset in enumerate(offsets):
            buffer[:, offset : offset + k] = x[:, i * k : (i + 1) * k]
        out = call_target(self.target, buffer, m)
        return torch.cat([out[offset : offset + k] for offset in offsets])
