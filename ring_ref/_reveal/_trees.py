"""Summation trees: their algebra (leaves, canonical spelling, folds), their text and JSON, their sums.

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

import json
import math
from collections.abc import Iterator, Sequence
from typing import Any, Final, overload

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._dtypes import FORMATS, FloatFormat

__all__ = [
    "Fold",
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
    "ring_step",
    "tree_from_json",
    "tree_ids",
    "tree_json_text",
    "tree_to_json",
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
    return frozenset(_leaf_list(tree))


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


SPELT_IN_FULL: Final = 64
"""The most workers a tree's text names one by one; larger trees are told in brief (a fold by its
first and last workers and its step, any other tree by its size and depth)."""


def format_tree(tree: Tree) -> str:
    """``fold 3,0,1,2`` for a fold (its :func:`chain_order`), else parentheses; in brief beyond
    :data:`SPELT_IN_FULL` workers (the JSON spells every tree in full).

    >>> format_tree((((0, 3), 1), 2)), format_tree((((3, 2), 1), 0))
    ('fold 3,0,1,2', 'fold 3,2,1,0')
    >>> format_tree(((0, 1), (2, 3))), format_tree(((0, 1), 2, 3))
    ('((0+1)+(2+3))', '((0+1)+2+3)')
    >>> format_tree(fold_tree([*range(5, 70), *range(5)]))
    'fold 5,6,7,8,9,10,...,3,4 (70 workers, stepping +1 around the ring)'
    """
    chain = chain_order(tree)
    if chain is not None and len(chain) > SPELT_IN_FULL:
        step = ring_step(chain)
        how = f"stepping {step:+d} around the ring" if step else "in its own order"
        shown = ",".join(map(str, chain[:6])) + ",...," + ",".join(map(str, chain[-2:]))
        return f"fold {shown} ({len(chain)} workers, {how})"
    if chain is not None and len(chain) > 1:
        return "fold " + ",".join(map(str, chain))
    count = len(_leaf_list(tree))
    if count > SPELT_IN_FULL:
        return f"a tree of {count} workers, {_depth(tree)} additions deep (not a fold)"
    return _parenthesised(tree)


def _depth(tree: Tree) -> int:
    """The most additions on a path from a worker to the root."""
    deepest, stack = 0, [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Fold):
            deepest = max(deepest, depth + len(node.order) - 1)
        elif not isinstance(node, int):
            stack.extend((child, depth + 1) for child in node)
        deepest = max(deepest, depth)
    return deepest


def _parenthesised(tree: Tree) -> str:
    if isinstance(tree, int):
        return str(tree)
    return "(" + "+".join(map(_parenthesised, tree)) + ")"


def tree_to_json(tree: Tree | None) -> Any:
    """A leaf as its worker id, an inner node as ``[left, right]`` (``[a, b, c, ...]`` multiway); ``None`` as
    ``null``."""
    if tree is None or isinstance(tree, int):
        return tree
    if isinstance(tree, Fold):
        workers = tree.order.tolist()
        spelt: list[Any] = [workers[0], workers[1]]
        for w in workers[2:]:
            spelt = [spelt, w]
        return spelt
    return [tree_to_json(child) for child in tree]


def tree_json_text(tree: Tree | None) -> str:
    """``json.dumps(tree_to_json(tree))``, a fold written straight from its order (no nested lists).

    >>> tree_json_text(Fold([0, 2, 1])), tree_json_text(((0, 1), (2, 3))), tree_json_text(None)
    ('[[0, 2], 1]', '[[0, 1], [2, 3]]', 'null')
    """
    if not isinstance(tree, Fold):
        return json.dumps(tree_to_json(tree))
    workers = tree.order.tolist()
    return "[" * (len(workers) - 1) + f"{workers[0]}, {workers[1]}]" + "".join(f", {w}]" for w in workers[2:])


def tree_from_json(doc: Any, n: int) -> Tree:
    """The tree a ``reveal --json`` entry spells, checked: every worker ``0 .. n - 1`` exactly once.

    A fold whose first two workers ascend (as reveal writes every fold) is read as a :class:`Fold`.

    >>> tree_from_json([[0, 1], 2], 3), tree_from_json([0, 1, 2], 3)
    (((0, 1), 2), (0, 1, 2))
    """
    tree = _parse_fold(doc, n) or _parse(doc, n)
    got = sorted(_leaf_list(tree))
    if got != list(range(n)):
        raise ValueError(f"a tree must add every worker 0 .. {n - 1} exactly once; this one adds {got}")
    return tree


def _parse_fold(doc: Any, n: int) -> Fold | None:
    """``doc`` as a :class:`Fold` when it spells a left fold of three or more distinct workers whose
    first two ascend, read without recursion; else ``None``."""
    tail: list[Any] = []
    while isinstance(doc, list) and len(doc) == 2 and isinstance(doc[0], list):
        tail.append(doc[1])
        doc = doc[0]
    if not (isinstance(doc, list) and len(doc) == 2 and tail):
        return None
    order = [*doc, *reversed(tail)]
    if not all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w < n for w in order):
        return None
    if order[0] >= order[1] or len(set(order)) != len(order):
        return None
    return Fold(order)


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
        elif isinstance(node, Fold):
            found.extend(node.order.tolist())
        else:
            stack.extend(reversed(node))
    return found


def evaluate(tree: Tree, x: torch.Tensor) -> torch.Tensor:
    """The tree's additions on ``x`` of shape ``(N, ...)``, each rounded to ``x``'s dtype; a multiway
    node the :func:`exact_sum` of its terms."""
    if isinstance(tree, int):
        return x[tree].clone()
    if isinstance(tree, Fold):
        workers = tree.order.tolist()
        total = torch.add(x[workers[0]], x[workers[1]])
        for w in workers[2:]:
            total = torch.add(total, x[w])
        return total
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
