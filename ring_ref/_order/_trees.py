"""Summation trees: their algebra (leaves, canonical spelling, folds and the order a fold adds in).

A tree is a worker id, or ``(left, right)`` meaning ``left + right`` in the
dtype, or ``(a, b, c, ...)``: a multiway node adding ``k >= 3`` terms in one
rounding (the exact sum of its terms, correctly rounded; clause
``reveal-multiway``).  Addition is commutative, so a tree has one canonical
spelling (clause ``reveal-trees``); a fold of workers in some order is a chain.
A fold of three or more workers may be held as a :class:`Fold`: its order in
one array, equal to (and hashing as) the nested pairs it stands for, so that
``N`` distinct folds of ``N`` workers take ``4 N^2`` bytes, not ``N^2`` tuples.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "Fold",
    "Leaves",
    "Tree",
    "canonical",
    "fold_order_of",
    "fold_tree",
    "leaf_list",
    "leaves",
    "ring_step",
    "tree_ids",
]


class Fold(Sequence["Tree"]):
    """The canonical left fold of ``order`` (three or more workers, the first two ascending), held as
    that order: the pair ``(head, order[-1])``, ``head`` the fold of ``order[:-1]`` (a plain pair
    for two workers), made when asked for.

    It is equal to the nested pairs it stands for, and hashes as they do, so it can stand wherever
    a tree does; walking it makes its heads one at a time, as views of one array.

    >>> f = Fold([0, 3, 1, 2])
    >>> f == (((0, 3), 1), 2), hash(f) == hash((((0, 3), 1), 2)), f[0], len(f)
    (True, True, ((0, 3), 1), 2)
    """

    __slots__ = ("_hash", "order")

    def __init__(self, order: Sequence[int] | npt.NDArray[np.integer[Any]]) -> None:
        array = np.array(order, dtype=np.int32)
        if array.ndim != 1 or len(array) < 3 or array[0] >= array[1] or len(np.unique(array)) != len(array):
            raise ValueError(
                f"a Fold holds three or more distinct workers, the first two ascending; got {array.tolist()}"
            )
        array.flags.writeable = False
        self.order: npt.NDArray[np.int32] = array
        self._hash: int | None = None

    @classmethod
    def _view(cls, order: npt.NDArray[np.int32]) -> Fold:
        """A fold of a prefix of another fold's (checked) order, sharing its memory."""
        fold = cls.__new__(cls)
        fold.order, fold._hash = order, None
        return fold

    def _head(self) -> Tree:
        if len(self.order) == 3:
            return (int(self.order[0]), int(self.order[1]))
        return Fold._view(self.order[:-1])

    def __len__(self) -> int:
        return 2

    @overload
    def __getitem__(self, index: int) -> Tree: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Tree, ...]: ...
    def __getitem__(self, index: int | slice) -> Tree | tuple[Tree, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index in (0, -2):
            return self._head()
        if index in (1, -1):
            return int(self.order[-1])
        raise IndexError("a fold is a pair")

    def __iter__(self) -> Iterator[Tree]:
        yield self._head()
        yield int(self.order[-1])

    def nested(self) -> tuple[Tree, ...]:
        """The nested pairs this fold stands for."""
        workers = self.order.tolist()
        tree: tuple[Tree, ...] = (workers[0], workers[1])
        for w in workers[2:]:
            tree = (tree, w)
        return tree

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Fold):
            return bool(np.array_equal(self.order, other.order))
        if isinstance(other, tuple):
            return self.nested() == other
        return NotImplemented

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self.nested())
        return self._hash

    def __repr__(self) -> str:
        return repr(self.nested())

    def __reduce__(self) -> tuple[type[Fold], tuple[list[int]]]:
        return Fold, (self.order.tolist(),)


Tree = int | tuple["Tree", ...] | Fold
"""A summation tree: a worker id, ``(left, right)`` meaning ``left + right``, or a multiway node of
``k >= 3`` terms rounded once (a fold may be a :class:`Fold`)."""

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
    return frozenset(leaf_list(tree))


def leaf_list(tree: Tree) -> list[int]:
    """Every worker a tree names, in its order, repeats kept (a tree read from JSON is checked by them).

    >>> leaf_list(((2, 0), 1))
    [2, 0, 1]
    """
    found: list[int] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, int):
            found.append(node)
        elif isinstance(node, Fold):
            found.extend(node.order.tolist())
        else:
            stack.extend(reversed(node))
    return found


def canonical(tree: Tree) -> Tree:
    """The one spelling of a tree: in every node the children with more leaves first, ties by smallest leaf.

    Addition is commutative, so ``(a, b)`` and ``(b, a)`` give the same bits and
    no output can tell them apart; this picks one.

    >>> canonical((3, (1, (2, 0)))), canonical((4, (1, 0), 2, 3))
    ((((0, 2), 1), 3), ((0, 1), 2, 3, 4))
    """
    if isinstance(tree, Fold):
        return tree
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
    if len(order) >= 3:
        first, second = sorted(order[:2])
        return Fold([first, second, *order[2:]])
    tree: Tree = order[0]
    for w in order[1:]:
        tree = (tree, w)
    return canonical(tree)


def fold_order_of(tree: Tree) -> list[int] | None:
    """The workers in the order a fold adds them, if ``tree`` is a full tree that is a fold (else ``None``).

    The first two commute, so one rule picks their order (clause
    ``reveal-trees``): the chain reads in one ring direction, the first step
    equal to the second modulo ``N`` (the number of leaves); where both orders
    do (``N = 3``) the one stepping ``+1``, where neither does (or ``N = 2``)
    the smaller worker first.  Every text and picture of a fold uses it.

    >>> fold_order_of((((0, 3), 1), 2)), fold_order_of((((2, 3), 1), 0)), fold_order_of(((0, 1), (2, 3)))
    ([3, 0, 1, 2], [3, 2, 1, 0], None)
    >>> fold_order_of(((1, 2), 0)), fold_order_of(((0, 2), 1)), fold_order_of((0, 1))
    ([1, 2, 0], [2, 0, 1], [0, 1])
    """
    tail: list[int] = []
    if isinstance(tree, Fold):
        tail = tree.order[:0:-1].tolist()
        tree = int(tree.order[0])
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


def ring_step(chain: Sequence[int]) -> int:
    """``+1`` or ``-1`` when every step of ``chain`` (a fold's workers in adding order, all ``N`` of
    them) goes one way around the ring of ``N = len(chain)``; ``0`` otherwise, and for ``N < 3``,
    where the two ways are one.

    >>> ring_step([2, 3, 0, 1]), ring_step([2, 1, 0, 3]), ring_step([0, 2, 1, 3])
    (1, -1, 0)
    """
    n = len(chain)
    if n < 3:
        return 0
    steps: npt.NDArray[np.int64] = np.mod(np.diff(np.asarray(chain, dtype=np.int64)), n)
    step = int(steps[0])
    return {1: 1, n - 1: -1}.get(step, 0) if bool((steps == step).all()) else 0
