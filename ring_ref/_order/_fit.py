"""Ring fitting: which ring of the family (spec/schedules.md) folds every element as the revealed trees say.

Under a ring ``(direction, offset, layout)`` element ``e`` lies in chunk
``c`` of the layout's cut, and its tree is the fold of chunk ``c``'s order
(clause ``reveal-report``).  :class:`RingFit` tests whole rings against the
revealed trees in one comparison each, and names the presets whose bits also
equal the target's on the checking inputs.  A layout is told from the others
only at some sizes (:func:`layout_sizes`): a preset matched elsewhere is
matched at that size alone (clause ``reveal-preset-sizes``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._chunks import chunk_bounds
from ring_ref._dispatch import ring_all_reduce
from ring_ref._dtypes import FORMATS, bits
from ring_ref._order._trees import Tree, canonical, fold_order_of, fold_tree, ring_step, tree_ids
from ring_ref.schedule import (
    LAYOUTS,
    PRESETS,
    ChainSchedule,
    DoublingSchedule,
    Layout,
    RingSchedule,
    Schedule,
    preset_schedule,
)

__all__ = [
    "RingFit",
    "chunk_index",
    "doubling_tree",
    "fit_ring",
    "layout_matters",
    "layout_sizes",
    "ring_trees",
    "untold_sizes",
]


def chunk_index(layout: Layout, n: int, m: int, dtype_name: str) -> npt.NDArray[np.int64]:
    """Each of ``m`` elements' chunk under ``layout``.

    >>> chunk_index("blocks", 2, 3, "float32").tolist()
    [0, 0, 1]
    """
    bounds = chunk_bounds(layout, n, m, itemsize=FORMATS[dtype_name].bits // 8)
    return np.repeat(np.arange(n, dtype=np.int64), [hi - lo for lo, hi in bounds])


def doubling_tree(doubling: DoublingSchedule, n: int) -> Tree:
    """Recursive doubling's one tree (clause ``doubling-order``), canonical: the pre-step's pairs
    ``(2 j, 2 j + 1)``, then the new ranks' subtrees paired ``log2 P`` times.

    >>> from ring_ref.schedule import RECURSIVE_DOUBLING as RD
    >>> doubling_tree(RD, 3), doubling_tree(RD, 4), doubling_tree(RD, 6)
    (((0, 1), 2), ((0, 1), (2, 3)), (((0, 1), (2, 3)), (4, 5)))
    """
    _, rem = doubling.powers(n)
    subtrees: list[Tree] = [(2 * v, 2 * v + 1) if v < rem else v + rem for v in range(n - rem)]
    while len(subtrees) > 1:
        subtrees = [(a, b) for a, b in zip(subtrees[::2], subtrees[1::2], strict=True)]
    return canonical(subtrees[0])


def _chunk_folds(ring: Schedule, n: int) -> list[Tree]:
    """Each chunk's tree under ``ring``: the fold of its order (recursive doubling: its one tree)."""
    if isinstance(ring, DoublingSchedule):
        return [doubling_tree(ring, n)] * n
    return [fold_tree(ring.fold_order(c, n)) for c in range(n)]


def _cuts(layout: Layout, n: int, m: int, itemsize: int) -> tuple[tuple[int, int], ...] | None:
    """``layout``'s chunk bounds at ``(n, m)``, ``None`` where it cannot cut ``m``."""
    return None if layout == "even" and m % n else tuple(chunk_bounds(layout, n, m, itemsize=itemsize))


def layout_sizes(layout: Layout, n: int, dtype_name: str = "float32") -> tuple[int, ...]:
    """The sizes ``M`` at which ``layout``'s chunks are told from every other layout's at ``n`` workers.

    ``M = 2N + 1`` for a layout that takes any ``M`` (one element past ``2N``:
    there a layout of ``ceil(M / N)``-element chunks, MPICH's, cuts otherwise
    than gloo's ``2 ceil(M / 2N)``, though the two agree at ``2N``, ``2N - 1``
    and many larger sizes), and for each other layout of the family the
    smallest ``M >= 2N`` that both cut, and cut differently (none within
    ``4N``: the two agree wherever both cut, as ``even`` and ``blocks`` do).
    Clauses ``difftest-order-probes`` and ``reveal-preset-sizes``.

    >>> layout_sizes("gloo", 3), layout_sizes("blocks", 3), layout_sizes("even", 3)
    ((7, 9), (7,), (9,))
    """
    itemsize = FORMATS[dtype_name].bits // 8
    sizes = [] if layout == "even" else [2 * n + 1]
    for other in LAYOUTS:
        differ = (
            m
            for m in range(2 * n, 4 * n + 1)
            if None not in (mine := _cuts(layout, n, m, itemsize), theirs := _cuts(other, n, m, itemsize))
            and mine != theirs
        )
        sizes.append(next(differ, 0))
    return tuple(sorted(set(sizes) - {0}))


def layout_matters(ring: Schedule, n: int) -> bool:
    """Whether ``ring``'s trees at ``n`` workers depend on its layout: its chunks fold differently (not
    the chain's one fold, nor any ring at ``N <= 2``)."""
    return len(set(_chunk_folds(ring, n))) > 1


def untold_sizes(rings: Sequence[Schedule], n: int, m: int, dtype_name: str = "float32") -> tuple[int, ...]:
    """The sizes besides ``m`` at which the layouts of ``rings`` (whose trees depend on their layout) are
    told from the others (:func:`layout_sizes`): where a match at ``(n, m)`` alone leaves them untold.

    >>> from ring_ref.schedule import CHAIN, GLOO, SPEC
    >>> untold_sizes([GLOO], 3, 64), untold_sizes([SPEC], 3, 9), untold_sizes([CHAIN], 3, 64)
    ((7, 9), (), ())
    """
    told = {s for ring in rings if layout_matters(ring, n) for s in layout_sizes(ring.layout, n, dtype_name)}
    return tuple(sorted(told - {m}))


def ring_trees(ring: Schedule, n: int, m: int, dtype_name: str) -> list[Tree] | None:
    """The tree of every element under ``ring`` (``None`` when its layout cannot cut ``M``)."""
    if ring.layout == "even" and m % n:
        return None
    per_chunk = _chunk_folds(ring, n)
    return [per_chunk[c] for c in chunk_index(ring.layout, n, m, dtype_name).tolist()]


def _fold_key(tree: Tree, n: int) -> int:
    """For ``N >= 4``, a fold stepping ``d = +-1`` through the workers as ``2 w + (d < 0)``, ``w`` its
    third worker (which, with ``d``, names the fold); ``-1`` for any other tree.

    >>> _fold_key(fold_tree([2, 3, 0, 1]), 4), _fold_key(fold_tree([2, 1, 0, 3]), 4)
    (0, 1)
    """
    chain = fold_order_of(tree)
    step = 0 if chain is None or len(chain) != n else ring_step(chain)
    return 2 * chain[2] + (step < 0) if chain is not None and step else -1


class RingFit:
    """Each element's tree as an id (``-1``: none), to test whole rings against them in one comparison.

    For ``N >= 4`` a ring's fold of chunk ``c`` is named by its third worker
    ``c + k + 2 d`` and ``d`` (:func:`_fold_key`), so a ring is tested without
    building its ``N`` trees; smaller rings compare the trees themselves.
    """

    def __init__(self, ids: npt.NDArray[np.int64], distinct: Sequence[Tree], n: int, dtype_name: str) -> None:
        self.n, self.m, self.dtype = n, len(ids), dtype_name
        self.ids = {t: k for k, t in enumerate(distinct)}
        self.raw = ids
        keys = np.array([_fold_key(t, n) for t in distinct] if n >= 4 else range(len(distinct)), np.int64)
        self.found = np.where(ids >= 0, keys[np.maximum(ids, 0)] if len(keys) else -1, -1)
        self.complete = bool((ids >= 0).all())
        self.chunk_of: dict[Layout, npt.NDArray[np.int64]] = {}

    def _per_chunk(self, ring: Schedule) -> npt.NDArray[np.int64]:
        if self.n >= 4 and isinstance(ring, ChainSchedule):
            # every chunk the fold 0, 1, 2, ...: third worker 2, direction +1
            return np.full(self.n, 2 * 2, np.int64)
        if self.n >= 4 and isinstance(ring, RingSchedule):
            third = (np.arange(self.n) + ring.offset + 2 * ring.direction) % self.n
            return 2 * third + (ring.direction < 0)
        return np.array([self.ids.get(tree, -1) for tree in _chunk_folds(ring, self.n)], np.int64)

    def fits(self, ring: Schedule) -> bool:
        """Whether every element's tree is its chunk's fold under ``ring``."""
        if not self.complete or (ring.layout == "even" and self.m % self.n):
            return False
        if isinstance(ring, DoublingSchedule):  # one tree, which no fold key names for N >= 4
            tree = self.ids.get(doubling_tree(ring, self.n), -1)
            return tree >= 0 and bool((self.raw == tree).all())
        if ring.layout not in self.chunk_of:
            self.chunk_of[ring.layout] = chunk_index(ring.layout, self.n, self.m, self.dtype)
        return bool(np.array_equal(self._per_chunk(ring)[self.chunk_of[ring.layout]], self.found))

    def first_ring(self) -> RingSchedule | None:
        """The first ring of the family that fits: the ring presets, then ``d = +1, -1``, ``k = 0 .. N - 1``,
        layouts ``even``, ``blocks``, ``gloo``, ``ceil``, ``floor`` (small rings fit several; for ``N <= 2``
        all are one); a library layout that cuts ``M`` as one of the first three does is named by that one."""
        candidates = [p.normalized(self.n) for p in PRESETS.values() if isinstance(p, RingSchedule)]
        candidates += [RingSchedule(d, k, lay) for d in (1, -1) for k in range(self.n) for lay in LAYOUTS]
        ring = next((ring for ring in dict.fromkeys(candidates) if self.fits(ring)), None)
        if ring is None:
            return None
        # a library's layout (ceil, floor) that cuts this M as one of the family's first layouts does (even
        # where N divides M) is named by that one, as before the library layouts were added
        named = (*LAYOUTS[:3], ring.layout) if ring.layout in LAYOUTS[3:] else (ring.layout,)
        return next(r for lay in named if self.fits(r := ring._replace(layout=lay)))

    def matching_presets(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]) -> list[str]:
        """The presets (``chain`` too: it fits when every element is the left fold ``0, 1, ..., N - 1``)
        whose tree is every element's revealed tree and whose bits equal the target's on
        every checking input (random inputs alone tell small trees apart only now and then)."""
        return [
            name
            for name in PRESETS
            if self.fits(preset_schedule(name, self.n, self.m))  # below N: what the library runs there
            and all(
                torch.equal(bits(ring_all_reduce(x, "fast", schedule=name)), bits(out))
                for x, out in zip(inputs, outputs, strict=True)
            )
        ]


def fit_ring(trees: Sequence[Tree | None], n: int, dtype_name: str) -> RingSchedule | None:
    """The first ring of the family whose fold of each element's chunk is exactly ``trees``.

    >>> fit_ring([((0, 1), 2), ((1, 2), 0), ((0, 2), 1)], 3, "float32")
    RingSchedule(direction=1, offset=0, layout='even')
    """
    ids, distinct = tree_ids(trees)
    return RingFit(ids, distinct, n, dtype_name).first_ring()
