"""A tree as text, and in the order pictures draw it: a fold named by its adding order, others in parentheses.

Every text and picture of a fold reads it in :func:`~ring_ref._order._trees.fold_order_of`
(clause ``reveal-trees``); trees beyond :data:`SPELT_IN_FULL` workers are told
in brief (the JSON spells every tree in full).
"""

from __future__ import annotations

from typing import Final

from ring_ref._order._trees import Fold, Tree, canonical, fold_order_of, leaf_list, ring_step

__all__ = ["display_tree", "format_tree"]


def display_tree(tree: Tree) -> Tree:
    """``tree`` as pictures draw it: a fold as the left fold of :func:`fold_order_of`, leaves in adding
    order; any other tree canonical.

    >>> display_tree((((0, 3), 1), 2)), display_tree(((0, 1), (2, 3)))
    ((((3, 0), 1), 2), ((0, 1), (2, 3)))
    """
    chain = fold_order_of(tree)
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
    """``fold 3,0,1,2`` for a fold (its :func:`fold_order_of`), else parentheses; in brief beyond
    :data:`SPELT_IN_FULL` workers (the JSON spells every tree in full).

    >>> format_tree((((0, 3), 1), 2)), format_tree((((3, 2), 1), 0))
    ('fold 3,0,1,2', 'fold 3,2,1,0')
    >>> format_tree(((0, 1), (2, 3))), format_tree(((0, 1), 2, 3))
    ('((0+1)+(2+3))', '((0+1)+2+3)')
    >>> format_tree(Fold([*range(5, 70), *range(5)]))
    'fold 5,6,7,8,9,10,...,3,4 (70 workers, stepping +1 around the ring)'
    """
    chain = fold_order_of(tree)
    if chain is not None and len(chain) > SPELT_IN_FULL:
        step = ring_step(chain)
        how = f"stepping {step:+d} around the ring" if step else "in its own order"
        shown = ",".join(map(str, chain[:6])) + ",...," + ",".join(map(str, chain[-2:]))
        return f"fold {shown} ({len(chain)} workers, {how})"
    if chain is not None and len(chain) > 1:
        return "fold " + ",".join(map(str, chain))
    count = len(leaf_list(tree))
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
