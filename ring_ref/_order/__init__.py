"""The summation-order model: summation trees, their text, JSON and sums, and the rings that fold them.

A tree says in which order the workers' values of one result element are
added (clause ``reveal-trees``); every tool that reads or writes an order uses
this model: ``ring-ref reveal`` finds the trees, difftest's ``exact`` checks
against them and designs its probes from them, invariance compares them,
the preset vectors and the pictures name them.  The modules, each one job:
``_trees`` (the algebra: leaves, the canonical spelling, folds and
:class:`Fold`), ``_text`` (a tree as text and as pictures order it),
``_json`` (the JSON form, ``spec/reveal.schema.json``), ``_read`` (a
``reveal --json`` document read without recursion), ``_sums`` (a tree's
sum in a dtype, multiway nodes rounded once) and ``_fit`` (each element's
tree under a ring of the schedule family, and which ring a set of trees is).
"""

from ring_ref._order._fit import (
    RingFit,
    chunk_index,
    doubling_tree,
    fit_ring,
    layout_matters,
    layout_sizes,
    ring_trees,
    untold_sizes,
)
from ring_ref._order._json import tree_from_json, tree_json_text, tree_to_json, tree_to_pairs
from ring_ref._order._read import reveal_document
from ring_ref._order._sums import evaluate, exact_sum
from ring_ref._order._text import display_tree, format_tree
from ring_ref._order._trees import (
    Fold,
    Leaves,
    Tree,
    canonical,
    fold_order_of,
    fold_tree,
    leaves,
    ring_step,
    tree_ids,
)

__all__ = [
    "Fold",
    "Leaves",
    "RingFit",
    "Tree",
    "canonical",
    "chunk_index",
    "display_tree",
    "doubling_tree",
    "evaluate",
    "exact_sum",
    "fit_ring",
    "fold_order_of",
    "fold_tree",
    "format_tree",
    "layout_matters",
    "layout_sizes",
    "leaves",
    "reveal_document",
    "ring_step",
    "ring_trees",
    "tree_from_json",
    "tree_ids",
    "tree_json_text",
    "tree_to_json",
    "tree_to_pairs",
    "untold_sizes",
]
