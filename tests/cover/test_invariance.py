"""``ring-ref invariance`` (spec/invariance.md): does an element's order move with the size or its position?

The targets are plain loops (``tests/common/planted_orders.py``); every expected tree
is typed in below in the canonical spelling of clause ``reveal-trees``, and
every expected placement is worked out by hand from the rule of clause
``invariance-report``.
"""

from __future__ import annotations

import json
import pickle
import struct
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._chunks import chunk_bounds
from ring_ref._cli import main
from ring_ref._order import tree_to_pairs
from ring_ref._order_stability import Embedded, Placement, chunk_offsets, placements
from ring_ref._reveal import RevealError
from ring_ref._svg import invariance_svg
from ring_ref.invariance import Invariance, InvarianceError, invariance
from ring_ref.schedule import Layout
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
