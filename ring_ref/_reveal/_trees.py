"""Summation trees: their algebra (leaves, canonical spelling, folds), their text and JSON, their sums.

A tree is a worker id, or ``(left, right)`` meaning ``left + right`` in the
dtype, or ``(a, b, c, ...)``: a multiway node adding ``k >= 3`` terms in one
rounding (the exact sum of its terms, correctly rounded; clause
``reveal-multiway``).  Addition is commutative, so a tree has one canonical
spelling (clause ``reveal-trees``); a fold of workers in some order is a chain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._dtypes import FORMATS, FloatFormat

__all__ = [
    "Leaves",
    "Tree",
    "canonical",
    "chain_order",
    "display_tree",
    "evaluate",
    "exact_sum",
    "fold_tree",
    "format_tree",
    "leaves",
    "tree_from_json",
    "tree_ids",
    "tree_to_json",
]

Tree = int | tuple["Tree", ...]
"""A summation tree: a worker id, ``(left, right)`` meaning ``left + right``, or a multiway node of
``k >= 3`` terms rounded once."""

Leaves = frozenset[int]
"""The workers of a subtree."""


def tree_ids(trees: Sequence[Tree | None]) -> tuple[npt.NDArray[np.int64], list[Tree]]:
    """Each element's tree as an index into the distinct trees (``-1`` for ``None``), and those trees.

    Equal trees are usually the same object, so most elements cost one ``id`` lookup.

    >>> tree_ids([(0, 1), None, (0, 1)])
    (array([ 0, -1,  0]), [(0, 1)])
    """
    by_object: dict[int, int] = {}
    by_value: dict[Tree, int] = {}
    out = np.empty(len(trees), dtype=np.int64)
    for e, tree in enumerate(trees):
        if tree is None:
            out[e] = -1
            continue
        k = by_object.get(id(tree))
        if k is None:
            k = by_object[id(tree)] = by_value.setdefault(tree, len(by_value))
        out[e] = k
    return out, list(by_value)


def leaves(tree: Tree) -> Leaves:
    """The workers a tree adds.

    >>> sorted(leaves(((2, 0), 1)))
    [0, 1, 2]
    """
    return frozenset(_leaf_list(tree))


def canonical(tree: Tree) -> Tree:
    """The one spelling of a tree: in every node the children with more leaves first, ties by smallest leaf.

    Addition is commutative, so ``(a, b)`` and ``(b, a)`` give the same bits and
    no output can tell them apart; this picks one.

    >>> canonical((3, (1, (2, 0)))), canonical((4, (1, 0), 2, 3))
    ((((0, 2), 1), 3), ((0, 1), 2, 3, 4))
    """
    done: list[tuple[Tree, int, int]] = []
    stack: list[tuple[Tree, bool]] = [(tree, False)]
    while stack:
        node, ready = stack.pop()
        if isinstance(node, int):
            done.append((node, 1, node))
        elif not ready:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node))
        else:
            children = sorted(done[len(done) - len(node) :], key=lambda c: (-c[1], c[2]))
            del done[len(done) - len(node) :]
            size, low = sum(c[1] for c in children), min(c[2] for c in children)
            done.append((tuple(c[0] for c in children), size, low))
    return done[0][0]


def fold_tree(order: Sequence[int]) -> Tree:
    """The left fold ``((w0 + w1) + w2) + ...`` of ``order``, canonical.

    >>> fold_tree([3, 2, 1, 0])
    (((2, 3), 1), 0)
    """
    tree: Tree = order[0]
    for w in order[1:]:
        tree = (tree, w)
    return canonical(tree)


def chain_order(tree: Tree) -> list[int] | None:
    """The workers in the order a fold adds them, if ``tree`` is a full tree that is a fold.

    The first two commute, so one rule picks their order (clause
    ``reveal-trees``): the chain reads in one ring direction, the first step
    equal to the second modulo ``N`` (the number of leaves); where both orders
    do (``N = 3``) the one stepping ``+1``, where neither does (or ``N = 2``)
    the smaller worker first.  Every text and picture of a fold uses it.

    >>> chain_order((((0, 3), 1), 2)), chain_order((((2, 3), 1), 0)), chain_order(((0, 1), (2, 3)))
    ([3, 0, 1, 2], [3, 2, 1, 0], None)
    >>> chain_order(((1, 2), 0)), chain_order(((0, 2), 1)), chain_order((0, 1))
    ([1, 2, 0], [2, 0, 1], [0, 1])
    """
    tail: list[int] = []
    while not isinstance(tree, int):
        if len(tree) != 2:
            return None
        a, b = tree
        if isinstance(b, int):
            tail.append(b)
            tree = a
        elif isinstance(a, int):
            tail.append(a)
            tree = b
        else:
            return None
    chain = [tree, *reversed(tail)]
    if len(chain) < 3:
        return sorted(chain)
    n, (a, b, c) = len(chain), sorted(chain[:2]) + chain[2:3]
    forward, backward = (b - a) % n == (c - b) % n, (a - b) % n == (c - a) % n
    first = (b, a) if backward and not (forward and (b - a) % n == 1) else (a, b)
    return [*first, *chain[2:]]


def display_tree(tree: Tree) -> Tree:
    """``tree`` as pictures draw it: a fold as the left fold of :func:`chain_order`, leaves in adding
    order; any other tree canonical.

    >>> display_tree((((0, 3), 1), 2)), display_tree(((0, 1), (2, 3)))
    ((((3, 0), 1), 2), ((0, 1), (2, 3)))
    """
    chain = chain_order(tree)
    if chain is None:
        return canonical(tree)
    shown: Tree = chain[0]
    for w in chain[1:]:
        shown = (shown, w)
    return shown


def format_tree(tree: Tree) -> str:
    """``fold 3,0,1,2`` for a fold (its :func:`chain_order`), else parentheses.

    >>> format_tree((((0, 3), 1), 2)), format_tree((((3, 2), 1), 0))
    ('fold 3,0,1,2', 'fold 3,2,1,0')
    >>> format_tree(((0, 1), (2, 3))), format_tree(((0, 1), 2, 3))
    ('((0+1)+(2+3))', '((0+1)+2+3)')
    """
    chain = chain_order(tree)
    if chain is not None and len(chain) > 1:
        return "fold " + ",".join(map(str, chain))
    return _parenthesised(tree)


def _parenthesised(tree: Tree) -> str:
    if isinstance(tree, int):
        return str(tree)
    return "(" + "+".join(map(_parenthesised, tree)) + ")"


def tree_to_json(tree: Tree | None) -> Any:
    """A leaf as its worker id, an inner node as ``[left, right]`` (``[a, b, c, ...]`` multiway); ``None`` as
    ``null``."""
    if tree is None or isinstance(tree, int):
        return tree
    return [tree_to_json(child) for child in tree]


def tree_from_json(doc: Any, n: int) -> Tree:
    """The tree a ``reveal --json`` entry spells, checked: every worker ``0 .. n - 1`` exactly once.

    >>> tree_from_json([[0, 1], 2], 3), tree_from_json([0, 1, 2], 3)
    (((0, 1), 2), (0, 1, 2))
    """
    tree = _parse(doc, n)
    got = sorted(_leaf_list(tree))
    if got != list(range(n)):
        raise ValueError(f"a tree must add every worker 0 .. {n - 1} exactly once; this one adds {got}")
    return tree


def _parse(doc: Any, n: int) -> Tree:
    if isinstance(doc, int) and not isinstance(doc, bool) and 0 <= doc < n:
        return doc
    if isinstance(doc, list) and len(doc) >= 2:
        return tuple(_parse(child, n) for child in doc)
    raise ValueError(
        f"a tree node must be a worker id in 0 .. {n - 1} or a list of two or more nodes; got {doc!r}"
    )


def _leaf_list(tree: Tree) -> list[int]:
    found: list[int] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, int):
            found.append(node)
        else:
            stack.extend(reversed(node))
    return found


def evaluate(tree: Tree, x: torch.Tensor) -> torch.Tensor:
    """The tree's additions on ``x`` of shape ``(N, ...)``, each rounded to ``x``'s dtype; a multiway
    node the :func:`exact_sum` of its terms."""
    if isinstance(tree, int):
        return x[tree].clone()
    if len(tree) == 2:
        return torch.add(evaluate(tree[0], x), evaluate(tree[1], x))
    return exact_sum(torch.stack([evaluate(child, x) for child in tree]))


def _quantum(values: npt.NDArray[np.float64], fmt: FloatFormat) -> npt.NDArray[np.float64]:
    """The spacing of ``fmt``'s values at each of ``values`` (its subnormal spacing below ``2**emin``)."""
    _, exponent = np.frexp(np.where(values == 0, 1.0, values))
    quantum: npt.NDArray[np.float64] = np.ldexp(1.0, np.maximum(exponent - 1, fmt.emin) - fmt.precision + 1)
    return quantum


def _round_to(values: npt.NDArray[np.float64], fmt: FloatFormat) -> npt.NDArray[np.float64]:
    """Float64 ``values`` correctly rounded to ``fmt`` (to nearest, ties to even; beyond it +-inf)."""
    quantum = _quantum(values, fmt)
    rounded = np.round(values / quantum) * quantum
    return np.where(np.abs(rounded) > fmt.max_finite, np.copysign(np.inf, values), rounded)


def exact_sum(parts: torch.Tensor) -> torch.Tensor:
    """The exact sum over the first axis of ``parts``, correctly rounded once to its dtype.

    Summed in float64 where that is exact (the terms' finest spacing and total
    magnitude within 53 bits), else per element with ``math.fsum`` (and, where
    that lands on a tie of a narrower dtype, the sign of its residual).

    >>> exact_sum(torch.tensor([[1.0], [2.0**-24], [2.0**-60]])).item() == 1 + 2.0**-23
    True
    """
    fmt = FORMATS[str(parts.dtype).removeprefix("torch.")]
    wide = parts.to(torch.float64).reshape(parts.shape[0], -1).numpy()
    total = wide.sum(axis=0)
    exact = np.abs(wide).sum(axis=0) < _quantum(wide, fmt).min(axis=0) * 2.0**53
    for e in np.flatnonzero(~exact & np.isfinite(wide).all(axis=0)).tolist():
        column = wide[:, e].tolist()
        total[e] = math.fsum(column)
        tie = fmt.precision < 53 and abs(total[e] / _quantum(total[e : e + 1], fmt)[0] % 1) == 0.5
        residual = math.fsum([*column, -total[e]]) if tie else 0.0
        if residual:
            total[e] = np.nextafter(total[e], math.copysign(math.inf, residual))
    rounded = _round_to(total, fmt) if fmt.precision < 53 else total
    return torch.from_numpy(rounded.reshape(parts.shape[1:])).to(parts.dtype)
