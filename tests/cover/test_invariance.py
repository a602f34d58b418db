"""``ring-ref invariance`` (spec/invariance.md): does an element's order move with the size or its position?

The targets are plain loops (``tests/common/planted_orders.py``); every expected tree
is typed in below in the canonical spelling of clause ``reveal-trees``, and
every expected placement is worked out by hand from the rule of clause
``invariance-report``.
"""

from __future__ import annotations

import functools
import json
import pickle
import struct
import time
from collections.abc import Hashable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore

from ring_ref import ring_all_reduce
from ring_ref._chunks import chunk_bounds
from ring_ref._cli import main
from ring_ref._order import tree_to_pairs
from ring_ref._order_stability import (
    Change,
    Embedded,
    Placement,
    _run,
    chunk_offsets,
    first_changes,
    placements,
)
from ring_ref._order_stability._run import _random
from ring_ref._reveal import RevealError
from ring_ref._svg import invariance_svg
from ring_ref.difftest._job import run_in_job
from ring_ref.difftest._loading import TargetError
from ring_ref.invariance import Invariance, InvarianceError, invariance
from ring_ref.schedule import Layout, RingSchedule
from tests.common import planted_orders
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "invariance.schema.json").read_text(encoding="utf-8"))

FOLD_4 = (((0, 1), 2), 3)
PAIRWISE_4 = ((0, 1), (2, 3))
REVERSE_4 = (((2, 3), 1), 0)
FOLD_4_JSON = [[[0, 1], 2], 3]
PAIRWISE_4_JSON = [[0, 1], [2, 3]]


def _json(found: Invariance) -> dict[str, Any]:
    doc = found.to_json()
    jsonschema.validate(doc, SCHEMA)
    return doc


def _hex32(value: torch.Tensor) -> str:
    """A float32's bit pattern as 8 hex digits, by ``struct`` (not by the code under test)."""
    return struct.pack(">f", float(value)).hex()


def _sides(doc: dict[str, Any]) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
    return [
        (c["element"], (c["a"]["m"], c["a"]["offset"]), (c["b"]["m"], c["b"]["offset"]))
        for c in doc["changes"]
    ]


@pytest.mark.clause("invariance-reveal", "invariance-report", "invariance-summary")
@pytest.mark.parametrize(
    ("name", "tree"), [("left_fold", FOLD_4), ("pairwise", PAIRWISE_4), ("reverse_fold", REVERSE_4)]
)
def test_an_order_that_never_moves_is_invariant(name: str, tree: object) -> None:
    found = invariance(getattr(planted_orders, name), 4, [8, 13, 40], offsets=[0, 3, 9], probe=4)
    doc = _json(found)
    assert doc["invariant"] is True and doc["changes"] == []
    assert doc["placements"] == [
        {"m": 8, "offset": 0},
        {"m": 8, "offset": 3},
        {"m": 13, "offset": 0},
        {"m": 13, "offset": 3},
        {"m": 13, "offset": 9},
        {"m": 40, "offset": 0},
        {"m": 40, "offset": 3},
        {"m": 40, "offset": 9},
    ]
    assert found.trees == [[tree] * 4] * 8
    assert doc["summary"] == "order invariant over 8 placements (M = 8, 13, 40; offsets 0, 3, 9)"


@pytest.mark.clause("invariance-report", "invariance-summary")
def test_a_switch_above_a_size_is_found_and_named() -> None:
    found = invariance(planted_orders.switching, 4, [16, 32, 64, 65, 128], offsets=[0, 1], probe=8)
    doc = _json(found)
    assert doc["invariant"] is False
    assert doc["summary"] == (
        "order changes above M = 64 (every element fold 0,1,2,3 (chain) up to M = 64, every "
        "element ((0+1)+(2+3)) (recursive-doubling) from M = 65 "
        "on)"
    )
    assert _sides(doc) == [(j, (64, 0), (65, 0)) for j in range(8)]
    assert all(c["a"]["tree"] == FOLD_4_JSON and c["b"]["tree"] == PAIRWISE_4_JSON for c in doc["changes"])
    assert (
        "elements 0..7: M = 64, offset 0: fold 0,1,2,3  ->  M = 65, offset 0: ((0+1)+(2+3))" in found.render()
    )


@pytest.mark.clause("invariance-report", "invariance-summary")
def test_a_tail_that_takes_another_path_is_position_dependent() -> None:
    # M = 16: two whole blocks, all pairwise; M = 20: elements 16..19 are the tail, folded backwards.
    found = invariance(planted_orders.tail_path, 4, [16, 20], offsets=[0, 12, 16], probe=4)
    doc = _json(found)
    assert doc["invariant"] is False
    assert doc["summary"] == (
        "order depends on the position (offset, or distance to the end): at M = 20, element 0 at offset 12 "
        "vs offset 16"
    )
    assert _sides(doc) == [(j, (20, 12), (20, 16)) for j in range(4)]
    assert found.trees[-1] == [REVERSE_4] * 4 and found.trees[-2] == [PAIRWISE_4] * 4


@pytest.mark.clause("invariance-report", "invariance-summary", "invariance-findings")
def test_the_spec_ring_changes_at_chunk_boundaries() -> None:
    # N = 4, chunk c folds c, c+1, c+2, c+3. M = 8: elements 0..3 in chunks 0, 0, 1, 1; M = 16: all in
    # chunk 0; M = 16 from offset 4: elements 4..7, chunk 1.
    found = invariance(ring_all_reduce, 4, [8, 16], offsets=[0, 4], probe=4)
    doc = _json(found)
    chunk1 = [[[1, 2], 3], 0]
    assert found.summary_line() == (
        "order changes with M: at chunk boundaries, M/N (each element folds its chunk, the spec ring)"
    )
    # (8, 0) gives 0 0 1 1; (8, 4) gives chunks 2 2 3 3: every element changes there.
    assert _sides(doc) == [(j, (8, 0), (8, 4)) for j in range(4)]
    assert [c["a"]["tree"] for c in doc["changes"]] == [FOLD_4_JSON, FOLD_4_JSON, chunk1, chunk1]
    assert doc["changes"][0]["b"]["tree"] == [[[2, 3], 0], 1]
    assert doc["changes"][3]["b"]["tree"] == [[[0, 3], 1], 2]


@pytest.mark.clause("invariance-report", "invariance-summary", "invariance-findings")
def test_the_gloo_preset_changes_at_its_own_chunk_boundaries() -> None:
    found = invariance(lambda x: ring_all_reduce(x, schedule="gloo"), 4, [8, 12, 16], offsets=[0, 2], probe=4)
    assert not found.invariant
    assert found.summary_line().startswith(
        "order changes with M: at chunk boundaries, the gloo layout's chunks"
    )
    assert found.summary_line().endswith("the gloo ring)")


@pytest.mark.clause("invariance-reveal")
def test_the_chain_preset_is_invariant() -> None:
    found = invariance(
        lambda x: ring_all_reduce(x, schedule="chain"), 4, [4, 7, 8, 16, 33], offsets=[0, 1, 3], probe=4
    )
    assert found.invariant, found.render()
    assert all(row == [FOLD_4] * 4 for row in found.trees)


@pytest.mark.clause("invariance-findings")
def test_torch_sum_over_workers_depends_on_the_position() -> None:
    # Measured (x86-64, this torch): torch.sum(x, 0) over N = 8 workers folds workers 0..7 in order for
    # the elements in whole blocks of 32, and adds the last M mod 32 elements (the tail) four lanes apart:
    # a vectorised sum whose tail takes another path. The same probe at M = 40 thus gets two trees.
    found = invariance(lambda x: torch.sum(x, 0), 8, [32, 40, 64], offsets=[0, 32], probe=8)
    fold = (((((((0, 1), 2), 3), 4), 5), 6), 7)
    lanes = ((((0, 4), (1, 5)), (2, 6)), (3, 7))
    assert not found.invariant
    assert found.summary_line() == (
        "order depends on the position (offset, or distance to the end): at M = 40, element 0 at offset 0 "
        "vs offset 32"
    )
    by_placement = dict(zip(found.placements, found.trees, strict=True))
    assert by_placement[Placement(40, 0)] == [fold] * 8
    assert by_placement[Placement(40, 32)] == [lanes] * 8
    assert by_placement[Placement(64, 32)] == [fold] * 8


@pytest.mark.clause("invariance-embedding")
def test_the_wrapper_embeds_at_the_offset_and_pickles() -> None:
    seen: list[torch.Tensor] = []

    def target(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return x.sum(0)

    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = Embedded(target, Placement(5, 2))(x)
    assert out.tolist() == [4.0, 6.0]
    assert seen[0].tolist() == [[0.0, 0.0, 1.0, 2.0, 0.0], [0.0, 0.0, 3.0, 4.0, 0.0]]
    assert x.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    fill = torch.full((2, 5), 7.0)
    assert Embedded(target, Placement(5, 1), fill)(x).tolist() == [4.0, 6.0]
    assert seen[1].tolist() == [[7.0, 1.0, 2.0, 7.0, 7.0], [7.0, 3.0, 4.0, 7.0, 7.0]]
    assert fill.eq(7.0).all()
    again = pickle.loads(pickle.dumps(Embedded(planted_orders.left_fold, Placement(5, 2))))
    assert again(x).tolist() == [4.0, 6.0]
    # two placements at one size in one buffer: columns 0..1 at offset 4, columns 2..3 at offset 0
    y = torch.tensor([[1.0, 2.0, 10.0, 20.0], [3.0, 4.0, 30.0, 40.0]])
    assert Embedded(target, Placement(7, 4), also=(0,))(y).tolist() == [4.0, 6.0, 40.0, 60.0]
    assert seen[2].tolist() == [[10.0, 20.0, 0.0, 0.0, 1.0, 2.0, 0.0], [30.0, 40.0, 0.0, 0.0, 3.0, 4.0, 0.0]]


@pytest.mark.clause("invariance-embedding")
def test_a_target_returning_the_wrong_shape_is_named() -> None:
    with pytest.raises(RevealError, match=r"must return a \(9,\) tensor"):
        invariance(lambda x: x.sum(0)[:4], 4, [9], probe=4)


@pytest.mark.clause("invariance-placements")
def test_placements_where_the_region_fits() -> None:
    assert placements([16, 8], [6, 0], 4) == (
        4,
        [Placement(8, 0), Placement(16, 0), Placement(16, 6)],
    )
    assert placements([5, 40], [0], None)[0] == 5
    assert placements([64, 40], [2], None)[0] == 32


@pytest.mark.clause("invariance-placements")
@pytest.mark.parametrize(
    ("sizes", "offsets", "probe", "message"),
    [
        ([], [0], 4, "sizes must be one or more"),
        ([0, 8], [0], 4, "sizes must be one or more integers >= 1"),
        ([8], [-1], 4, "offsets must be one or more integers >= 0"),
        ([8], [0], 0, "at least 1 element"),
        ([3, 8], [0], 4, r"M = 3 cannot hold the 4 probed elements at any offset \[0\]"),
        ([8], [0, 6], 4, r"offset 6 leaves no room .*at least 10"),
    ],
)
def test_placements_that_cannot_serve_are_refused(
    sizes: list[int], offsets: list[int], probe: int, message: str
) -> None:
    with pytest.raises(InvarianceError, match=message):
        invariance(planted_orders.left_fold, 4, sizes, offsets=offsets, probe=probe)


@pytest.mark.clause("invariance-placements", "invariance-in-job")
def test_options_that_cannot_serve_are_refused() -> None:
    with pytest.raises(RevealError, match="beyond reveal's limit"):
        invariance(planted_orders.left_fold, 65537, [8], probe=4)
    with pytest.raises(InvarianceError, match="float32 or float64"):
        invariance(planted_orders.left_fold, 4, [8], dtype="float16")
    with pytest.raises(InvarianceError, match="give it by name"):
        invariance(planted_orders.left_fold, 4, [8], ranks="gloo")
    with pytest.raises(InvarianceError, match="need ranks='mpi'"):
        invariance("tests.common.planted_orders:left_fold", 4, [8], mca={"a": "1"})
    with pytest.raises(InvarianceError, match=r"a stacked TARGET runs in the tester's own process"):
        invariance("tests.common.planted_orders:left_fold", 4, [8], env={"A": "1"})
    with pytest.raises(ValueError, match="none is initialised"):  # outside a job: no group to run in
        invariance("tests.common.planted_orders:left_fold", 4, [8], ranks="job")
    with pytest.raises(InvarianceError, match="draws must be 1 or more"):
        invariance(planted_orders.left_fold, 4, [8], by_bits=True, draws=0)


@pytest.mark.clause("invariance-by-bits")
def test_by_bits_finds_the_switch_with_a_counterexample() -> None:
    found = invariance(planted_orders.switching, 4, [32, 65, 128], offsets=[0, 5], probe=8, by_bits=True)
    doc = _json(found)
    assert doc["method"] == "bits" and doc["invariant"] is False
    assert doc["placements"][0] == {"m": 8, "offset": 0}  # the region alone comes first
    x = torch.tensor(doc["counterexample"], dtype=torch.float32)
    assert x.shape == (4, 8)
    alone = ((x[0] + x[1]) + x[2]) + x[3]
    embedded = (x[0] + x[1]) + (x[2] + x[3])
    for change in doc["changes"]:
        j = change["element"]
        assert (change["a"]["m"], change["a"]["offset"], change["b"]["m"]) == (32, 0, 65)
        assert change["a"]["bits"] == _hex32(alone[j])
        assert change["b"]["bits"] == _hex32(embedded[j])
    assert doc["changes"], "random values over 2^16 round the two orders apart somewhere"
    assert "bits change above M = 32" in doc["summary"]


@pytest.mark.clause("invariance-by-bits")
def test_by_bits_embeds_the_same_values_among_random_others() -> None:
    seen: list[torch.Tensor] = []

    def recording(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return planted_orders.left_fold(x)

    invariance(recording, 3, [6, 20], offsets=[0, 9], probe=6, by_bits=True, draws=1)
    alone, *embedded = seen
    assert [tuple(b.shape) for b in seen] == [(3, 6), (3, 20), (3, 20)]
    assert torch.equal(embedded[0][:, :6], alone) and torch.equal(embedded[1][:, 9:15], alone)
    outside = torch.cat([embedded[0][:, 6:], embedded[1][:, :9], embedded[1][:, 15:]], dim=1)
    assert bool((outside != 0).all()), "a bucket of other random values, not zeros"
    assert len(torch.unique(outside)) > outside.numel() // 2


@pytest.mark.clause("invariance-by-bits")
def test_by_bits_passes_an_order_that_never_moves() -> None:
    found = invariance(planted_orders.pairwise, 4, [8, 100], offsets=[0, 7, 50], probe=8, by_bits=True)
    doc = _json(found)
    assert doc["invariant"] is True and doc["counterexample"] is None
    # (8, 7) does not fit; the region alone is the placement (8, 0): BITS_DRAWS inputs, 4 placements each
    assert doc["calls"] == 4 * 4
    assert "a screen" in found.render()


@pytest.mark.clause("invariance-report")
def test_the_picture_colours_each_cell_by_its_tree() -> None:
    found = invariance(planted_orders.switching, 4, [64, 65], offsets=[0], probe=2)
    svg = invariance_svg(found)
    cells = svg.split('class="cell"')[1:]
    assert len(cells) == 4
    assert [c.split('data-tree="')[1].split('"')[0] for c in cells] == ["0", "0", "1", "1"]
    assert "0: fold 0,1,2,3" in svg and "1: ((0+1)+(2+3))" in svg


@pytest.mark.clause("invariance-cli")
def test_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    base = ["invariance", "tests.common.planted_orders:switching", "-n", "4", "--probe", "4"]
    assert main([*base, "--sizes", "8,64"]) == 0  # the default offsets: every chunk, and the end
    assert (
        "invariant: order invariant over 7 placements (M = 8, 64; offsets 0, 4, 16, 32, 48, 60)"
        in capsys.readouterr().out
    )
    svg = tmp_path / "grid.svg"
    assert main([*base, "--sizes", "64,65", "--offsets", "0,2", "--json", "--svg", str(svg)]) == 1
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["summary"].startswith("order changes above M = 64")
    assert svg.read_text(encoding="utf-8").count('class="cell"') == 4 * 4
    with pytest.raises(SystemExit) as bad:
        main([*base, "--sizes", "8,x"])
    assert bad.value.code == 2
    assert "comma-separated integers" in capsys.readouterr().err
    for extra, message in [
        (["--sizes", "2"], "M = 2 cannot hold"),
        (["--sizes", "8", "--mca", "a=1"], "need ranks='mpi'"),
        (["--sizes", "8", "--mca", "a"], "--mca takes KEY=VALUE"),
        (["--sizes", "8", "--by-bits", "--svg", str(svg)], "--by-bits reveals none"),
    ]:
        assert main([*base, *extra]) == 2
        assert message in capsys.readouterr().err
    assert main(["invariance", "tests.common.planted_orders:nope", "-n", "4", "--sizes", "8"]) == 2
    assert "has no attribute 'nope'" in capsys.readouterr().err
    tail = ["invariance", "tests.common.planted_orders:tail_path", "-n", "4", "--probe", "8", "--by-bits"]
    assert main([*tail, "--sizes", "16,64", "--offsets", "0,8"]) == 0  # alone, M = 8, is one whole block too
    assert main([*tail, "--sizes", "20", "--offsets", "0,12"]) == 1  # elements 16..19 of M = 20: the tail
    out = capsys.readouterr().out
    assert "bits depend on the position" in out and "bits cannot tell a ring's chunks" in out


# --- The default placements probe the whole buffer; a change with the size is told from the position ---

RING_4 = [FOLD_4_JSON, [[[1, 2], 3], 0], [[[2, 3], 0], 1], [[[0, 3], 1], 2]]
"""The spec ring's chunk folds at N = 4 (chunk c folds c, c+1, c+2, c+3), canonical."""


@pytest.mark.clause("invariance-placements")
@pytest.mark.parametrize(("n", "itemsize"), [(2, 4), (3, 4), (4, 4), (5, 8), (8, 4), (13, 8)])
@pytest.mark.parametrize("m", [1, 7, 16, 64, 65, 100, 4096, 1 << 20])
@pytest.mark.parametrize("k", [1, 4, 32])
def test_the_default_offsets_probe_every_chunk_of_every_layout(n: int, itemsize: int, m: int, k: int) -> None:
    if k > m:
        return
    offsets = chunk_offsets(n, m, k, itemsize=itemsize)
    assert offsets == sorted(set(offsets)) and all(0 <= o <= m - k for o in offsets)
    layouts: tuple[Layout, ...] = ("blocks", "gloo", "ceil", "floor") + (("even",) if m % n == 0 else ())
    chunks = [(lo, hi) for layout in layouts for lo, hi in chunk_bounds(layout, n, m, itemsize=itemsize)]
    for lo, hi in [*chunks, (m - 1, m)]:
        assert hi == lo or any(o < hi and lo < o + k for o in offsets), (lo, hi)
    # the fewest regions: each one's first element is a chunk's first element or the end's region
    starts = {lo for lo, hi in chunks if hi > lo}
    assert all(o in starts or o == m - k for o in offsets)


@pytest.mark.clause("invariance-placements")
def test_the_default_placements_are_per_size() -> None:
    # N = 3, K = 7: M = 64 is cut at 22, 43 (blocks), 22, 44 (gloo, ceil) and 21, 42 (floor); M = 4096 at
    # 1366, 2731 and 2732, and 1365, 2730 (floor): one region of 7 from the first cut of each cluster.
    k, placed = placements([4096, 7, 64], None, None, n=3)
    assert k == 7
    assert placed == [
        Placement(7, 0),
        *(Placement(64, o) for o in (0, 21, 42, 57)),
        *(Placement(4096, o) for o in (0, 1365, 2730, 4089)),
    ]
    with pytest.raises(InvarianceError, match=r"M = 2 cannot hold the 4 probed elements"):
        placements([2, 8], None, 4, n=4)


@pytest.mark.clause("invariance-placements", "invariance-summary")
def test_a_switch_from_a_fold_to_a_ring_is_named_with_the_default_offsets() -> None:
    # A fold up to M = 64, the ring above: the ring's chunk 0 folds 0, 1, 2, 3 like the fold, so offset 0
    # alone sees nothing (what main said); the default offsets reach chunks 1..3 at M = 128 and 4096.
    sizes = [16, 64, 128, 4096]
    assert invariance(planted_orders.fold_then_ring, 4, sizes, offsets=[0]).invariant
    found = invariance(planted_orders.fold_then_ring, 4, sizes)
    doc = _json(found)
    assert doc["invariant"] is False
    assert doc["summary"] == (
        "order changes above M = 64 (every element fold 0,1,2,3 (chain) up to M = 64, each element "
        "folds its chunk of the "
        "spec ring from M = 128 on)"
    )
    by_placement = {
        p: [tree_to_pairs(t) for t in row] for p, row in zip(found.placements, found.trees, strict=True)
    }
    assert by_placement[Placement(64, 48)] == [FOLD_4_JSON] * 16
    assert [by_placement[Placement(4096, 1024 * c)][0] for c in range(4)] == RING_4
    assert by_placement[Placement(128, 32)] == [RING_4[1]] * 16


@pytest.mark.clause("invariance-placements", "invariance-summary")
@pytest.mark.parametrize("offsets", [None, [0, 2000]], ids=["default", "offsets-0-2000"])
def test_recursive_doubling_then_a_ring_is_a_change_with_the_size(offsets: list[int] | None) -> None:
    # OpenMPI 5's default at N = 3: recursive doubling, (x0 + x1) + x2, below 4096 elements, its ring from
    # 4096 on, whose chunk 0 folds 0, 1, 2 too. Blamed on the size, not on the position.
    found = invariance(planted_orders.doubling_then_ring, 3, [7, 64, 4096], offsets=offsets)
    doc = _json(found)
    assert doc["invariant"] is False
    assert doc["summary"] == (
        "order changes above M = 64 (every element fold 0,1,2 (chain, recursive-doubling) up to M "
        "= 64, each element folds its "
        "chunk of the openmpi-ring ring from M = 4096 on)"
    )
    assert all(
        row == [((0, 1), 2)] * 7 for p, row in zip(found.placements, found.trees, strict=True) if p.m < 4096
    )


@pytest.mark.clause("invariance-summary")
def test_a_position_dependence_is_still_blamed_on_the_position() -> None:
    # M = 16: two whole blocks, pairwise; M = 20 from offset 4: elements 16..19 (probed 12..15) are the tail.
    found = invariance(planted_orders.tail_path, 4, [16, 20])
    doc = _json(found)
    assert found.placements == [Placement(16, 0), Placement(20, 0), Placement(20, 4)]
    assert doc["summary"] == (
        "order depends on the position (offset, or distance to the end): at M = 20, element 12 at offset 0 "
        "vs offset 4"
    )
    assert _sides(doc) == [(j, (20, 0), (20, 4)) for j in range(12, 16)]


@pytest.mark.clause("invariance-summary")
def test_two_changes_with_the_size_are_both_named() -> None:
    def three(x: torch.Tensor) -> torch.Tensor:
        m = x.shape[1]
        if m <= 16:
            return planted_orders.left_fold(x)
        return planted_orders.blocks_ring(x) if m <= 64 else planted_orders.pairwise(x)

    found = invariance(three, 4, [8, 16, 32, 64, 128])
    assert found.summary_line() == (
        "order changes above M = 16 and above M = 64 (every element fold 0,1,2,3 (chain) up to M = "
        "16, each element folds "
        "its chunk of the spec ring at M = 32 to 64, every element ((0+1)+(2+3)) "
        "(recursive-doubling) from M = 128 on)"
    )
    found = invariance(three, 4, [16, 32, 128])
    assert (
        "the spec ring at M = 32, every element ((0+1)+(2+3)) (recursive-doubling) from M = 128 on"
        in found.summary_line()
    )


# --- Pinned details: the nearest placement, every report line, the by-bits draws, the options' paths ---
# Each expected string below is written out from the rule it pins (the module docstrings and
# spec/invariance.md); results built by hand (``Invariance(...)``) give the report exact outcomes.

P = Placement


def test_a_first_change_is_told_against_the_nearest_earlier_placement() -> None:
    # the same offset at the largest smaller M: (8, 2) before (16, 2), not (16, 0) just before it
    changes = first_changes([P(4, 0), P(8, 2), P(16, 0), P(16, 2)], [["x"], ["x"], ["x"], ["y"]])
    assert changes == [Change(0, P(8, 2), P(16, 2), "x", "y")]
    # else the same M at the nearest offset, wherever it is listed: offset 0 (2 away), not 6 (4 away)
    changes = first_changes([P(8, 0), P(8, 6), P(8, 2)], [["x"], ["x"], ["y"]])
    assert changes == [Change(0, P(8, 0), P(8, 2), "x", "y")]
    # else the placement just before
    assert first_changes([P(4, 0), P(8, 2)], [["x"], ["y"]]) == [Change(0, P(4, 0), P(8, 2), "x", "y")]


def test_the_text_report_of_trees_names_each_change_and_an_element_without_a_tree() -> None:
    found = Invariance(
        "planted",
        4,
        3,
        "float32",
        "reveal",
        [P(3, 0), P(8, 0), P(8, 5)],
        [[FOLD_4] * 3, [FOLD_4] * 3, [PAIRWISE_4, PAIRWISE_4, None]],
        12,
        0.25,
    )
    # (8, 5) differs from (8, 0), the nearest offset at its size; M = 8 alone has no rule (no ring's chunk
    # is pairwise, none has no tree), so the position is blamed; elements 0, 1 change alike, element 2 not
    assert found.render().split("\n") == [
        "ring-ref invariance planted  (N = 4, K = 3 probed elements, float32, trees revealed)",
        "placements: M = 3, offset 0; M = 8, offset 0; M = 8, offset 5",
        "NOT invariant: order depends on the position (offset, or distance to the end): at M = 8, element 0 "
        "at offset 0 vs offset 5",
        "  elements 0..1: M = 8, offset 0: fold 0,1,2,3  ->  M = 8, offset 5: ((0+1)+(2+3))",
        "  element 2: M = 8, offset 0: fold 0,1,2,3  ->  M = 8, offset 5: no tree",
        "calls: 12; time 0.25 s",
    ]


def test_the_text_report_of_bits_shows_the_bits_and_the_counterexample() -> None:
    bits: list[list[Hashable]] = [["3f800000"], ["3f800000"], ["3f800001"]]
    found = Invariance("planted", 2, 1, "float32", "bits", [P(1, 0), P(8, 0), P(16, 0)], bits, 9, 1.5)
    found.counterexample = [[1.0], [2.0]]
    # sizes 1..8 have the same bits, 16 others: a change above M = 8; bits name no tree, so no one-tree label
    assert found.render().split("\n") == [
        "ring-ref invariance planted  (N = 2, K = 1 probed elements, float32, bits compared (--by-bits))",
        "placements: M = 1, offset 0; M = 8, offset 0; M = 16, offset 0",
        "NOT invariant: bits change above M = 8 (the same up to M = 8, other from M = 16 on)",
        "  element 0: M = 8, offset 0: 3f800000  ->  M = 16, offset 0: 3f800001",
        "  counterexample (probe values, worker by worker, in --json): N x K = 2 x 1",
        "calls: 9; time 1.50 s",
    ]


def test_a_bits_report_says_what_a_screen_cannot_tell() -> None:
    same = Invariance("t", 2, 1, "float64", "bits", [P(1, 0), P(4, 0)], [["0"], ["0"]], 8, 0.0)
    assert same.render().split("\n")[2:] == [
        "invariant: bits invariant over 2 placements (M = 1, 4; offsets 0)",
        "  (a screen: equal bits on random inputs do not prove one order; run without --by-bits to compare "
        "the trees)",
        "calls: 8; time 0.00 s",
    ]
    moved = Invariance(
        "t", 2, 1, "float64", "bits", [P(1, 0), P(4, 0), P(4, 3)], [["0"], ["0"], ["1"]], 8, 0.0
    )
    assert moved.render().split("\n")[2:] == [
        "NOT invariant: bits depend on the position (offset, or distance to the end): at M = 4, element 0 at "
        "offset 0 vs offset 3",
        "  element 0: M = 4, offset 0: 0  ->  M = 4, offset 3: 1",
        "  (a screen: bits cannot tell a ring's chunks, or a change to a ring with the size, from the "
        "position; run without --by-bits to name them)",
        "calls: 8; time 0.00 s",
    ]


def test_the_json_rounds_the_seconds_to_four_places() -> None:
    found = Invariance("t", 2, 1, "float32", "bits", [P(1, 0)], [["0"]], 4, 0.123456789)
    assert _json(found)["seconds"] == 0.1235


def test_a_run_with_one_tree_is_named_by_it_and_only_presets_in_parentheses() -> None:
    # reverse_fold's tree is no preset's: no parentheses; no tree at all is "the same", not a tree
    rev = Invariance("t", 4, 1, "float32", "reveal", [P(4, 0), P(8, 0)], [[REVERSE_4], [PAIRWISE_4]], 2, 0.0)
    assert rev.summary_line() == (
        "order changes above M = 4 (every element fold 3,2,1,0 up to M = 4, every element ((0+1)+(2+3)) "
        "(recursive-doubling) from M = 8 on)"
    )
    none = Invariance("t", 4, 1, "float32", "reveal", [P(4, 0), P(8, 0)], [[None], [PAIRWISE_4]], 2, 0.0)
    assert none.summary_line() == (
        "order changes above M = 4 (the same up to M = 4, every element ((0+1)+(2+3)) (recursive-doubling) "
        "from M = 8 on)"
    )
    # several trees in one run, the same at every placement: "the same", then "other"
    both: list[Hashable] = [FOLD_4, PAIRWISE_4]
    several = Invariance("t", 4, 2, "float32", "reveal", [P(2, 0), P(8, 0)], [both, both[::-1]], 2, 0.0)
    assert several.summary_line() == "order changes above M = 2 (the same up to M = 2, other from M = 8 on)"


def test_a_position_dependence_is_not_blamed_on_a_change_of_size() -> None:
    # (20, 0) differs from (8, 0) too, but that is another size: the position is (20, 0) vs (20, 16)
    found = Invariance(
        "t",
        4,
        1,
        "float32",
        "reveal",
        [P(8, 0), P(20, 0), P(20, 16)],
        [[FOLD_4], [PAIRWISE_4], [REVERSE_4]],
        3,
        0.0,
    )
    assert found.summary_line() == (
        "order depends on the position (offset, or distance to the end): at M = 20, element 0 at offset 0 vs "
        "offset 16"
    )


@pytest.mark.clause("invariance-summary")
def test_a_ring_that_is_no_preset_is_named_by_its_direction_offset_and_layout() -> None:
    # N = 4, blocks: M = 9 cut 3, 2, 2, 2 (chunks at 0, 3, 5, 7), M = 10 cut 3, 3, 2, 2 (at 0, 3, 6, 8);
    # direction -1, offset 0: chunk c folds c, c - 1, c - 2, c - 3 (mod 4); no preset runs so on blocks.
    ring = RingSchedule(-1, 0, "blocks")
    found = invariance(lambda x: ring_all_reduce(x, schedule=ring), 4, [9, 10])
    assert found.placements == [P(9, 0), P(10, 0), P(10, 1)]
    assert found.summary_line() == (
        "order changes with M: at chunk boundaries, the blocks layout's chunks (each element folds its "
        "chunk, the ring with direction -1, offset 0, layout blocks)"
    )
    assert found.render().split("\n")[3:6] == [
        "  element 2: M = 10, offset 0: fold 0,3,2,1  ->  M = 10, offset 1: fold 1,0,3,2",
        "  element 5: M = 9, offset 0: fold 2,1,0,3  ->  M = 10, offset 0: fold 1,0,3,2",
        "  element 7: M = 9, offset 0: fold 3,2,1,0  ->  M = 10, offset 0: fold 2,1,0,3",
    ]


@pytest.mark.clause("invariance-placements")
def test_placements_at_the_edges_of_what_they_accept() -> None:
    assert placements([1], [0], 1) == (1, [P(1, 0)])  # one element, a probe of one
    assert placements([5, 40], [2], None)[0] == 3  # K = smallest M - smallest offset
    assert placements([16], None, 4) == (4, [P(16, 0), P(16, 12)])  # N = 1 unless given: one chunk, the end
    with pytest.raises(InvarianceError) as refused:
        placements([8], [0], 0)
    assert str(refused.value) == (
        "the probe region needs at least 1 element; got K = 0 (give --probe K, or sizes larger than the "
        "smallest offset)"
    )
    with pytest.raises(InvarianceError) as refused:
        placements([3, 8], [1], 4)
    assert str(refused.value) == (
        "M = 3 cannot hold the 4 probed elements at any offset [1]: give a smaller --probe (at most 2) or "
        "drop that size"
    )


GLOO_M = 900_001
"""A size where gloo's chunks depend on the element size (``ring_ref._chunks._gloo_chunk_elements``), at
N = 2: segments of at most 2^20 bytes, at least 2 N = 4, a multiple of N; chunk = (segments / N) ceil(M /
segments). 4 bytes: ceil(3600004 / 2^20) = 4 segments, chunk 2 * 225001 = 450002. 8 bytes: 7 -> 8 segments,
chunk 4 * 112501 = 450004. (5 bytes, segments of 5 * 209715 bytes: 5 -> 6, chunk 3 * 150001 = 450003.)
The other layouts cut at 450000 (floor) and 450001 (blocks, ceil); the end is 900000."""


@pytest.mark.clause("invariance-placements")
def test_the_default_offsets_follow_gloo_by_the_element_size() -> None:
    four = [0, 450_000, 450_001, 450_002, GLOO_M - 1]
    eight = [0, 450_000, 450_001, 450_004, GLOO_M - 1]
    assert chunk_offsets(2, GLOO_M, 1) == four  # float32's 4 bytes unless told
    assert chunk_offsets(2, GLOO_M, 1, itemsize=8) == eight
    assert placements([GLOO_M], None, 1, n=2) == (1, [P(GLOO_M, o) for o in four])
    assert placements([GLOO_M], None, 1, n=2, itemsize=8) == (1, [P(GLOO_M, o) for o in eight])
    dtypes: list[torch.dtype] = []

    def fold(x: torch.Tensor) -> torch.Tensor:
        dtypes.append(x.dtype)
        return planted_orders.left_fold(x)

    found = invariance(fold, 2, [GLOO_M], probe=1, dtype="float64")  # float64: 8 bytes, revealed in float64
    assert found.placements == [P(GLOO_M, o) for o in eight] and found.invariant
    assert dtypes and set(dtypes) == {torch.float64}


@pytest.mark.clause("invariance-embedding")
def test_the_wrapper_keeps_the_probes_dtype_and_names_a_fill_that_does_not_fit() -> None:
    tiny = 2.0**-40  # 1 + 2^-39 is a float64, not a float32
    x = torch.tensor([[1.0 + tiny], [tiny]], dtype=torch.float64)
    out = Embedded(planted_orders.left_fold, P(3, 1))(x)
    assert out.dtype == torch.float64 and out.tolist() == [1.0 + 2 * tiny]
    x32 = torch.ones((2, 2))
    for fill, got in [
        (torch.zeros((2, 4)), "(2, 4) torch.float32"),
        (torch.zeros((2, 5), dtype=torch.float64), "(2, 5) torch.float64"),
    ]:
        with pytest.raises(RevealError) as refused:
            Embedded(planted_orders.left_fold, P(5, 1), fill)(x32)
        assert str(refused.value) == f"the fill must be (2, 5) torch.float32; got {got}"


def _spec_draw(shape: tuple[int, int], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Clause ``invariance-by-bits``'s values ``±(1 + u) 2^e``, ``e`` in ``-8 .. 8``: the sign, ``u`` and
    ``e`` drawn in turn from the seeded generator."""
    sign = torch.randint(0, 2, shape, generator=generator).double() * 2 - 1
    u = torch.rand(shape, generator=generator, dtype=torch.float64)
    e = torch.randint(-8, 9, shape, generator=generator).double()
    return (sign * (1 + u) * 2.0**e).to(dtype)


@pytest.mark.clause("invariance-by-bits")
def test_the_random_values_span_both_signs_and_seventeen_binades() -> None:
    state = torch.random.get_rng_state()
    x = _random((4, 4096), torch.float64, torch.Generator().manual_seed(7))
    assert torch.equal(torch.random.get_rng_state(), state)  # the seeded generator only
    assert torch.equal(x, _random((4, 4096), torch.float64, torch.Generator().manual_seed(7)))
    mantissa, exponent = torch.frexp(x.abs())  # |x| = mantissa 2^exponent, mantissa in [1/2, 1)
    assert bool((x > 0).any()) and bool((x < 0).any())
    assert sorted(set((exponent - 1).reshape(-1).tolist())) == list(
        range(-8, 9)
    )  # 1 + u in [1, 2): e = exponent - 1
    assert bool((x.abs() >= 2.0**-8).all()) and bool((x.abs() < 2.0**9).all())
    assert bool((x.to(torch.float32).to(torch.float64) != x).any()), "u has float64's precision"
    assert torch.equal(mantissa, mantissa)  # no NaN


@pytest.mark.clause("invariance-by-bits")
def test_by_bits_draws_replay_from_the_seed() -> None:
    # The draws, in turn: the (N, K) probe, then the fill of every placement but the region alone.
    seen: list[torch.Tensor] = []

    def recording(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return planted_orders.left_fold(x)

    state = torch.random.get_rng_state()
    found = invariance(recording, 3, [6, 20], offsets=[0, 9], probe=6, by_bits=True, draws=2)  # seed 0
    assert torch.equal(torch.random.get_rng_state(), state)
    assert found.invariant and found.calls == len(seen) == 2 * 3
    generator = torch.Generator().manual_seed(0)
    for draw in range(2):
        x = _spec_draw((3, 6), torch.float32, generator)
        assert torch.equal(seen[3 * draw], x)
        for i, offset in enumerate([0, 9], start=1):
            fill = _spec_draw((3, 20), torch.float32, generator)
            fill[:, offset : offset + 6] = x
            assert torch.equal(seen[3 * draw + i], fill)


@pytest.mark.clause("invariance-by-bits")
def test_by_bits_with_the_region_alone_only_is_invariant() -> None:
    found = invariance(planted_orders.left_fold, 1, [4], offsets=[0], probe=4, by_bits=True)
    assert found.invariant and found.placements == [P(4, 0)] and found.calls == 4  # BITS_DRAWS, one call each
    for offsets in (None, [0]):  # no workers: the default offsets have no chunks to cut
        with pytest.raises(InvarianceError) as refused:
            invariance(planted_orders.left_fold, 0, [4], offsets=offsets, probe=4, by_bits=True)
        assert str(refused.value) == "N = 0 must be at least 1"
    with pytest.raises(RevealError, match=r"^N = 0 and M = 4 must both be at least 1$"):
        invariance(planted_orders.left_fold, 0, [4], offsets=[0], probe=4)


@pytest.mark.clause("invariance-reveal")
def test_the_calls_the_seed_and_the_checks_reach_reveal() -> None:
    seen: list[torch.Tensor] = []

    def recording(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return planted_orders.left_fold(x)

    def run(**options: Any) -> tuple[Invariance, list[torch.Tensor]]:
        seen.clear()
        before = time.perf_counter()
        found = invariance(recording, 3, [4, 8], offsets=[0, 2], probe=4, **options)
        assert 0 <= found.seconds <= time.perf_counter() - before
        return found, list(seen)

    # (4, 0), (8, 0) and the overlapping (8, 2): three reveals, their calls summed, the target's own count
    found, calls = run()
    assert found.calls == len(calls) and len({c.shape[1] for c in calls}) == 2
    _, again = run()
    _, other_seed = run(seed=5)
    _, same_seed = run(seed=5)
    assert len(again) == len(calls) and all(map(torch.equal, again, calls))
    assert len(same_seed) == len(other_seed) and all(map(torch.equal, same_seed, other_seed))
    assert not (len(other_seed) == len(calls) and all(map(torch.equal, other_seed, calls)))
    unchecked, _ = run(checks=0)
    assert unchecked.invariant and unchecked.calls < found.calls
    with pytest.raises(InvarianceError) as refused:
        invariance(recording, 3, [4], checks=-1)
    assert str(refused.value) == "checks must be 0 or more; got -1"


@pytest.mark.clause("invariance-cli")
def test_the_target_is_named_by_its_name_its_qualified_name_or_its_type() -> None:
    by_name = "tests.common.planted_orders:left_fold"
    assert invariance(by_name, 2, [2], probe=1).target == by_name
    assert invariance(planted_orders.left_fold, 2, [2], probe=1).target == "linear_fold"
    assert invariance(functools.partial(planted_orders.left_fold), 2, [2], probe=1).target == "partial"
    assert invariance(by_name, 2, [2], probe=1, dtype="float64").invariant
    with pytest.raises(InvarianceError, match="float32 or float64"):
        invariance(by_name, 2, [2], probe=1, dtype="int8")


@pytest.mark.clause("invariance-in-job")
def test_options_that_cannot_serve_are_refused_in_their_own_words() -> None:
    name = "tests.common.planted_orders:left_fold"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"mca": {"a": "1"}}, "mca options are passed to mpirun: they need ranks='mpi' (--ranks mpi)"),
        (
            {"mpiexec": "mpirun"},
            "mpiexec (--mpiexec) is the launcher the tester starts an MPI job with: it needs ranks='mpi' "
            "(--ranks mpi); got ranks=None",
        ),
        ({"ranks": "nccl"}, "ranks must be one of gloo, mpi, job, mpi-job, jax, mlx; got 'nccl'"),
    ]
    for options, message in cases:
        with pytest.raises(InvarianceError) as refused:
            invariance(name, 2, [2], probe=1, **options)
        assert str(refused.value) == message
    with pytest.raises(InvarianceError) as refused:
        invariance(planted_orders.left_fold, 2, [2], probe=1, ranks="mpi")
    assert str(refused.value) == (
        "a per-rank target runs in processes of its own: give it by name (package.module:function or "
        "path/to/file.py:function), not as a function object"
    )


@pytest.mark.clause("invariance-in-job")
def test_an_mpi_job_gets_its_mca_options_and_launcher() -> None:
    # past every refusal to the launcher, which names the mpiexec it was given (no job is started)
    with pytest.raises(TargetError, match="/nonexistent/mpirun"):
        invariance(
            "tests.common.planted_orders:left_fold",
            2,
            [2],
            probe=1,
            ranks="mpi",
            mca={"btl": "self"},
            mpiexec="/nonexistent/mpirun",
        )


@pytest.mark.clause("invariance-in-job")
def test_a_gloo_group_of_ranks_serves_a_per_rank_target() -> None:
    found = invariance("torch.distributed:all_reduce", 2, [2], probe=1, ranks="gloo", env={"RING_REF_T": "1"})
    assert found.invariant and found.placements == [P(2, 0), P(2, 1)]
    assert found.trees == [[(0, 1)], [(0, 1)]]


@pytest.mark.clause("invariance-in-job")
def test_a_job_of_one_rank_measures_through_its_own_group() -> None:
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        found = invariance("torch.distributed:all_reduce", 1, [2, 3], probe=1, ranks="job")
        with pytest.raises(InvarianceError) as refused:
            invariance("torch.distributed:all_reduce", 2, [2], probe=1, ranks="job")
    finally:
        dist.destroy_process_group()
    assert found.invariant and found.placements == [P(2, 0), P(2, 1), P(3, 0), P(3, 2)]
    assert found.trees == [[0]] * 4  # one worker: its own value
    assert str(refused.value) == "n (-n) must be the job's 1 ranks; got 2"


@pytest.mark.clause("invariance-in-job")
def test_an_mpi_job_goes_through_the_mpi_job_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    # mpi4py's singleton would leave PMIx variables in every later test's environment: the MPI job's size and
    # protocol are stood in for by this process's one-rank torch group, which serves the same protocol.
    asked: list[tuple[object, ...]] = []

    def size(ranks: str, group: object, max_workers: object) -> int:
        asked.append((ranks, group, max_workers))
        return 1

    def mpi_job(target: str, run: Any, *, timeout_s: float) -> Invariance:
        asked.append((target, timeout_s))
        served: Invariance = run_in_job("torch.distributed:all_reduce", run, timeout_s=timeout_s)
        return served

    monkeypatch.setattr(_run, "job_size", size)
    monkeypatch.setattr(_run, "run_in_mpi_job", mpi_job)
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        found = invariance(
            "tests.common.planted_mpi:plain_ring", 1, [2], probe=1, ranks="mpi-job", timeout=30.0
        )
    finally:
        dist.destroy_process_group()
    assert asked == [("mpi-job", None, None), ("tests.common.planted_mpi:plain_ring", 30.0)]
    assert found.invariant and found.trees == [[0], [0]]
