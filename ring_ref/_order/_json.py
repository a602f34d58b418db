"""A tree's JSON form (``reveal --json``, ``spec/reveal.schema.json``): written, and read back checked.

A leaf is its worker id, an inner node the list of its children; a fold (a
chain of additions) is written flat, ``{"fold": [a, b, c, ...]}`` for
``((a + b) + c) + ...`` (version 3), so that no tree nests deeper than its
structure other than folds.  Trees are read back in every version's spelling
(version 1 and 2 wrote folds as nested pairs), without recursion; a fold of
workers comes back as a :class:`~ring_ref._order._trees.Fold`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ring_ref._order._trees import Fold, Tree, leaf_list

__all__ = ["tree_from_json", "tree_json_text", "tree_to_json", "tree_to_pairs"]


def _is_pair(node: Tree) -> bool:
    return isinstance(node, Fold) or (isinstance(node, tuple) and len(node) == 2)


def _spelling(node: tuple[Tree, ...] | Fold) -> tuple[bool, list[Tree]]:
    """``(is_fold, items)``: a pair whose first child is a pair is the fold of its left spine (the
    items in adding order); any other inner node is the list of its children."""
    if isinstance(node, Fold):
        return True, list(node.order.tolist())
    if len(node) != 2 or not _is_pair(node[0]):
        return False, list(node)
    tail: list[Tree] = []
    head: Tree = node
    while not isinstance(head, Fold) and _is_pair(head) and _is_pair(head[0]):  # type: ignore[index]
        tail.append(head[1])  # type: ignore[index]
        head = head[0]  # type: ignore[index]
    first = head.order.tolist() if isinstance(head, Fold) else list(head)  # type: ignore[arg-type]
    return True, [*first, *reversed(tail)]


def tree_to_json(tree: Tree | None) -> Any:
    """Version 3: a leaf as its worker id, a fold as ``{"fold": [a, b, c, ...]}`` (its items, workers or
    subtrees, in adding order), any other inner node as ``[left, right]`` (``[a, b, c, ...]``
    multiway); ``None`` as ``null``.  Written without recursion.

    >>> tree_to_json(Fold([0, 2, 1])), tree_to_json((((0, 1), (2, 3)), 4)), tree_to_json((0, 1, 2))
    ({'fold': [0, 2, 1]}, {'fold': [0, 1, [2, 3], 4]}, [0, 1, 2])
    """
    if tree is None or isinstance(tree, int):
        return tree
    root: list[Any] = []
    stack: list[tuple[Tree, list[Any]]] = [(tree, root)]
    while stack:
        node, into = stack.pop()
        if isinstance(node, int):
            into.append(node)
            continue
        is_fold, items = _spelling(node)
        spelt: list[Any] = []
        into.append({"fold": spelt} if is_fold else spelt)
        stack.extend((item, spelt) for item in reversed(items))
    return root[0]


def tree_to_pairs(tree: Tree | None) -> Any:
    """Versions 1 and 2 (and ``ring-ref invariance --json``): every inner node as the list of its
    children, a fold as nested pairs ``[[a, b], c]``; ``None`` as ``null``.

    >>> tree_to_pairs(Fold([0, 2, 1])), tree_to_pairs(((0, 1), (2, 3))), tree_to_pairs(None)
    ([[0, 2], 1], [[0, 1], [2, 3]], None)
    """
    if tree is None or isinstance(tree, int):
        return tree
    if isinstance(tree, Fold):
        workers = tree.order.tolist()
        spelt: list[Any] = [workers[0], workers[1]]
        for w in workers[2:]:
            spelt = [spelt, w]
        return spelt
    return [tree_to_pairs(child) for child in tree]


def tree_json_text(tree: Tree | None) -> str:
    """``json.dumps(tree_to_json(tree))``: the text ``reveal --json`` writes for one tree.

    >>> tree_json_text(Fold([0, 2, 1])), tree_json_text(((0, 1), 2)), tree_json_text(None)
    ('{"fold": [0, 2, 1]}', '{"fold": [0, 1, 2]}', 'null')
    """
    return json.dumps(tree_to_json(tree))


def tree_from_json(doc: Any, n: int) -> Tree:
    """The tree a ``reveal --json`` entry spells (any version), checked: every worker ``0 .. n - 1``
    exactly once.  Read without recursion, however deep its nesting.

    A fold of workers whose first two ascend (as reveal writes every fold), ``{"fold": [...]}`` or
    nested pairs, is read as a :class:`Fold`; a fold's items may be a list or an array of ints.

    >>> tree_from_json([[0, 1], 2], 3), tree_from_json({"fold": [0, 1, [2, 3]]}, 4)
    (((0, 1), 2), ((0, 1), (2, 3)))
    >>> tree_from_json([0, 1, 2], 3)
    (0, 1, 2)
    """
    tree = _parse(doc, n)
    if isinstance(tree, Fold):
        got = np.sort(tree.order)
        if len(got) == n and bool((got == np.arange(n)).all()):
            return tree
    got_list = sorted(leaf_list(tree))
    if got_list != list(range(n)):
        raise ValueError(f"a tree must add every worker 0 .. {n - 1} exactly once; this one adds {got_list}")
    return tree


def _is_worker(doc: Any, n: int) -> bool:
    return isinstance(doc, int | np.integer) and not isinstance(doc, bool) and 0 <= int(doc) < n


def _bad(doc: Any, n: int) -> ValueError:
    text = repr(doc)
    return ValueError(
        f"a tree node must be a worker id in 0 .. {n - 1}, a list of two or more nodes or "
        f'{{"fold": [two or more nodes]}}; got {text if len(text) <= 200 else text[:200] + " ..."}'
    )


def _fold_items(doc: Any) -> Any:
    """The items of ``{"fold": items}`` (a list or an array of two or more), else ``None``."""
    if not (isinstance(doc, dict) and list(doc) == ["fold"]):
        return None
    items = doc["fold"]
    if isinstance(items, np.ndarray) and items.ndim == 1 and items.dtype.kind in "iu" and len(items) >= 2:
        return items
    if isinstance(items, list) and len(items) >= 2:
        return items
    return None


def _chain(order: list[int] | np.ndarray[Any, Any]) -> Tree:
    """The left fold of ``order`` (workers), a :class:`Fold` where it can be one: an array of ``int32``
    (as :mod:`~ring_ref._order._read` makes them) becomes the fold's own, not copied."""
    array = order if isinstance(order, np.ndarray) else np.array(order, dtype=np.int64)
    if (
        len(array) >= 3
        and array[0] < array[1]
        and array.max() < 2**31
        and len(np.unique(array)) == len(array)
    ):
        held = array.astype(np.int32, copy=False)
        held.flags.writeable = False
        return Fold._view(held)
    workers = array.tolist()
    tree: Tree = (workers[0], workers[1])
    for w in workers[2:]:
        tree = (tree, w)
    return tree


def _workers_only(doc: Any, n: int) -> Tree | None:
    """``doc`` read at once where it is a leaf or a fold of workers only (any spelling); else ``None``."""
    if _is_worker(doc, n):
        return int(doc)
    items = _fold_items(doc)
    if items is None:
        return _pairs_chain(doc, n)
    if isinstance(items, np.ndarray):
        if not bool(((items >= 0) & (items < n)).all()):
            raise _bad(doc, n)
        return _chain(items)
    if all(_is_worker(w, n) for w in items):
        return _chain(items)
    return None


def _pairs_chain(doc: Any, n: int) -> Tree | None:
    """``doc`` as a fold when it spells one of three or more workers as nested pairs (versions 1 and
    2), read without recursion; else ``None``."""
    tail: list[Any] = []
    while isinstance(doc, list) and len(doc) == 2 and isinstance(doc[0], list):
        tail.append(doc[1])
        doc = doc[0]
    if not (isinstance(doc, list) and len(doc) == 2 and tail):
        return None
    order = [*doc, *reversed(tail)]
    if not all(_is_worker(w, n) for w in order):
        return None
    return _chain(order)


def _parse(doc: Any, n: int) -> Tree:
    """Post-order over an explicit stack: each node's children read before it."""
    done: list[Tree] = []
    stack: list[tuple[Any, int, bool]] = [(doc, -1, False)]
    while stack:
        node, count, is_fold = stack.pop()
        if count >= 0:
            kids = done[len(done) - count :]
            del done[len(done) - count :]
            tree: Tree = tuple(kids)
            if is_fold:
                tree = (kids[0], kids[1])
                for kid in kids[2:]:
                    tree = (tree, kid)
            done.append(tree)
            continue
        quick = _workers_only(node, n)
        if quick is not None:
            done.append(quick)
            continue
        items = _fold_items(node)
        children = items if items is not None else node
        if not (isinstance(children, list | np.ndarray) and len(children) >= 2):
            raise _bad(node, n)
        stack.append((node, len(children), items is not None))
        stack.extend((child, -1, False) for child in reversed(list(children)))
    return done[0]
