"""Stacked targets for ``ring-ref reveal`` at large ``N``, and their trees written out by independent loops.

Each target takes ``(N, M)`` and returns the ``(M,)`` sums, every element in
its own order (element ``e`` starts its folds at ``e mod N``), vectorised with
gathers so that ``N = 4096`` stays cheap.  The expected trees are nested lists
in the canonical spelling of clause ``reveal-trees`` (children with more
leaves first, ties by the smaller smallest leaf), built here by plain loops
and :func:`spelt`, never by ``ring_ref._order``.  ``bench/bench_reveal.py``
measures the same targets.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

Target = Callable[[torch.Tensor], torch.Tensor]
Spelt = Any
"""A tree as nested lists (``reveal --json``'s spelling up to version 2; :func:`flat` gives version 3's)."""


def spelt(tree: Spelt) -> Spelt:
    """``tree`` in the canonical spelling (an independent implementation for the tests)."""
    if isinstance(tree, int):
        return tree
    children = [spelt(child) for child in tree]

    def key(child: Spelt) -> tuple[int, int]:
        found = _leaves(child)
        return -len(found), min(found)

    return sorted(children, key=key)


def _leaves(tree: Spelt) -> list[int]:
    return [tree] if isinstance(tree, int) else [w for child in tree for w in _leaves(child)]


def chain(order: list[Spelt]) -> Spelt:
    """The left fold of ``order`` as nested lists."""
    tree: Spelt = order[0]
    for w in order[1:]:
        tree = [tree, w]
    return tree


def flat(tree: Spelt) -> Spelt:
    """Version 3's spelling of a canonical ``tree`` (spec/reveal.md, ``reveal-json``), typed in from the
    clause: a pair whose first child is a pair is ``{"fold": [...]}``, the items of its left spine."""
    if isinstance(tree, int):
        return tree
    if len(tree) == 2 and isinstance(tree[0], list) and len(tree[0]) == 2:
        items: list[Spelt] = []
        node = tree
        while isinstance(node, list) and len(node) == 2:
            items.insert(0, node[1])
            node = node[0]
        return {"fold": [flat(item) for item in [node, *items]]}
    return [flat(child) for child in tree]


def ring_fold_json(n: int, order: list[int]) -> Spelt:
    """Version 3's spelling of the fold of ``order`` (all ``n`` workers): flat, the first two ascending."""
    assert sorted(order) == list(range(n))
    return {"fold": sorted(order[:2]) + order[2:]}


def _gather_fold(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Per element ``e`` the left fold of ``x[order[:, e], e]`` in ``x``'s dtype."""
    picked = torch.gather(x, 0, order)
    acc = picked[0].clone()
    for t in range(1, order.shape[0]):
        acc = acc + picked[t]
    return acc


def _starts(n: int, m: int) -> torch.Tensor:
    return torch.arange(m) % n


def linear_fold(x: torch.Tensor) -> torch.Tensor:
    """Every element folds workers ``0, 1, ..., N - 1`` (XLA's in-process all-reduce)."""
    acc = x[0].clone()
    for w in range(1, x.shape[0]):
        acc = acc + x[w]
    return acc


def linear_fold_tree(n: int, e: int) -> Spelt:
    return spelt(chain(list(range(n))))


def ring_fold(x: torch.Tensor) -> torch.Tensor:
    """Element ``e`` folds ``s, s + 1, ..., s - 1`` with ``s = e mod N``."""
    n, m = x.shape
    order = (_starts(n, m)[None, :] + torch.arange(n)[:, None]) % n
    return _gather_fold(x, order)


def ring_fold_tree(n: int, e: int) -> Spelt:
    s = e % n
    return spelt(chain([(s + t) % n for t in range(n)]))


def _groups(n: int, size: int) -> list[list[int]]:
    return [list(range(a, min(a + size, n))) for a in range(0, n, size)]


def hierarchical_ring(x: torch.Tensor) -> torch.Tensor:
    """Rings within groups of 8 consecutive workers (the last may be smaller), then a ring across the
    groups' sums; element ``e`` starts each inner fold at member ``e mod size`` and the outer at group
    ``e mod G``."""
    n, m = x.shape
    groups = _groups(n, 8)
    partial = torch.empty((len(groups), m), dtype=x.dtype)
    for g, members in enumerate(groups):
        k = len(members)
        order = members[0] + (_starts(k, m)[None, :] + torch.arange(k)[:, None]) % k
        partial[g] = _gather_fold(x, order)
    return ring_fold(partial)


def hierarchical_ring_tree(n: int, e: int) -> Spelt:
    groups = _groups(n, 8)
    inner = [
        chain([members[(e % len(members) + t) % len(members)] for t in range(len(members))])
        for members in groups
    ]
    big = len(groups)
    return spelt(chain([inner[(e % big + u) % big] for u in range(big)]))


def recursive_doubling(x: torch.Tensor) -> torch.Tensor:
    """MPICH's recursive doubling at any ``N``: the first ``2 r`` workers (``r = N - 2^k``, ``2^k`` the
    largest power of two not above ``N``) add in pairs ``(2i, 2i + 1)``, then the ``2^k`` values are
    combined at distances 1, 2, 4, ...; every element the same tree."""
    n = x.shape[0]
    pof2 = 1 << (n.bit_length() - 1)
    rem = n - pof2
    values = [x[2 * i] + x[2 * i + 1] for i in range(rem)] + [x[w] for w in range(2 * rem, n)]
    while len(values) > 1:  # worker 0's partner at distance d holds the block next to its own
        values = [values[i] + values[i + 1] for i in range(0, len(values), 2)]
    return values[0]


def recursive_doubling_tree(n: int, e: int) -> Spelt:
    pof2 = 1 << (n.bit_length() - 1)
    rem = n - pof2
    level: list[Spelt] = [[2 * i, 2 * i + 1] for i in range(rem)] + list(range(2 * rem, n))
    while len(level) > 1:
        level = [[level[i], level[i + 1]] for i in range(0, len(level), 2)]
    return spelt(level[0])


def _remainder_pairs(n: int) -> tuple[int, int]:
    """MPICH's first step at any ``N``: the largest power of two ``2^k <= N`` and ``r = N - 2^k``; the
    first ``2 r`` workers add in pairs ``(2i, 2i + 1)``."""
    pof2 = 1 << (n.bit_length() - 1)
    return pof2, n - pof2


def recursive_halving(x: torch.Tensor) -> torch.Tensor:
    """Rabenseifner's reduce-scatter by recursive halving (then an all-gather, which copies): after
    the remainder pairs, value ``i`` adds value ``i + 2^(k-1)``, then ``i + 2^(k-2)``, ... (the
    highest distance first); every element the same tree."""
    pof2, rem = _remainder_pairs(x.shape[0])
    values = [x[2 * i] + x[2 * i + 1] for i in range(rem)] + [x[w] for w in range(2 * rem, x.shape[0])]
    half = pof2 // 2
    while half:
        values = [values[i] + values[i + half] for i in range(half)]
        half //= 2
    return values[0]


def recursive_halving_tree(n: int, e: int) -> Spelt:
    pof2, rem = _remainder_pairs(n)
    level: list[Spelt] = [[2 * i, 2 * i + 1] for i in range(rem)] + list(range(2 * rem, n))
    half = pof2 // 2
    while half:
        level = [[level[i], level[i + half]] for i in range(half)]
        half //= 2
    return spelt(level[0])


def tree_of_chains(x: torch.Tensor) -> torch.Tensor:
    """Each group of 8 consecutive workers folded in order (a chain inside a node), then the groups'
    sums combined by recursive doubling (a binary tree over the groups)."""
    sums = [linear_fold(x[members[0] : members[-1] + 1]) for members in _groups(x.shape[0], 8)]
    return recursive_doubling(torch.stack(sums))


def tree_of_chains_tree(n: int, e: int) -> Spelt:
    chains: list[Spelt] = [chain(list(members)) for members in _groups(n, 8)]
    _, rem = _remainder_pairs(len(chains))
    level = [[chains[2 * i], chains[2 * i + 1]] for i in range(rem)] + chains[2 * rem :]
    while len(level) > 1:
        level = [[level[i], level[i + 1]] for i in range(0, len(level), 2)]
    return spelt(level[0])


def _fused(parts: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """One addition of several terms: their exact sum (float64 holds it here), rounded once."""
    return torch.stack(parts).to(torch.float64).sum(0).to(dtype)


def fused_groups(x: torch.Tensor) -> torch.Tensor:
    """Each group of 8 consecutive workers added in one fused (multiway) addition, then a ring across
    the groups' sums starting at group ``e mod G`` (NVLS-like: a switch reduces a node's GPUs at once)."""
    groups = _groups(x.shape[0], 8)
    partial = torch.stack([_fused([x[w] for w in members], x.dtype) for members in groups])
    return ring_fold(partial)


def fused_groups_tree(n: int, e: int) -> Spelt:
    groups: list[Spelt] = [members if len(members) >= 3 else chain(members) for members in _groups(n, 8)]
    big = len(groups)
    return spelt(chain([groups[(e % big + u) % big] for u in range(big)]))


def three_chains_fused(x: torch.Tensor) -> torch.Tensor:
    """Three chains of ``N / 3`` workers each (the last takes the rest), their sums added in one fused
    three-term addition: a multiway node whose terms are subtrees of several leaves."""
    n = x.shape[0]
    third = n // 3
    bounds = [(0, third), (third, 2 * third), (2 * third, n)]
    return _fused([linear_fold(x[a:b]) for a, b in bounds], x.dtype)


def three_chains_fused_tree(n: int, e: int) -> Spelt:
    third = n // 3
    bounds = [(0, third), (third, 2 * third), (2 * third, n)]
    return spelt([chain(list(range(a, b))) for a, b in bounds])


def wide_accumulator(x: torch.Tensor) -> torch.Tensor:
    """Float64 accumulation of narrower data, rounded once: the exact sum correctly rounded here."""
    return x.to(torch.float64).sum(0).to(x.dtype)


def fsum_accumulator(x: torch.Tensor) -> torch.Tensor:
    """``math.fsum`` per element: the exact sum correctly rounded in float64 (a compensated sum)."""
    columns = x.to(torch.float64).T.tolist()
    return torch.tensor([math.fsum(column) for column in columns], dtype=torch.float64).to(x.dtype)


def sorted_sum(x: torch.Tensor) -> torch.Tensor:
    """Adds each element's values in order of magnitude: an order that depends on the data (no tree)."""
    order = torch.argsort(x.abs(), dim=0, stable=True)
    return _gather_fold(x, order)


TREES: dict[str, tuple[Target, Callable[[int, int], Spelt]]] = {
    "linear fold": (linear_fold, linear_fold_tree),
    "ring fold": (ring_fold, ring_fold_tree),
    "hierarchical ring": (hierarchical_ring, hierarchical_ring_tree),
    "recursive doubling": (recursive_doubling, recursive_doubling_tree),
    "recursive halving": (recursive_halving, recursive_halving_tree),
    "tree of chains": (tree_of_chains, tree_of_chains_tree),
    "fused groups": (fused_groups, fused_groups_tree),
    "three chains fused": (three_chains_fused, three_chains_fused_tree),
}
"""The targets with a tree, and each element's tree (``tree(n, e)``)."""
