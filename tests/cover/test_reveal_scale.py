"""``ring-ref reveal`` beyond the set probes: count probes at any ``N``, multiway nodes, ``exact``, ``null``.

Every expected tree comes from ``tests/common/reveal_targets.py``, built there by
plain loops and an independent canonical spelling; none by ``ring_ref._reveal``.
The call bounds of clause ``reveal-counts`` are asserted at moderate ``N``; the
``N = 1024`` cases are ``soak`` (``bench/bench_reveal.py`` measures up to 4096).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import numpy as np
import pytest
import torch

from ring_ref import RingSchedule, ring_all_reduce
from ring_ref._cli import main
from ring_ref._order import Fold
from ring_ref._reveal import RevealError, reveal
from ring_ref._reveal._count import CountSearch, count_rounds, count_values
from ring_ref._svg import reveal_svg
from ring_ref.difftest._orders import read_order
from tests.common import reveal_targets as rt
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "reveal.schema.json").read_text(encoding="utf-8"))


def _trees(target: rt.Target, n: int, m: int, dtype: str = "float32") -> tuple[list[Any], Any]:
    found = reveal(target, n, m, dtype)
    doc = found.to_json()
    jsonschema.validate(doc, SCHEMA)
    return doc["trees"], found


def _check_all(name: str, n: int, m: int) -> None:
    target, tree = rt.TREES[name]
    trees, found = _trees(target, n, m)
    assert trees == [rt.flat(tree(n, e)) for e in range(m)], found.summary()[:2000]
    assert found.kinds == ["tree"] * m


@pytest.mark.clause("reveal-counts", "reveal-trees")
@pytest.mark.parametrize("name", ["ring fold", "linear fold", "hierarchical ring", "recursive doubling"])
@pytest.mark.parametrize("n", [32, 100])
def test_count_probes_reveal_hand_built_trees(name: str, n: int) -> None:
    _check_all(name, n, 5)


@pytest.mark.clause("reveal-multiway")
@pytest.mark.parametrize("name", ["fused groups", "three chains fused"])
@pytest.mark.parametrize("n", [12, 32, 100])
def test_a_multiway_node_is_one_node(name: str, n: int) -> None:
    """Groups of 8 leaves added at once under a ring, and three chains added at once (terms of many
    leaves); ``N = 12`` starts with the set probes, which find no binary tree, then counts."""
    _check_all(name, n, 4)


@pytest.mark.clause("reveal-exact")
@pytest.mark.parametrize(("n", "dtype"), [(3, "float32"), (32, "float32"), (100, "float32"), (40, "float64")])
def test_a_wide_accumulator_is_exact_with_its_evidence(n: int, dtype: str) -> None:
    """Float64 accumulation of float32 data; ``math.fsum`` of float64 data (a float64 ``sum`` is a tree)."""
    trees, found = _trees(rt.wide_accumulator if dtype == "float32" else rt.fsum_accumulator, n, 3, dtype)
    assert trees == [None] * 3 and found.kinds == ["exact"] * 3
    doc = found.to_json()
    assert doc["kinds"] == ["exact"] * 3 and doc["notes"][0]["first"] == 0 and doc["notes"][0]["last"] == 2
    evidence = doc["notes"][0]["reason"]
    assert f"on 4 random inputs the output is the exact sum correctly rounded to {dtype}" in evidence
    assert "exact: no tree" in found.summary()


@pytest.mark.clause("reveal-exact", "reveal-trees")
@pytest.mark.parametrize("n", [5, 32, 100])
def test_an_order_that_depends_on_the_data_is_null_with_the_reason(n: int) -> None:
    trees, found = _trees(rt.sorted_sum, n, 3)
    assert trees == [None] * 3 and found.kinds == ["none"] * 3
    reason = found.reasons[0]
    assert reason is not None and "fit" in reason and "+B at worker" in reason
    assert found.to_json()["notes"] == [{"first": 0, "last": 2, "reason": reason}]


@pytest.mark.clause("reveal-exact")
def test_exact_on_probes_but_not_on_random_inputs_is_null() -> None:
    """The exact sum on whole numbers, one unit in the last place off elsewhere: not ``exact``."""

    def off(x: torch.Tensor) -> torch.Tensor:
        out = rt.wide_accumulator(x)
        return out if bool((x == x.round()).all()) else torch.nextafter(out, torch.full_like(out, math.inf))

    found = reveal(off, 40, 2)
    assert found.kinds == ["none"] * 2
    reason = found.reasons[0]
    assert reason is not None and "but on random input 0 the target gives" in reason


@pytest.mark.clause("reveal-counts")
@pytest.mark.parametrize("n", [30, 64])
def test_a_fold_of_any_ring_costs_at_most_n_plus_two_calls(n: int) -> None:
    """Every element its own fold (``M = 2N``: each ring start twice, both directions): the calls are
    the most any element needs, not their sum."""
    for direction in (1, -1):
        schedule = RingSchedule(direction, 3, "blocks")

        def target(x: torch.Tensor, schedule: RingSchedule = schedule) -> torch.Tensor:
            return ring_all_reduce(x, "fast", schedule=schedule)

        found = reveal(target, n, 2 * n)
        assert found.ring is not None and (found.ring.direction, found.ring.offset) == (direction, 3)
        assert found.count_calls == found.probe_calls <= n + 2
    linear = reveal(rt.linear_fold, n, 3)
    assert linear.probe_calls <= n + 2


@pytest.mark.clause("reveal-counts")
@pytest.mark.parametrize(
    "name", ["hierarchical ring", "recursive doubling", "recursive halving", "tree of chains", "fused groups"]
)
def test_balanced_and_hierarchical_trees_cost_at_most_n_log_n(name: str) -> None:
    n = 96
    target, tree = rt.TREES[name]
    trees, found = _trees(target, n, 3)
    assert trees == [rt.flat(tree(n, e)) for e in range(3)]
    assert found.probe_calls <= n * math.log2(n)


def _random_tree(rng: random.Random, workers: list[int]) -> Any:
    if len(workers) == 1:
        return workers[0]
    cut = rng.randint(1, len(workers) - 1)
    return [_random_tree(rng, workers[:cut]), _random_tree(rng, workers[cut:])]


def _evaluate(tree: Any, x: torch.Tensor) -> torch.Tensor:
    if isinstance(tree, int):
        return x[tree]
    return _evaluate(tree[0], x) + _evaluate(tree[1], x)


@pytest.mark.clause("reveal-counts")
@pytest.mark.parametrize("seed", range(4))
def test_any_tree_costs_at_most_n_n_minus_1_over_2(seed: int) -> None:
    rng = random.Random(seed)
    n = 40
    workers = list(range(n))
    rng.shuffle(workers)
    tree = _random_tree(rng, workers)
    trees, found = _trees(lambda x: _evaluate(tree, x), n, 2)
    assert trees == [rt.flat(rt.spelt(tree))] * 2
    assert found.probe_calls <= n * (n - 1) // 2


@pytest.mark.clause("reveal-counts", "reveal-limits")
@pytest.mark.parametrize(("dtype", "n"), [("float16", 40), ("bfloat16", 40), ("float64", 70)])
def test_count_probes_in_every_dtype(dtype: str, n: int) -> None:
    trees, found = _trees(rt.ring_fold, n, 3, dtype)
    assert trees == [rt.flat(rt.ring_fold_tree(n, e)) for e in range(3)] and found.dtype == dtype


@pytest.mark.clause("reveal-counts", "reveal-limits")
def test_a_target_that_does_not_count_is_named() -> None:
    found = reveal(lambda x: rt.linear_fold(x) * 1.5, 30, 2)
    reason = found.reasons[0]
    assert found.kinds == ["none"] * 2
    assert reason is not None and "the output is not a count of surviving units" in reason
    with pytest.raises(RevealError, match="N = 257 is beyond reveal's limit for bfloat16"):
        reveal(rt.linear_fold, 257, 1, "bfloat16")


@pytest.mark.clause("reveal-report", "difftest-exact-orders", "reveal-multiway")
def test_order_files_serve_multiway_and_exact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, n in (("fused_groups", 12), ("wide_accumulator", 5)):
        saved = tmp_path / f"{name}.json"
        assert main(["reveal", f"tests.common.reveal_targets:{name}", "-n", str(n), "-m", "4", "--json"]) == 0
        saved.write_text(capsys.readouterr().out, encoding="utf-8")
        doc = json.loads(saved.read_text(encoding="utf-8"))
        jsonschema.validate(doc, SCHEMA)
        assert doc["version"] == 3
        _, _, _, trees, _ = read_order(saved)
        if name == "wide_accumulator":
            assert doc["kinds"] == ["exact"] * 4 and trees == [tuple(range(n))] * 4
        common = ["--mode", "exact", "--examples", "15", "--in-process", "--order", str(saved)]
        assert main(["difftest", f"tests.common.reveal_targets:{name}", *common]) == 0
        capsys.readouterr()
        assert main(["difftest", "tests.common.reveal_targets:linear_fold", *common]) == 1
        capsys.readouterr()


@pytest.mark.soak  # about a minute each: N = 1024 (the calls measured up to 4096 by bench/bench_reveal.py)
@pytest.mark.clause("reveal-counts", "reveal-multiway", "reveal-exact")
@pytest.mark.parametrize("name", [*rt.TREES, "wide accumulator", "sorted sum"])
def test_hand_built_trees_at_n_1024(name: str) -> None:
    n = 1024
    if name == "wide accumulator":
        assert reveal(rt.wide_accumulator, n, 2).kinds == ["exact"] * 2
    elif name == "sorted sum":
        assert reveal(rt.sorted_sum, n, 2).kinds == ["none"] * 2
    else:
        _check_all(name, n, 3)


@pytest.mark.clause("reveal-report")
def test_pictures_stay_readable_at_large_n() -> None:
    """A fold drawn as its chain (start and direction), a tree by level, runs sharing a tree once."""
    n = 100
    ring = reveal(rt.ring_fold, n, 2 * n + 1, checks=1)
    svg = reveal_svg(ring)
    assert svg.count('class="tree"') == n and svg.count('class="leaf"') == 0
    assert "a fold (chain) of 100 workers: starts 0, 1, steps +1 around the ring, ends 99" in svg
    assert "elements 0, 100, 200: fold 0,1,2," in svg
    tree = reveal_svg(reveal(rt.fused_groups, n, 1, checks=1))
    assert "depth 1: 2 additions of 1 x 96 leaves, 1 x 4 leaves (4 terms at once)" in tree
    assert "depth 2: 2 additions of 1 x 88 leaves, 1 x 8 leaves (8 terms at once)" in tree


# The count search on answer tables written by hand: the questions it asks, the trees it builds, the
# failures it names (clause ``reveal-counts``).  A table's target answers a probe with +B at worker i
# and -B at worker j by ``N - L(i, j)`` units; ``_leaf_counts`` writes L for a tree of nested lists.

Table = list[list[float]]


def _leaf_counts(tree: Any, n: int) -> Table:
    """``L(i, j)``: the leaves of the two children that hold ``i`` and ``j`` at the node where they meet
    (at a binary node, all its leaves; at a multiway node, only those two terms')."""
    table: Table = [[0.0] * n for _ in range(n)]

    def leaves(node: Any) -> list[int]:
        return [node] if isinstance(node, int) else [w for child in node for w in leaves(child)]

    def walk(node: Any) -> None:
        if isinstance(node, int):
            return
        parts = [leaves(child) for child in node]
        for a, b in itertools.combinations(parts, 2):
            for i in a:
                for j in b:
                    table[i][j] = table[j][i] = len(a) + len(b)
        for child in node:
            walk(child)

    walk(tree)
    return table


def _answering(tables: list[Table], asked: list[list[tuple[int, int]]]) -> rt.Target:
    """Element e answers from tables[e]; ``asked`` gets each call's ``(+B, -B)`` workers per element."""

    def target(x: torch.Tensor) -> torch.Tensor:
        n, m = x.shape
        out = torch.full((m,), float(n), dtype=torch.float64)
        pairs = []
        for e in range(m):
            column = x[:, e].to(torch.float64)
            i, j = int(column.argmax()), int(column.argmin())
            unit = float(column.abs().min())
            pairs.append((i, j))
            out[e] = (n - tables[e][i][j]) * unit if i != j else n * unit
        asked.append(pairs)
        return out.to(x.dtype)

    return target


def _search(tables: list[Table], asked: list[list[tuple[int, int]]] | None = None) -> tuple[list[Any], int]:
    """Every element's search and the calls, the elements answering from ``tables``."""
    n = len(tables[0])
    target = _answering(tables, [] if asked is None else asked)
    searches, member, calls = count_rounds(
        target, [None, CountSearch.start(n)], np.ones(len(tables), np.int64), n, "float32"
    )
    return [searches[g] for g in member.tolist()], calls


def _tree_of(tree: Any, n: int, asked: list[tuple[int, int]] | None = None) -> tuple[Any, int]:
    """The tree one element's search finds for ``tree`` (nested lists) and the calls; ``asked`` gets its
    questions."""
    log: list[list[tuple[int, int]]] = []
    (search,), calls = _search([_leaf_counts(tree, n)], log)
    assert search.failure is None, search.failure
    if asked is not None:
        asked.extend(pairs[0] for pairs in log)
    assert calls == len(log)
    return search.tree(), calls


def _tupled(tree: Any) -> Any:
    return tree if isinstance(tree, int) else tuple(_tupled(child) for child in tree)


@pytest.mark.clause("reveal-counts")
@pytest.mark.parametrize(
    ("n", "dtype"),
    [(2, "float32"), (3, "float32"), (4, "float32"), (5, "float32"), (9, "float32"), (70, "float64")],
)
def test_count_values_are_a_unit_and_b_2_to_the_p_plus_log_n_plus_1(n: int, dtype: str) -> None:
    precision = {"float32": 24, "float64": 53}[dtype]
    assert count_values(n, dtype) == (1.0, 2.0 ** (precision + math.ceil(math.log2(n)) + 1))


@pytest.mark.clause("reveal-counts", "reveal-limits")
def test_count_values_in_float16_switch_to_the_smallest_normal_past_its_largest_exponent() -> None:
    # float16: p = 11, largest exponent 15.  N = 8: B = 2^(11 + 3 + 1) = 2^15 fits, u = 1.  N = 9: 2^16
    # does not: u = 2^-14 (the smallest normal) and B = 2^-14 * 2^16 = 4.
    assert count_values(8, "float16") == (1.0, 32768.0)
    assert count_values(9, "float16") == (2.0**-14, 4.0)


@pytest.mark.clause("reveal-counts")
@pytest.mark.parametrize(
    ("order", "questions"),
    [
        # N < 4: no hints; the smallest worker is the pivot.
        ([0, 1, 2], [(0, 1), (0, 2)]),
        # Hints (0, 1) = 4 and (1, 2) = 4 fit the fold +1 from 2 and the fold -1 from 0; below N = 5 no third
        # hint: the pivot is the first (+1 from 2), which knows (1, 2) already and asks 0 and 3.
        ([2, 3, 0, 1], [(0, 1), (1, 2), (2, 0), (2, 3)]),
        # N = 5, the same two folds fit (0, 1) = 5 and (1, 2) = 5: hint (2, 3) (2 for +1 from 2, 4 for -1
        # from 0) picks pivot 2, which knows 1 and 3 and asks 0 and 4: N calls.
        ([2, 3, 4, 0, 1], [(0, 1), (1, 2), (2, 3), (2, 0), (2, 4)]),
        # One fold fits (+1 from 0): no third hint; pivot 0 knows 1 from the first hint.
        ([0, 1, 2, 3, 4], [(0, 1), (1, 2), (0, 2), (0, 3), (0, 4)]),
    ],
)
def test_hints_choose_the_first_pivot_and_no_pair_is_asked_twice(
    order: list[int], questions: list[tuple[int, int]]
) -> None:
    asked: list[tuple[int, int]] = []
    tree, calls = _tree_of(rt.chain(order), len(order), asked)
    assert asked == questions and calls == len(questions)
    assert isinstance(tree, Fold) and tree == _tupled(rt.spelt(rt.chain(order)))


@pytest.mark.clause("reveal-counts")
def test_one_or_two_workers_need_no_call() -> None:
    assert _tree_of(0, 1) == (0, 0)
    assert _tree_of([1, 0], 2) == ((0, 1), 0)


@pytest.mark.clause("reveal-counts", "reveal-multiway")
def test_terms_of_two_leaves_at_one_node_are_searched_as_a_forest() -> None:
    """Four pairs added at once.  Hints (0, 1) = 2, (1, 2) = 4 fit no fold of the ring family (+1 from 0
    gives (1, 2) = 3, -1 from 1 gives 8): pivot 0, the smallest.  Its answers 4 for 2..7 are, after the
    path (0, 1), a new node of terms of 2 leaves each (4 = 2 + 2), read before 6 / 2 terms of 3 on the
    last node.  The forest {2..7}: pivot 2 asks 3..7 and finds its term (2, 3); the rest {4..7}, two
    terms: pivot 4 asks 5, 6, 7; {6, 7}, the last term, needs no call."""
    asked: list[tuple[int, int]] = []
    tree, calls = _tree_of([[0, 1], [2, 3], [4, 5], [6, 7]], 8, asked)
    assert tree == ((0, 1), (2, 3), (4, 5), (6, 7))
    sweeps = [(0, j) for j in range(2, 8)] + [(2, j) for j in range(3, 8)] + [(4, 5), (4, 6), (4, 7)]
    assert asked == [(0, 1), (1, 2), *sweeps] and calls == 16
    # Other pairs from 2 on agree on all of pivot 0's answers (4) and part in the forest's sweep at (2, 3)
    # (2, then 4).  The pairs from 2 under one node of their own part at (0, 2) (8): there the forest is
    # {4..7}, inside that node.  Each element takes its own forests apart, in the same 16 calls.
    pairings = [
        [[0, 1], [2, 3], [4, 5], [6, 7]],
        [[0, 1], [2, 4], [3, 5], [6, 7]],
        [[0, 1], [[2, 3], [4, 5], [6, 7]]],
    ]
    searches, calls = _search([_leaf_counts(tree, 8) for tree in pairings])
    assert [s.tree() for s in searches] == [
        ((0, 1), (2, 3), (4, 5), (6, 7)),
        ((0, 1), (2, 4), (3, 5), (6, 7)),
        (((2, 3), (4, 5), (6, 7)), (0, 1)),
    ]
    assert calls == 16


@pytest.mark.clause("reveal-counts", "reveal-trees")
def test_terms_of_equal_leaves_are_ordered_by_their_smallest_leaf() -> None:
    # Hints (0, 1) = 4, (1, 2) = 2 fit the fold +1 from 1: pivot 1, with 2 at L = 2 and 0, 3 at L = 4
    # (one question, (1, 3)).  Its path (1, 2) and the pair (0, 3) tie on leaves: (0, 3) first.
    assert _tree_of([[1, 2], [3, 0]], 4) == (((0, 3), (1, 2)), 3)
    # Hints (0, 1) = 5, (1, 2) = 6 fit the fold +1 from 6: pivot 6.  The root adds four terms: 6's own
    # (2, 4, 6), 7, (0, 5) and (1, 3, 8); the two of 3 leaves go by smallest leaf, 1 before 2.
    assert _tree_of([[8, 3, 1], [4, 2, 6], [5, 0], 7], 9)[0] == ((1, 3, 8), (2, 4, 6), (0, 5), 7)


_SPLICED = [[[[0, 3], 1], 2], [[[4, 11], 9], 10], [[[5, 6], 7], 8]]
"""Three chains of 4 added at once.  Hints (0, 1) = 3, (1, 2) = 4 fit only the fold +1 from 11: pivot 11,
whose chain (min 4) meets the 8 others at L = 8, a forest of terms of 4 (min 0 and min 5): spliced in, the
forest's two terms come together, and the canonical order puts the pivot's chain between them."""


@pytest.mark.clause("reveal-counts", "reveal-trees", "reveal-multiway")
def test_a_forest_spliced_beside_the_pivots_chain_is_put_in_canonical_order() -> None:
    other = [*_SPLICED[:2], [[[5, 7], 6], 8]]  # parts from the first only at (5, 6), after the splice
    (first, second), calls = _search([_leaf_counts(_SPLICED, 12), _leaf_counts(other, 12)])
    assert first.tree() == ((((0, 3), 1), 2), (((4, 11), 9), 10), (((5, 6), 7), 8))
    assert second.tree() == ((((0, 3), 1), 2), (((4, 11), 9), 10), (((5, 7), 6), 8))
    # 2 hints, 11 asks 10 workers, 0 asks the 7 of its forest, 5 asks 3.
    assert calls == 2 + 10 + 7 + 3


@pytest.mark.clause("reveal-counts")
def test_elements_that_part_during_a_sweep_each_get_their_tree() -> None:
    """Three elements agree on the hints and on (0, 2); at (0, 3) the first parts from the other two
    (4, 5, 5), at (0, 4) the third from the second (5, 6): each gets its own tree, in the 6 calls one
    element needs (2 hints, 4 questions of pivot 0; the pair at L = 5 needs none)."""
    chains = [
        [[[[[0, 1], 2], 3], 4], 5],
        [[[[0, 1], 2], [3, 4]], 5],
        [[[[0, 1], 2], [3, 5]], 4],
    ]
    searches, calls = _search([_leaf_counts(tree, 6) for tree in chains])
    assert [s.tree() for s in searches] == [
        (((((0, 1), 2), 3), 4), 5),
        ((((0, 1), 2), (3, 4)), 5),
        ((((0, 1), 2), (3, 5)), 4),
    ]
    assert calls == 6


@pytest.mark.clause("reveal-counts")
def test_a_subtree_that_is_a_fold_stays_a_fold() -> None:
    """A path of one worker per level is kept as a :class:`Fold` (its order in one array), in a tree too."""
    tree, _ = _tree_of([[[0, 1], 2], [[3, 4], 5]], 6)
    assert tree == (((0, 1), 2), ((3, 4), 5)) and isinstance(tree[1], Fold)


def _garbled_once(tables: list[Table], pair: tuple[int, int]) -> rt.Target:
    """Answers from ``tables``, but the first time ``pair`` is asked the output is not a count (NaN)."""
    asked: list[list[tuple[int, int]]] = []
    answer = _answering(tables, asked)

    def target(x: torch.Tensor) -> torch.Tensor:
        out = answer(x)
        if asked[-1][0] == pair and pair not in [pairs[0] for pairs in asked[:-1]]:
            out[0] = math.nan
        return out

    return target


def _all(n: int, swamped: float) -> Table:
    return [[swamped] * n for _ in range(n)]


def _with(table: Table, i: int, j: int, swamped: float) -> Table:
    table[i][j] = table[j][i] = swamped
    return table


@pytest.mark.clause("reveal-counts", "reveal-limits")
@pytest.mark.parametrize(
    ("table", "reason"),
    [
        (  # every output N units: L = 0, at the first hint
            _all(6, 0),
            "with +B at worker 0 and -B at worker 1 the output counts more units than the others "
            "(no tree of additions in the dtype gives that)",
        ),
        (  # pivot 0 sees 9 workers at L = 3: 9 leaves in terms of 2, or none on a last node
            _all(10, 3),
            "the counts with +B at worker 0 (1: 3, 2: 3, 3: 3, 4: 3, 5: 3, 6: 3, 7: 3, 8: 3, ...) "
            "fit no tree of additions",
        ),
        (  # 8 workers at L = 4: terms of 3; all 8 are shown
            _all(9, 4),
            "the counts with +B at worker 0 (1: 4, 2: 4, 3: 4, 4: 4, 5: 4, 6: 4, 7: 4, 8: 4) "
            "fit no tree of additions",
        ),
        (  # the subtree {2, 3, 4} under pivot 0 (L = 5), but 2 meets 4 at L = 4
            _with(_leaf_counts([[[0, 1], [[2, 3], 4]], 5], 6), 2, 4, 4),
            "the counts with +B at worker 2 (3: 2, 4: 4) fit no tree of additions with one subtree of 3 "
            "leaves",
        ),
        (  # the forest of pairs {2..7}, but 2 meets 3 and 4 at L = 2: 3 leaves in its term
            _with(_leaf_counts([[0, 1], [2, 3], [4, 5], [6, 7]], 8), 2, 4, 2),
            "the counts with +B at worker 2 (3: 2, 4: 2, 5: 4, 6: 4, 7: 4) "
            "fit no tree of additions with terms of 2 leaves each",
        ),
    ],
)
def test_answers_that_fit_no_tree_are_named(table: Table, reason: str) -> None:
    (search,), _ = _search([table])
    assert search.failure == reason


@pytest.mark.clause("reveal-counts", "reveal-limits")
def test_an_answer_in_a_sweep_that_is_not_a_count_is_named() -> None:
    """Pivot 0 of a chain asks 2, 3, 4, 5 in one sweep; the output for 3 is NaN (once)."""
    table = _leaf_counts(rt.chain(list(range(6))), 6)
    target = _garbled_once([table], (0, 3))
    searches, member, calls = count_rounds(
        target, [None, CountSearch.start(6)], np.ones(1, np.int64), 6, "float32"
    )
    search = searches[int(member[0])]
    assert search is not None and calls == 4  # (0, 1), (1, 2), (0, 2), (0, 3)
    assert search.failure == (
        "with +B at worker 0 and -B at worker 3 the output is not a count of surviving units "
        "(no tree of additions in the dtype gives that)"
    )
