"""``ring-ref reveal`` (spec/reveal.md): the tree of every element, from outputs alone.

Every expected tree is written out by hand below, in the canonical spelling of
clause ``reveal-trees`` (in each node the child with more leaves first, ties by
the smaller smallest leaf); none is computed by the code under test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import PRESETS, Engine, RingSchedule, ring_all_reduce
from ring_ref._order import canonical, format_tree, tree_from_json, tree_to_json, tree_to_pairs
from ring_ref._reveal import Revealed, RevealError, reveal
from ring_ref._svg import reveal_svg
from tests.common.paths import ROOT
from tests.common.planted_orders import mpich_ring
from tests.common.reveal_targets import flat

SCHEMA = json.loads((ROOT / "spec" / "reveal.schema.json").read_text(encoding="utf-8"))

Target = Callable[[torch.Tensor], torch.Tensor]


def _flat(trees: list[Any]) -> list[Any]:
    """Trees written as nested lists, in ``reveal --json``'s spelling (version 3: folds flat)."""
    return [None if tree is None else flat(tree) for tree in trees]


def _json(found: Revealed) -> dict[str, Any]:
    doc = found.to_json()
    jsonschema.validate(doc, SCHEMA)
    return doc


def _fold(order: list[int]) -> Target:
    def target(x: torch.Tensor) -> torch.Tensor:
        acc = x[order[0]].clone()
        for w in order[1:]:
            acc = acc + x[w]
        return acc

    return target


# The spec's ring for N = 4, chunk c folding c, c+1, c+2, c+3, two elements per chunk.
SPEC_RING_4 = [
    [[[0, 1], 2], 3],
    [[[0, 1], 2], 3],
    [[[1, 2], 3], 0],
    [[[1, 2], 3], 0],
    [[[2, 3], 0], 1],
    [[[2, 3], 0], 1],
    [[[0, 3], 1], 2],
    [[[0, 3], 1], 2],
]


@pytest.mark.clause("reveal-trees", "reveal-report", "reveal-probes")
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_reveal_names_the_spec_ring_on_both_engines(engine: Engine) -> None:
    found = reveal(lambda x: ring_all_reduce(x, engine), 4, 8)
    doc = _json(found)
    assert doc["trees"] == _flat(SPEC_RING_4)
    assert doc["ring"] == {"direction": 1, "offset": 0, "layout": "even"}
    # M divisible by N: blocks and floor are the spec's chunks
    assert doc["matches"] == ["spec", "openmpi-ring", "intel-ring"]
    assert doc["classification"] == "ring"
    assert doc["calls"] == sum(doc["callsBy"].values())
    assert "elements 6..7 (chunk 3): fold 3,0,1,2" in found.summary()


@pytest.mark.clause("reveal-trees", "reveal-report", "schedule-layouts")
def test_reveal_names_a_ring_of_another_direction_offset_and_layout() -> None:
    # d = -1, k = 2 on blocks of S = 7 over N = 5 (sizes 2, 2, 1, 1, 1): chunk c folds c+2, c+1, c, c-1, c-2.
    ring = RingSchedule(-1, 2, "blocks")
    found = reveal(lambda x: ring_all_reduce(x, schedule=ring), 5, 7)
    chunk0 = [[[[1, 2], 0], 4], 3]  # fold 2,1,0,4,3
    chunk1 = [[[[2, 3], 1], 0], 4]  # fold 3,2,1,0,4
    chunk2 = [[[[3, 4], 2], 1], 0]  # fold 4,3,2,1,0
    chunk3 = [[[[0, 4], 3], 2], 1]  # fold 0,4,3,2,1
    chunk4 = [[[[0, 1], 4], 3], 2]  # fold 1,0,4,3,2
    doc = _json(found)
    assert doc["trees"] == _flat([chunk0, chunk0, chunk1, chunk1, chunk2, chunk3, chunk4])
    assert doc["ring"] == {"direction": -1, "offset": 2, "layout": "blocks"}
    assert doc["matches"] == []
    assert "element 5 (chunk 3): fold 0,4,3,2,1" in found.summary()


@pytest.mark.clause("reveal-trees", "reveal-report", "schedule-presets")
def test_reveal_fits_the_gloo_preset_on_its_segment_layout() -> None:
    # gloo, N = 4, M = 9: segments of ceil(9 / 8) = 2 elements, 2 per rank, so chunks of 4, 4, 1, 0.
    found = reveal(lambda x: ring_all_reduce(x, schedule="gloo"), 4, 9)
    chunk0, chunk1, chunk2 = [[[2, 3], 1], 0], [[[0, 3], 2], 1], [[[0, 1], 3], 2]
    doc = _json(found)
    assert doc["trees"] == _flat([chunk0] * 4 + [chunk1] * 4 + [chunk2])
    assert doc["ring"] == {"direction": -1, "offset": 3, "layout": "gloo"}
    assert doc["matches"] == ["gloo"]


@pytest.mark.clause("reveal-preset-sizes", "reveal-report")
def test_a_preset_is_named_at_the_revealed_size_only_where_layouts_are_not_told_apart() -> None:
    # MPICH's ceil(M/N) chunks cut as gloo's at N = 3, M = 64 (22, 22, 20), its folds there are gloo's, so
    # its trees are the gloo preset's; at M = 7 (3, 3, 1 against gloo's 4, 3, 0) they are not.
    found = reveal(mpich_ring, 3, 64)
    assert found.matches == ["gloo", "mpich-ring"]
    told = "matches presets: gloo, mpich-ring (at M = 64 only: the layouts are told apart at M = 7, 9)\n"
    assert told in found.summary()
    # at M = 7 MPICH's own preset alone: its ceil layout (3, 3, 1) is no other layout's there
    assert reveal(mpich_ring, 3, 7).matches == ["mpich-ring"]
    # the chain's one fold needs no other size
    chain = reveal(lambda x: ring_all_reduce(x, schedule="chain"), 3, 64)
    # (at N = 3 recursive doubling's tree is the chain's fold: both are named)
    assert "matches presets: chain, recursive-doubling\n" in chain.summary() and chain.untold == ()
    # at N = 2 every ring adds its two workers alike: every preset matches, at any M
    every = f"matches presets: {', '.join(PRESETS)}\n"
    assert list(PRESETS)[-2:] == ["mlx-ring", "recursive-doubling"]
    assert every in reveal(ring_all_reduce, 2, 4).summary()


@pytest.mark.clause("schedule-below-n", "reveal-report")
def test_below_n_elements_reveal_names_the_library_ring_that_runs_another_order_there() -> None:
    def doubling(x: torch.Tensor) -> torch.Tensor:  # OpenMPI's ring below N = 4 elements
        return (x[0] + x[1]) + (x[2] + x[3])

    assert reveal(doubling, 4, 2).matches == ["openmpi-ring", "recursive-doubling"]

    def other_way(x: torch.Tensor) -> torch.Tensor:  # MLX below N = 3 elements: element e folds e, e+1, e+2
        return torch.stack([(x[e, e] + x[(e + 1) % 3, e]) + x[(e + 2) % 3, e] for e in range(x.shape[1])])

    assert reveal(other_way, 3, 2).matches == ["mlx-ring"]
    assert reveal(other_way, 3, 3).matches == ["spec", "openmpi-ring", "intel-ring"]  # from N on: no MLX ring


@pytest.mark.clause("reveal-trees")
def test_reveal_a_pairwise_tree() -> None:
    def pairwise(x: torch.Tensor) -> torch.Tensor:
        return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]))

    found = reveal(pairwise, 8, 3)
    doc = _json(found)
    assert doc["trees"] == _flat([[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]] * 3)
    assert doc["classification"] == "trees" and doc["ring"] is None
    assert "elements 0..2: (((0+1)+(2+3))+((4+5)+(6+7)))" in found.summary()


@pytest.mark.clause("reveal-trees", "reveal-report")
def test_reveal_a_sequential_fold() -> None:
    found = reveal(_fold([0, 1, 2, 3]), 4, 8)
    doc = _json(found)
    assert doc["trees"] == _flat([[[[0, 1], 2], 3]] * 8)
    # no ring, but the chain (spec/schedules.md): the left fold in rank order
    assert doc["classification"] == "folds" and doc["ring"] is None and doc["matches"] == ["chain"]
    found = reveal(_fold([5, 2, 4, 0, 3, 1]), 6, 2, dtype="float64")
    assert _json(found)["trees"] == _flat([[[[[[2, 5], 4], 0], 3], 1]] * 2)
    assert found.matches == []
    assert "elements 0..1: fold 2,5,4,0,3,1" in found.summary()


def _mixed(x: torch.Tensor) -> torch.Tensor:
    """Elements 0-1: fold 3,2,1,0; element 2: (0+1)+(2+3); element 3: (0+(1+2))+3; element 4: 0+((1+3)+2)."""
    out = torch.empty_like(x[0])
    out[0:2] = ((x[3, 0:2] + x[2, 0:2]) + x[1, 0:2]) + x[0, 0:2]
    out[2] = (x[0, 2] + x[1, 2]) + (x[2, 2] + x[3, 2])
    out[3] = (x[0, 3] + (x[1, 3] + x[2, 3])) + x[3, 3]
    out[4] = x[0, 4] + ((x[1, 4] + x[3, 4]) + x[2, 4])
    return out


@pytest.mark.clause("reveal-trees", "reveal-report")
def test_reveal_elements_of_one_result_with_different_trees() -> None:
    found = reveal(_mixed, 4, 5)
    doc = _json(found)
    assert doc["trees"] == _flat(
        [
            [[[2, 3], 1], 0],
            [[[2, 3], 1], 0],
            [[0, 1], [2, 3]],
            [[[1, 2], 0], 3],
            [[[1, 3], 2], 0],
        ]
    )
    assert doc["classification"] == "trees"
    summary = found.summary()
    assert "elements 0..1: fold 3,2,1,0" in summary and "element 2: ((0+1)+(2+3))" in summary
    assert len(found.distinct()) == 4


def _wider(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64).sum(0).to(x.dtype)


@pytest.mark.clause("reveal-trees")
@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_a_wider_accumulator_is_reported_as_no_tree(n: int) -> None:
    found = reveal(_wider, n, 6)
    doc = _json(found)
    assert doc["trees"] == _flat([None] * 6)
    assert doc["classification"] == "no-tree" and doc["matches"] == []
    assert "no tree of float32 additions explains it" in found.summary()


@pytest.mark.clause("reveal-trees")
def test_only_the_elements_no_tree_explains_get_none() -> None:
    def half(x: torch.Tensor) -> torch.Tensor:
        out = _fold([0, 1, 2, 3, 4])(x)
        out[3:] = _wider(x[:, 3:])
        return out

    doc = _json(reveal(half, 5, 6))
    assert doc["trees"] == _flat([[[[[0, 1], 2], 3], 4]] * 3 + [None] * 3)
    assert doc["classification"] == "partly-trees"


@pytest.mark.clause("reveal-trees")
def test_a_tree_that_fits_the_probes_but_not_random_inputs_is_dropped() -> None:
    """A fold on the probes' whole-number values, one unit in the last place off on any other input."""

    def off_elsewhere(x: torch.Tensor) -> torch.Tensor:
        fold = _fold([0, 1, 2])(x)
        if bool((x == x.round()).all()):
            return fold
        return torch.nextafter(fold, torch.full_like(fold, torch.inf))

    found = reveal(off_elsewhere, 3, 5)
    assert found.trees == [None] * 5
    reason = found.reasons[0]
    assert reason is not None and "its answers fit the tree fold 0,1,2, but on random input 0" in reason


@pytest.mark.clause("reveal-probes", "reveal-report")
@pytest.mark.parametrize("n", [4, 8, 16])
def test_a_ring_fold_costs_about_n_calls_whatever_m(n: int) -> None:
    small = reveal(lambda x: ring_all_reduce(x, "fast"), n, n)
    large = reveal(lambda x: ring_all_reduce(x, "fast"), n, 64 * n)
    assert small.ring == large.ring == RingSchedule(1, 0, "even")
    assert small.probe_calls == large.probe_calls <= n + 4
    assert small.confirm_calls <= 2 and small.check_calls == 4


@pytest.mark.clause("reveal-trees")
@pytest.mark.parametrize("n", [1, 2])
def test_one_and_two_workers(n: int) -> None:
    found = reveal(lambda x: ring_all_reduce(x, "fast", schedule="gloo"), n, 3)
    assert found.trees == ([0] * 3 if n == 1 else [(0, 1)] * 3)
    assert found.probe_calls == 0 and found.check_calls == 4
    # Every preset (the rings, the chain, recursive doubling) is the same for N <= 2; only N = 1 divides
    # M = 3, as the spec's layout needs.
    assert found.matches == (list(PRESETS) if n == 1 else [name for name in PRESETS if name != "spec"])


@pytest.mark.clause("reveal-limits")
def test_sizes_beyond_the_limits_are_refused_by_name() -> None:
    with pytest.raises(RevealError, match=r"N = 65537 is beyond reveal's limit for float32: N <= 65536"):
        reveal(_wider, 65537, 1)
    with pytest.raises(RevealError, match=r"N = 65537 is beyond reveal's limit for float64: N <= 65536"):
        reveal(_wider, 65537, 1, dtype="float64")
    with pytest.raises(RevealError, match=r"float16: N <= 2048, because counts .* 11-bit significand"):
        reveal(_wider, 2049, 1, dtype="float16")
    with pytest.raises(RevealError, match=r"bfloat16: N <= 256, because counts .* 8-bit significand"):
        reveal(_wider, 257, 1, dtype="bfloat16")
    with pytest.raises(RevealError, match="float16, bfloat16, float32, float64; got 'int32'"):
        reveal(_wider, 4, 1, dtype="int32")
    with pytest.raises(RevealError, match="M = 0"):
        reveal(_wider, 4, 0)


@pytest.mark.clause("reveal-limits", "reveal-trees")
def test_the_limits_themselves_work() -> None:
    for n, dtype in ((24, "float32"), (53, "float64")):
        order = list(range(n))[::-1]
        found = reveal(_fold(order), n, 1, dtype=dtype)
        assert found.trees[0] is not None
        assert format_tree(found.trees[0]) == "fold " + ",".join(map(str, order))


@pytest.mark.clause("reveal-report")
def test_a_misbehaving_target_is_named() -> None:
    def raises(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    with pytest.raises(RevealError, match="the target raised RuntimeError: boom"):
        reveal(raises, 3, 2)
    with pytest.raises(RevealError, match=r"must return a \(2,\) tensor of torch.float32"):
        reveal(lambda x: x, 3, 2)


@pytest.mark.clause("reveal-trees")
def test_tree_spelling() -> None:
    assert canonical((3, (1, (2, 0)))) == (((0, 2), 1), 3)
    assert canonical(((4, 5), (0, 1))) == ((0, 1), (4, 5))
    assert tree_to_json((((0, 2), 1), 3)) == {"fold": [0, 2, 1, 3]}
    assert tree_to_pairs((((0, 2), 1), 3)) == [[[0, 2], 1], 3]
    assert tree_from_json([[[0, 2], 1], 3], 4) == (((0, 2), 1), 3)
    assert format_tree(((0, 1), (2, 3))) == "((0+1)+(2+3))"
    assert format_tree((((0, 3), 1), 2)) == "fold 3,0,1,2"
    for bad in ([[0, 1], 1], [[0, 1, 2]], [[0, 1], 5], True, [[0], 1, 2]):
        with pytest.raises(ValueError, match="tree"):
            tree_from_json(bad, 3)


@pytest.mark.clause("reveal-report")
def test_svg_has_one_panel_per_distinct_tree() -> None:
    svg = reveal_svg(reveal(_mixed, 4, 5))
    assert svg.startswith("<svg") and svg.count('class="tree"') == 4
    assert 'data-tree="{&quot;fold&quot;: [2, 3, 1, 0]}"' in svg and "elements 0..1: fold 3,2,1,0" in svg


def _drawn(svg: str) -> list[tuple[str, list[int]]]:
    """Each tree panel of a reveal SVG in drawing order: its heading and its leaves from left to right."""
    import xml.etree.ElementTree as ET

    ns = "{http://www.w3.org/2000/svg}"
    panels = []
    for panel in ET.fromstring(svg).iter(f"{ns}g"):
        if panel.get("class") != "tree":
            continue
        texts = list(panel.iter(f"{ns}text"))
        workers = [t for t in texts if t.get("class") == "worker"]
        leaves = sorted((float(t.get("x", "0")), int(t.text or "")) for t in workers)
        panels.append((texts[0].text or "", [w for _, w in leaves]))
    return panels


@pytest.mark.clause("reveal-trees", "reveal-report")
def test_a_fold_is_named_by_one_rule_in_text_json_and_svg() -> None:
    # The first pair of a fold commutes; the chain is named reading in one ring direction, whatever M.
    # gloo's ring at N = 4, M = 8 fits a ring; one fold 1,0,3,2 for every element at M = 10 fits none.
    gloo = reveal(lambda x: ring_all_reduce(x, schedule="gloo"), 4, 8)
    loose = reveal(_fold([1, 0, 3, 2]), 4, 10)
    assert gloo.ring is not None and loose.ring is None
    assert "elements 0..9: fold 1,0,3,2" in loose.summary()
    for found in (gloo, loose):
        from_json = [format_tree(tree_from_json(t, 4)) for t in _json(found)["trees"]]
        for line in found.summary().splitlines()[1:-3]:
            first = int(line.split()[1].split("..")[0])
            assert line.endswith(": " + from_json[first]), (line, from_json[first])
        panels = _drawn(reveal_svg(found))
        headings = [int(h.split()[1].split("..")[0].rstrip(":")) for h, _ in panels]
        assert headings == sorted(headings), "the chunks are drawn in order"
        for heading, drawn in panels:
            assert heading.endswith("fold " + ",".join(map(str, drawn))), (heading, drawn)
    assert [h.split(": ")[1] for h, _ in _drawn(reveal_svg(gloo))] == [
        "fold " + ",".join(str((c - 1 - j) % 4) for j in range(4)) for c in range(4)
    ]


@pytest.mark.clause("reveal-report", "reveal-limits")
def test_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    from ring_ref._cli import main

    svg = tmp_path / "trees.svg"
    assert main(["reveal", "ring_ref:ring_all_reduce", "-n", "4", "-m", "8", "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "elements 0..1 (chunk 0): fold 0,1,2,3" in out and "classification: ring" in out
    assert "calls: " in out and svg.read_text(encoding="utf-8").count('class="tree"') == 4
    assert (
        main(["reveal", "ring_ref:ring_all_reduce", "-n", "3", "-m", "3", "--dtype", "float64", "--json"])
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["trees"] == _flat([[[0, 1], 2], [[1, 2], 0], [[0, 2], 1]]) and doc["dtype"] == "float64"
    assert main(["reveal", "ring_ref:ring_all_reduce", "-n", "257", "-m", "4", "--dtype", "bfloat16"]) == 2
    assert "N <= 256" in capsys.readouterr().err
    assert main(["reveal", "ring_ref:nothing_here", "-n", "2", "-m", "2"]) == 2
    assert "has no attribute 'nothing_here'" in capsys.readouterr().err
    # the spec's ring refuses M = 5 with N = 2 itself: a target that raises on valid input
    assert main(["reveal", "ring_ref:ring_all_reduce", "-n", "2", "-m", "5"]) == 2
    assert "the target raised ValueError: M = 5 is not divisible by N = 2" in capsys.readouterr().err


@pytest.mark.clause("reveal-report")
def test_the_time_line_counts_the_whole_command(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    """Beside the seconds of revealing, the command line prints those of the whole command, start-up
    included: a target whose module takes 0.5 s to load shows in the second, not the first."""
    from ring_ref._cli import main

    slow = tmp_path / "slow_to_load.py"
    slow.write_text(
        "import time\n\nimport torch\n\ntime.sleep(0.5)\n\n\ndef total(x):\n    return torch.sum(x, 0)\n",
        encoding="utf-8",
    )
    assert main(["reveal", f"{slow}:total", "-n", "2", "-m", "2", "--checks", "0"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("calls: "))
    found = re.search(r"; time ([\d.]+) s revealing, ([\d.]+) s in all \(start-up included\)$", line)
    assert found is not None, line
    revealing, whole = float(found[1]), float(found[2])
    assert revealing < 0.5 <= whole, line
