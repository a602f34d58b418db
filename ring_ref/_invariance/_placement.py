"""Placements: where the probe region sits (a buffer of ``M`` elements, from offset ``O``), and the wrapper
that shows a target's answer for that region alone.

:class:`Embedded` turns a target of ``(N, M)`` inputs into one of ``(N, K)``
inputs: it writes the ``K`` probed columns at offset ``O`` of an ``(N, M)``
buffer (zeros elsewhere, or a given fill), calls the target and returns
``[O : O + K]`` of its ``(M,)`` result (clause ``invariance-embedding``).  So
:func:`ring_ref._reveal.reveal` reveals the trees of the probed elements in
that placement without knowing about placements.  It is a module-level class,
so it pickles whenever the target does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

import torch

from ring_ref._reveal import RevealError
from ring_ref._reveal._target import call_target

__all__ = ["DEFAULT_PROBE", "Embedded", "InvarianceError", "Placement", "placements"]

DEFAULT_PROBE: Final = 32
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


def placements(
    sizes: Sequence[int], offsets: Sequence[int], probe: int | None
) -> tuple[int, list[Placement]]:
    """``(K, placements)``: every offset in every size where the ``K`` probed elements fit, by ``(M, O)``.

    ``probe=None`` is ``min(32, smallest M - smallest O)``.  Every size must hold the region at some offset
    and every offset must fit in some size, else :class:`InvarianceError` names the one that does not.

    >>> placements([8, 4], [0, 2], 4)
    (4, [Placement(m=4, offset=0), Placement(m=8, offset=0), Placement(m=8, offset=2)])
    """
    if not sizes or any(not isinstance(m, int) or m < 1 for m in sizes):
        raise InvarianceError(f"sizes must be one or more integers >= 1 (elements per worker); got {sizes}")
    if not offsets or any(not isinstance(o, int) or o < 0 for o in offsets):
        raise InvarianceError(f"offsets must be one or more integers >= 0; got {offsets}")
    ms, os_ = sorted(set(sizes)), sorted(set(offsets))
    k = min(DEFAULT_PROBE, ms[0] - os_[0]) if probe is None else probe
    if not isinstance(k, int) or k < 1:
        raise InvarianceError(
            f"the probe region needs at least 1 element; got K = {k} (give --probe K, or sizes larger "
            "than the smallest offset)"
        )
    found = [Placement(m, o) for m in ms for o in os_ if o + k <= m]
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


@dataclass(frozen=True)
class Embedded:
    """``target`` seen through a placement: ``(N, K)`` probe in, ``(K,)`` out (see the module docstring).

    ``fill``: the ``(N, M)`` values around the region (``None``: zeros).
    """

    target: Callable[[torch.Tensor], object]
    placement: Placement
    fill: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The target's answer for the ``K`` columns of ``x`` placed at the offset of an ``M``-buffer."""
        n, k = int(x.shape[0]), int(x.shape[1])
        m, offset = self.placement
        if self.fill is None:
            buffer = torch.zeros((n, m), dtype=x.dtype)
        else:
            if tuple(self.fill.shape) != (n, m) or self.fill.dtype != x.dtype:
                raise RevealError(f"the fill must be ({n}, {m}) {x.dtype}; got {tuple(self.fill.shape)}")
            buffer = self.fill.clone()
        buffer[:, offset : offset + k] = x
        return call_target(self.target, buffer, m)[offset : offset + k].clone()
