"""How ``reveal`` holds large results: folds as one array each, trees told in brief, checking inputs replayed.

The nested pairs every expectation compares with are built here by plain
loops (never by ``ring_ref._reveal``); ``Fold`` must be equal to them, hash as
they do and walk as they do, so that nothing downstream can tell the two apart.
"""

from __future__ import annotations

import json
import pickle
import sys
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import numpy as np
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._order import (
    Fold,
    canonical,
    evaluate,
    fold_order_of,
    format_tree,
    leaves,
    ring_trees,
    tree_from_json,
    tree_ids,
    tree_to_json,
    tree_to_pairs,
)
from ring_ref._reveal import Revealed, reveal
from ring_ref._reveal._check import check_on_random_inputs
from ring_ref._svg import reveal_svg
from ring_ref.schedule import RingSchedule
from tests.common import reveal_targets as rt
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "reveal.schema.json").read_text(encoding="utf-8"))


def nested(order: list[int]) -> Any:
    """The left fold of ``order``, the first two ascending, as nested tuples."""
    tree: Any = (min(order[:2]), max(order[:2]))
    for w in order[2:]:
        tree = (tree, w)
    return tree


ORDERS = [[0, 1, 2], [1, 3, 0, 2], [2, 5, 4, 3, 1, 0], list(range(40))]


@pytest.mark.clause("reveal-trees", "reveal-counts")
@pytest.mark.parametrize("order", ORDERS, ids=lambda o: f"n{len(o)}")
def test_a_fold_is_equal_to_its_nested_pairs_and_hashes_as_they_do(order: list[int]) -> None:
    fold, pairs = Fold(order), nested(order)
    assert fold == pairs and pairs == fold and fold == Fold(order)
    assert hash(fold) == hash(pairs)
    assert {pairs: "found"}[fold] == "found"
    assert len(fold) == 2 and fold[1] == order[-1] and fold[-1] == order[-1]
    assert fold[0] == pairs[0] and list(fold) == list(pairs) and fold[:] == pairs[:]
    assert repr(fold) == repr(pairs)
    assert canonical(fold) is fold and canonical(pairs) == fold
    assert fold_order_of(fold) == fold_order_of(pairs)
    assert sorted(leaves(fold)) == sorted(order)
    assert tree_to_pairs(fold) == tree_to_pairs(pairs) == json_fold(order)
    assert tree_to_json(fold) == tree_to_json(pairs) == {"fold": sorted(order[:2]) + order[2:]}
    assert pickle.loads(pickle.dumps(fold)) == pairs


def json_fold(order: list[int]) -> Any:
    spelt: Any = sorted(order[:2])
    for w in order[2:]:
        spelt = [spelt, w]
    return spelt


def test_a_fold_differs_from_other_trees() -> None:
    fold = Fold([0, 1, 2, 3])
    assert fold != Fold([0, 1, 3, 2])
    assert fold not in ((((0, 1), 3), 2), ((0, 1), (2, 3)), "fold", 3)


@pytest.mark.parametrize("order", [[0, 1], [1, 0, 2], [0, 1, 1], [[0, 1], [2, 3]]])
def test_a_fold_refuses_what_is_not_one(order: Any) -> None:
    with pytest.raises(ValueError, match="a Fold holds three or more distinct workers"):
        Fold(order)


def test_a_fold_evaluates_as_its_nested_pairs() -> None:
    x = torch.randn(6, 50)
    order = [2, 5, 4, 3, 1, 0]
    expected = x[2] + x[5]
    for w in order[2:]:
        expected = expected + x[w]
    assert torch.equal(evaluate(Fold(order), x), expected)


@pytest.mark.clause("reveal-report")
def test_trees_beyond_64_workers_are_told_in_brief() -> None:
    ring = [(5 + t) % 70 for t in range(70)]
    assert format_tree(Fold(ring)) == "fold 5,6,7,8,9,10,...,3,4 (70 workers, stepping +1 around the ring)"
    down = [(5 - t) % 70 for t in range(70)]
    assert format_tree(Fold(sorted(down[:2]) + down[2:])).endswith(
        "(70 workers, stepping -1 around the ring)"
    )
    scattered = [0, 2, 1, *range(3, 70)]
    assert format_tree(Fold(scattered)).endswith("(70 workers, in its own order)")
    balanced: Any = list(range(128))
    while len(balanced) > 1:
        balanced = [(balanced[i], balanced[i + 1]) for i in range(0, len(balanced), 2)]
    assert format_tree(balanced[0]) == "a tree of 128 workers, 7 additions deep (not a fold)"
    assert format_tree(nested(list(range(64)))) == "fold " + ",".join(map(str, range(64)))


@pytest.mark.clause("reveal-counts")
def test_revealed_folds_are_held_as_one_array_each() -> None:
    """Every element of the spec's ring at ``N = 64`` (count probes; element ``e`` folds ``e, e + 1,
    ...``) has its own fold, held as a ``Fold``; the JSON spells each in full, as the loops of
    ``tests/common/reveal_targets.py`` do (flat, version 3)."""
    n = 64
    found = reveal(lambda x: ring_all_reduce(x, "fast"), n, n, checks=1)
    assert all(isinstance(tree, Fold) for tree in found.distinct())
    assert found.to_json()["trees"] == [rt.flat(rt.ring_fold_tree(n, e)) for e in range(n)]


@pytest.mark.clause("reveal-counts")
def test_the_checking_inputs_are_replayed_bit_for_bit() -> None:
    """The inputs are not held: they are made again from the generator's state, equal to those the
    target was called on."""
    seen: list[torch.Tensor] = []

    def target(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return rt.linear_fold(x)

    verdicts: list[Any] = [(Fold(list(range(5))), None)]
    inputs, _ = check_on_random_inputs(
        target, verdicts, np.zeros(7, np.int64), 5, "float16", checks=3, seed=11
    )
    assert len(inputs) == 3 and len(seen) == 3
    for made, called in zip(inputs, seen, strict=True):
        assert made.dtype == torch.float16 and torch.equal(made.view(torch.int16), called.view(torch.int16))
    assert verdicts == [(nested(list(range(5))), None)], "the tree was right: no verdict added"


@pytest.mark.clause("reveal-report")
@pytest.mark.parametrize(
    "target",
    [rt.ring_fold, rt.recursive_doubling, rt.fused_groups, rt.wide_accumulator, rt.sorted_sum],
    ids=lambda t: t.__name__,
)
def test_the_json_text_is_the_json_object(target: rt.Target) -> None:
    """``reveal --json`` writes folds straight from their orders; the document read back is the one
    :meth:`Revealed.to_json` builds with nested lists, and it conforms to the schema."""
    found = reveal(target, 40, 9, checks=1)
    doc = json.loads(found.to_json_text())
    assert doc == found.to_json()
    jsonschema.validate(doc, SCHEMA)


@pytest.mark.clause("reveal-json")
@pytest.mark.parametrize(
    ("target", "tree"),
    [
        (rt.ring_fold, rt.ring_fold_tree),
        (rt.recursive_doubling, rt.recursive_doubling_tree),
        (rt.tree_of_chains, rt.tree_of_chains_tree),
        (rt.fused_groups, rt.fused_groups_tree),
    ],
    ids=lambda t: getattr(t, "__name__", ""),
)
def test_a_reveal_round_trips_in_version_3(target: rt.Target, tree: Callable[[int, int], Any]) -> None:
    """A real reveal at ``N = 24``: every fold flat, subtrees as the clause spells them (the oracle
    typed in from it, ``tests/reveal_targets.py``), read back to the trees found."""
    n, m = 24, 6
    found = reveal(target, n, m, checks=1)
    doc = json.loads(found.to_json_text())
    assert doc["version"] == 3 and doc["trees"] == [rt.flat(rt.spelt(tree(n, e))) for e in range(m)]
    jsonschema.validate(doc, SCHEMA)
    assert [tree_from_json(t, n) for t in doc["trees"]] == found.trees


def _depth(doc: Any) -> int:
    """How deep ``doc`` nests (a list or object one level), without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, list | dict):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


@pytest.mark.clause("reveal-json")
def test_json_loads_reads_the_reveal_of_a_4096_worker_ring_at_the_default_recursion_limit() -> None:
    """Issue #40 item 6: version 2 nested a fold of 4096 workers 4095 deep (``RecursionError``).  The
    ``Revealed`` of OpenMPI's ring at ``N = 4096`` is built from the ring's trees (a reveal that large
    takes minutes); ``M = 16`` elements, one per chunk, keep the file small."""
    n, m, ring = 4096, 16, RingSchedule(1, 0, "blocks")  # the openmpi-ring preset
    trees = ring_trees(ring, n, m, "float32")
    assert trees is not None
    ids, distinct = tree_ids(trees)
    found = Revealed(
        "ring", n, m, "float32", [(t, None) for t in distinct], ids, ring, ["openmpi-ring"], 0, 0, 0, 0.0
    )
    text = found.to_json_text()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default: reveal() raises it for deep trees
    try:
        doc = json.loads(text)
    finally:
        sys.setrecursionlimit(limit)
    assert _depth(doc) <= 4
    # OpenMPI's ring is the spec's on OpenMPI's blocks: chunk c folds c, c + 1, ..., c - 1 (as
    # rt.ring_fold does); blocks of 16 elements over 4096 workers give element e chunk e
    assert doc["trees"] == [rt.ring_fold_json(n, [(e + t) % n for t in range(n)]) for e in range(m)]
    jsonschema.validate(doc, SCHEMA)


@pytest.mark.clause("reveal-report")
def test_a_picture_draws_the_first_256_distinct_trees_and_counts_the_rest() -> None:
    n = 300
    found = reveal(rt.ring_fold, n, n, checks=1)
    svg = reveal_svg(found)
    assert svg.count('class="tree"') == 256
    assert "... and 44 more distinct trees, not drawn (--json spells every one)" in svg
    assert "elements 255: fold 255,256,257,258,259,260,...,253,254 (300 workers, stepping +1" in svg


def test_a_saved_fold_is_read_back_as_a_fold() -> None:
    """``difftest --order`` reads a fold of a saved reveal as one array; any other spelling as it is."""
    order = [2, 5, 4, 3, 1, 0]
    read = tree_from_json(json_fold(order), 6)
    assert isinstance(read, Fold) and read == nested(order)
    swapped = tree_from_json([[[1, 0], 2], 3], 4)
    assert not isinstance(swapped, Fold) and swapped == (((1, 0), 2), 3)
    with pytest.raises(ValueError, match=r"must add every worker 0 \.\. 3 exactly once"):
        tree_from_json([[[0, 1], 2], 2], 4)
    with pytest.raises(ValueError, match=r"a tree node must be a worker id in 0 \.\. 3"):
        tree_from_json([[[0, 1], 2], 4], 4)
