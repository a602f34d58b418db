"""``ring-ref reveal`` beyond the set probes: count probes at any ``N``, multiway nodes, ``exact``, ``null``.

Every expected tree comes from ``tests/common/reveal_targets.py``, built there by
plain loops and an independent canonical spelling; none by ``ring_ref._reveal``.
The call bounds of clause ``reveal-counts`` are asserted at moderate ``N``; the
``N = 1024`` cases are ``soak`` (``bench/bench_reveal.py`` measures up to 4096).
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import RingSchedule, ring_all_reduce
from ring_ref._cli import main
from ring_ref._reveal import RevealError, reveal
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
