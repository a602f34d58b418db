"""A tree's JSON form (``reveal --json``, ``spec/reveal.schema.json``): written, and read back checked.

A leaf is its worker id, an inner node the list of its children; a fold is
written straight from its order and read back as a :class:`~ring_ref._order._trees.Fold`.
"""

from __future__ import annotations

import json
from typing import Any

from ring_ref._order._trees import Fold, Tree, leaf_list

__all__ = ["tree_from_json", "tree_json_text", "tree_to_json"]


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
    got = sorted(leaf_list(tree))
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
