"""difftest --collective reduce-scatter | all-gather, stacked targets: shapes, oracles, codes, options."""

from __future__ import annotations

import json
import math
import random
import struct

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import RingSchedule, ring_all_reduce
from ring_ref._cli import main
from ring_ref._dtypes import format_of
from ring_ref.difftest import Case, difftest
from ring_ref.difftest._call import call_target
from ring_ref.difftest._diagnosis import _kind_of, diagnose, gather_findings, wrong_shard
from ring_ref.difftest._inputs import exact_tensor, gather_values
from ring_ref.difftest._launch import as_launcher
from ring_ref.difftest._oracles import reduce_scatter_reference
from ring_ref.schedule import GLOO, Collective, reduce_scatter_ring
from ring_ref.testing import assert_matches_reference
from tests.common import planted_impls
from tests.common.paths import ROOT
from tests.common.planted_impls import Impl

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
MODES = ("exact", "order-free", "bound")


@pytest.mark.clause("difftest-collectives", "difftest-diagnoses")
@pytest.mark.parametrize(
    ("fn", "collective", "expected"),
    planted_impls.COLLECTIVE_EXPECTED,
    ids=[f"{fn.__name__}" for fn, _, _ in planted_impls.COLLECTIVE_EXPECTED],
)
def test_planted_collective_gets_its_code_in_every_mode(
    fn: Impl, collective: str, expected: dict[str, set[str]]
) -> None:
    report = difftest(fn, collective=collective, examples=25, seed=11)  # type: ignore[arg-type]
    assert report.collective == collective
    for mode in MODES:
        result = report.modes[mode]
        codes = set(result.finding.codes) if result.finding is not None else set()
        assert codes == expected[mode], (mode, report.render())
        assert result.verdict == ("fail" if expected[mode] else "pass")
    jsonschema.validate(report.to_json(), SCHEMA)
    assert f"--collective {collective}" in report.replay


@pytest.mark.clause("difftest-collectives")
def test_wrong_shard_and_misplaced_name_the_chunks_and_slots() -> None:
    shard = difftest(
        planted_impls.reduce_scatter_next_chunk, collective="reduce-scatter", examples=10, seed=1
    )
    finding = shard.modes["order-free"].finding
    assert finding is not None and finding.codes == ["wrong-shard"]
    n = shard.modes["order-free"].counterexample.n  # type: ignore[union-attr]
    # rank r holds chunk r + 1: every rank named, with the chunk it holds
    for r in range(n):
        assert f"rank {r} holds chunk {(r + 1) % n}" in finding.explanation
    gathered = difftest(planted_impls.all_gather_reversed, collective="all-gather", examples=10, seed=1)
    found = gathered.modes["exact"].finding
    case = gathered.modes["exact"].counterexample
    assert found is not None and case is not None and found.codes == ["gather-misplaced"]
    assert f"slot 0 holds rank {case.n - 1}'s shard" in found.explanation


def _bits16(value: float, dtype: torch.dtype) -> int:
    return int(exact_tensor([value], dtype).view(torch.int16)[0]) & 0xFFFF


def canonical_nans(x: torch.Tensor) -> torch.Tensor:
    """Bug: every NaN written as the default NaN (a payload and a sign lost)."""
    flat = x.reshape(-1, *x.shape[2:])
    return torch.where(torch.isnan(flat), torch.full_like(flat, math.nan), flat)


def flushes_subnormals(x: torch.Tensor) -> torch.Tensor:
    """Bug: subnormals flushed to zero of the same sign (as FTZ hardware does)."""
    flat = x.reshape(-1, *x.shape[2:]).clone()
    tiny = flat.abs() < torch.finfo(x.dtype).tiny
    flat[tiny & (flat != 0)] = 0.0 * torch.sign(flat[tiny & (flat != 0)])
    return flat


@pytest.mark.clause("difftest-collectives")
@pytest.mark.parametrize(("fn", "words"), [(canonical_nans, "a NaN"), (flushes_subnormals, "a subnormal")])
def test_the_copy_oracle_sees_nan_payloads_and_subnormals(fn: Impl, words: str) -> None:
    report = difftest(fn, collective="all-gather", modes="exact", examples=30, seed=4)
    finding = report.modes["exact"].finding
    assert finding is not None and finding.codes == ["gather-changed-bits"], report.render()
    assert f"should be {words}" in finding.explanation
    jsonschema.validate(report.to_json(), SCHEMA)  # NaN inputs are written as strings: strict JSON


@pytest.mark.clause("difftest-collectives")
def test_all_gather_inputs_hold_nan_payloads_signed_zeros_and_subnormals() -> None:
    # bfloat16 NaN payloads survive the case's floats (converting a float64 NaN would drop them)
    nan = struct.unpack(">f", bytes.fromhex("7fc50000"))[0]
    assert _bits16(nan, torch.bfloat16) == 0x7FC5
    values = gather_values(torch.float16, 400, random.Random(3))
    patterns = {int(v) & 0xFFFF for v in exact_tensor(values, torch.float16).view(torch.int16)}
    nans = {p for p in patterns if p & 0x7C00 == 0x7C00 and p & 0x03FF}
    assert len(nans) >= 3 and any(p & 0x8000 for p in nans)  # several payloads, both signs
    assert {0x0000, 0x8000, 0x0001, 0x7C00, 0xFC00} <= patterns  # zeros, smallest subnormal, infinities


@pytest.mark.clause("difftest-collectives")
def test_shapes_per_collective() -> None:
    rs = Case(2, 4, (3,), torch.float32, "contiguous", (0.0,) * 24, collective=Collective.REDUCE_SCATTER)
    assert rs.result_shape() == (2, 2, 3) and rs.result_shape(0) == (2, 3)
    ag = Case(3, 2, (), torch.float32, "contiguous", (0.0,) * 6, collective=Collective.ALL_GATHER)
    assert ag.collective is Collective.ALL_GATHER  # a name is read as the value
    assert ag.result_shape() == (6,) and ag.result_shape(2) == (6,)
    assert torch.isnan(ag.output_tensor(1)).all() and ag.output_tensor(1).shape == (6,)


def _left_fold(x: torch.Tensor, order: list[int]) -> torch.Tensor:
    total = x[order[0]].clone()
    for w in order[1:]:
        total = total + x[w]
    return total


@pytest.mark.clause("difftest-collectives")
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_reduce_scatter_reference_folds_each_shard_from_the_next_rank(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, 2 * n, dtype=torch.float32, generator=gen) * 2.0 ** torch.randint(-8, 8, (n, 2 * n))
    got = reduce_scatter_reference(x)
    # by hand: shard r folds r + 1, r + 2, ..., r (spec); gloo's runs the other way: r - 1, r - 2, ..., r
    for r in range(n):
        rows = x[:, 2 * r : 2 * r + 2]
        assert torch.equal(got[r], _left_fold(rows, [(r + j) % n for j in range(1, n + 1)]))
        gloo = reduce_scatter_reference(x, schedule="gloo")[r]
        assert torch.equal(gloo, _left_fold(rows, [(r - j) % n for j in range(1, n + 1)]))
    # the theorem's other side: the shards make the all-reduce of the same ring
    assert torch.equal(got.reshape(-1), ring_all_reduce(x, schedule=RingSchedule(1, 1, "even")))


@pytest.mark.clause("difftest-collectives")
def test_reduce_scatter_rings_and_refusals() -> None:
    assert reduce_scatter_ring(None, 4) == RingSchedule(1, 1, "even")
    assert reduce_scatter_ring("openmpi-ring", 4) == RingSchedule(1, 1, "blocks")
    assert reduce_scatter_ring("gloo", 4) == GLOO
    assert reduce_scatter_ring(RingSchedule(-1, 3, "even"), 4) == RingSchedule(-1, 3, "even")
    with pytest.raises(ValueError, match=r"offset equals its direction .*RingSchedule\(1, 1, 'even'\)"):
        reduce_scatter_ring(RingSchedule(1, 0, "even"), 3)
    with pytest.raises(ValueError, match="M = 4 is not divisible by N = 3"):
        reduce_scatter_reference(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="cuts a worker's S = 2 elements into chunks of 2, 0"):
        reduce_scatter_reference(torch.zeros(2, 2), schedule="gloo")  # gloo cuts 2 elements as 2 + 0
    fn = planted_impls.reduce_scatter_folded
    with pytest.raises(ValueError, match="offset equals its direction"):
        difftest(fn, collective="reduce-scatter", schedule=RingSchedule(1, 0, "even"), examples=1)
    with pytest.raises(ValueError, match="reveal and name all-reduce orders"):
        difftest(fn, collective="reduce-scatter", schedule="auto", examples=1)
    with pytest.raises(ValueError, match="drop op"):
        difftest(planted_impls.all_gather_copied, collective="all-gather", op="max", examples=1)
    with pytest.raises(ValueError, match=r"collective \(--collective\) must be one of"):
        difftest(fn, collective="broadcast", examples=1)  # type: ignore[arg-type]


def gloo_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """Shard r folds r - 1, r - 2, ..., r, written out: the gloo preset's reduce-scatter ring."""
    n, rows = x.shape[0], x.shape[1] // x.shape[0]
    return torch.stack(
        [
            _left_fold(x[:, r * rows : (r + 1) * rows], [(r - j) % n for j in range(1, n + 1)])
            for r in range(n)
        ]
    )


@pytest.mark.clause("difftest-collectives")
def test_exact_checks_the_named_schedules_reduce_scatter_ring() -> None:
    assert (
        difftest(
            gloo_reduce_scatter,
            collective="reduce-scatter",
            schedule="gloo",
            modes="exact",
            examples=40,
            seed=2,
            dtypes=[torch.float32],
        ).verdict
        == "pass"
    )
    spec = difftest(gloo_reduce_scatter, collective="reduce-scatter", modes="exact", examples=40, seed=2)
    finding = spec.modes["exact"].finding
    assert finding is not None and finding.codes == ["not-ring-order"], spec.render()
    assert "the spec reduce-scatter ring (direction +1, offset 1, layout even)" in finding.explanation


def all_gather_of_reduce_scatter(x: torch.Tensor) -> torch.Tensor:
    """A user's composition: the all-gather of the reduce-scatter, checked as an all-reduce."""
    return planted_impls.all_gather_copied(planted_impls.reduce_scatter_folded(x)[:, None]).reshape(
        x.shape[1:]
    )


@pytest.mark.clause("difftest-collectives")
def test_a_composition_checked_as_an_all_reduce_passes_or_names_the_difference() -> None:
    # The spec's all-reduce ring (+1, 0) folds chunk c from c; the reduce-scatter ring from c + 1: the
    # composition is a correct all-reduce in another order, and equal to the ring (+1, +1) bit for bit.
    report = difftest(all_gather_of_reduce_scatter, examples=40, seed=5)
    assert report.modes["order-free"].verdict == report.modes["bound"].verdict == "pass"
    finding = report.modes["exact"].finding
    assert finding is not None and finding.codes == ["not-ring-order"], report.render()
    assert report.only_ring_order
    same_ring = difftest(all_gather_of_reduce_scatter, schedule="1,1,even", examples=40, seed=5)
    assert same_ring.verdict == "pass", same_ring.render()


@pytest.mark.clause("difftest-collectives")
def test_command_line_and_assert_matches_reference(capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--examples", "10", "--seed", "1", "--in-process", "--json"]
    target = "tests.common.planted_impls:all_gather_reversed"
    assert main(["difftest", target, "--collective", "all-gather", *common]) == 1
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["collective"] == "all-gather" and doc["diagnoses"] == ["gather-misplaced"]
    assert (
        main(
            [
                "difftest",
                "tests.common.planted_impls:reduce_scatter_folded",
                "--collective",
                "reduce-scatter",
                *common,
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["exact_against"]["order"].startswith("the spec reduce-scatter")
    with pytest.raises(SystemExit, match="2"):
        main(["difftest", target, "--collective", "gather", *common])
    assert "invalid choice" in capsys.readouterr().err
    passed = assert_matches_reference(planted_impls.all_gather_copied, collective="all-gather", examples=5)
    assert passed.collective == "all-gather"
    with pytest.raises(AssertionError, match="wrong-shard"):
        assert_matches_reference(
            planted_impls.reduce_scatter_next_chunk, collective="reduce-scatter", mode="bound", examples=5
        )


@pytest.mark.clause("difftest-collectives", "difftest-order-probes")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_reduce_scatter_fails_another_order_whatever_the_seed(seed: int) -> None:
    # one random input rarely tells two orders apart; the order probes, run on the shards, always do
    report = difftest(
        gloo_reduce_scatter, collective="reduce-scatter", modes="exact", examples=1, seed=seed, max_workers=4
    )
    result = report.modes["exact"]
    assert result.finding is not None and result.finding.codes == ["not-ring-order"], report.render()
    assert result.probes is not None and result.probes.calls >= 1
    ok = difftest(
        reduce_scatter_folded_spec,
        collective="reduce-scatter",
        modes="exact",
        examples=1,
        seed=seed,
        max_workers=4,
    )
    assert ok.verdict == "pass" and ok.modes["exact"].probes is not None
    assert ok.modes["exact"].probes.workers["float32"] == [2, 3, 4]


def reduce_scatter_folded_spec(x: torch.Tensor) -> torch.Tensor:
    """The planted correct reduce-scatter, importable from this module too."""
    return planted_impls.reduce_scatter_folded(x)


@pytest.mark.clause("difftest-collectives")
def test_reveal_names_each_shards_order(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["reveal", "tests.common.planted_impls:reduce_scatter_folded", "-n", "4", "-m", "8"]
    assert main([*args, "--collective", "reduce-scatter"]) == 0
    out = capsys.readouterr().out
    # by hand: shard r folds r + 1, r + 2, r + 3, r (the spec's reduce-scatter ring, +1 with offset +1;
    # at N = 3 it is gloo's too, as the first addition commutes)
    for line in (
        "shard 0 (rank 0): fold 1,2,3,0",
        "shard 1 (rank 1): fold 2,3,0,1",
        "shard 2 (rank 2): fold 3,0,1,2",
        "shard 3 (rank 3): fold 0,1,2,3",
        "the reduce-scatter ring of preset(s): spec",
    ):
        assert line in out, out
    assert "classification: ring (direction +1, offset 1, layout even)" in out
    # without --collective the (N, M/N) shards are no all-reduce result: reveal names the shape
    assert main(args) == 2
    assert "ring-ref reveal: error" in capsys.readouterr().err


@pytest.mark.clause("difftest-coverage")
def test_an_all_gather_report_prints_its_one_check_once() -> None:
    """Issue #40 item 9: an all-gather's three modes are one bitwise check: one line in the text report,
    the three modes in the JSON one."""
    report = difftest(planted_impls.all_gather_copied, collective="all-gather", examples=5, seed=2)
    text = report.render()
    assert "  exact, order-free, bound: PASS (one check for an all-gather" in text, text
    assert "  exact: " not in text and "  bound: " not in text, text
    assert set(report.to_json()["modes"]) == {"exact", "order-free", "bound"}


# --- the collectives' findings, word for word (ring_ref.difftest._diagnosis) ----------------------------

# N = 4 workers of one element each: worker r holds r + 1, so slot r of an all-gather holds r + 1.
GATHER4 = Case(4, 1, (), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0), collective=Collective.ALL_GATHER)


@pytest.mark.clause("difftest-collectives")
def test_gather_findings_name_each_rank_its_slots_and_the_first_changed_element() -> None:
    by_rank: dict[int | None, torch.Tensor | None] = {
        0: None,  # no well-formed result: skipped, the ranks after it still read
        1: torch.tensor([1.0, 2.0, 3.0, 4.0]),  # right: nothing to say, the ranks after it still read
        2: torch.tensor([2.0, 1.0, 3.0, 4.0]),  # slots 0 and 1 swapped
        3: torch.tensor([1.0, 2.0, 3.0, 7.0]),  # slot 3 holds 7.0 (0x40e00000), which no rank sent
    }
    misplaced, changed = gather_findings(GATHER4, by_rank)
    assert misplaced.codes == ["gather-misplaced"] and misplaced.ranks == [2]
    assert misplaced.explanation == (
        "rank(s) [2]: slot 0 holds rank 1's shard, slot 1 holds rank 0's shard: an all-gather puts rank r's "
        "shard in slot r"
    )
    assert changed.codes == ["gather-changed-bits"] and changed.ranks == [3]
    assert changed.explanation == (
        "rank(s) [3]: element (3,) (slot 3) should be a normal value: bits 0x40e00000 where rank 3's shard "
        "holds 0x40800000 (an all-gather copies every bit)"
    )
    m = changed.mismatch
    assert m is not None and (m.index, m.chunk, m.expected, m.actual) == ((3,), 3, 4.0, 7.0)
    # two ranks alike are one finding naming both; the element shown is the first rank's
    both = gather_findings(
        GATHER4, {0: torch.tensor([1.0, 2.0, 3.0, 7.0]), 1: torch.tensor([1.0, 9.0, 3.0, 4.0])}
    )
    assert [f.explanation.split(":")[0] for f in both] == ["rank(s) [0]", "rank(s) [1]"]
    assert both[0].mismatch is not None and both[0].mismatch.index == (3,)
    # a stacked result names no rank
    [stacked] = gather_findings(GATHER4, {None: torch.tensor([4.0, 2.0, 3.0, 1.0])})
    assert stacked.explanation == (
        "slot 0 holds rank 3's shard, slot 3 holds rank 0's shard: an all-gather puts rank r's shard in "
        "slot r"
    )
    assert stacked.ranks == []
    [stacked] = gather_findings(GATHER4, {None: torch.tensor([1.0, 2.0, 3.0, -0.0])})
    assert stacked.explanation.startswith("element (3,) (slot 3) should be a normal value: bits 0x80000000 ")
    assert stacked.ranks == [] and stacked.mismatch is not None


@pytest.mark.clause("difftest-collectives")
def test_a_copied_value_is_named_by_its_kind() -> None:
    fmt = format_of(torch.float32)
    tiny = torch.finfo(torch.float32).tiny
    assert _kind_of(0.0, fmt) == "a positive zero"
    assert _kind_of(-0.0, fmt) == "a negative zero"
    assert _kind_of(1.0, fmt) == "a normal value"
    assert _kind_of(-math.inf, fmt) == "an infinity"
    assert _kind_of(tiny, fmt) == "a normal value"  # the smallest normal is normal
    assert _kind_of(-tiny / 2, fmt) == "a subnormal (flushed to zero?)"
    assert _kind_of(math.nan, fmt) == "a NaN (its sign and payload must be copied too)"


SHARD_PROBES: list[torch.Tensor] = []


def _shards_moved(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Bug, at N = 4 and one element per shard: rank 0 holds chunk 0, rank 1 chunk 2, rank 2 chunk 1, and
    rank 3 a value of no chunk; the product of the workers' rows (small whole numbers: exact in every
    order)."""
    SHARD_PROBES.append(x.clone())
    total = x.prod(0)
    return torch.stack([total[0], total[2], total[1], torch.tensor(-5.0)])[:, None]


@pytest.mark.clause("difftest-collectives")
def test_wrong_shard_names_each_rank_holding_another_chunk_on_the_ops_shard_probe() -> None:
    c = Case(
        4,
        4,
        (),
        torch.float32,
        "contiguous",
        tuple(float(v % 3 + 1) for v in range(16)),
        "prod",
        collective=Collective.REDUCE_SCATTER,
    )
    SHARD_PROBES.clear()
    finding = wrong_shard(as_launcher(_shards_moved), call_target(_shards_moved, c))
    assert finding is not None and finding.codes == ["wrong-shard"] and finding.ranks == [1, 2]
    # prod's probe: worker 0 holds 2 * (e + 1) at element e, the others 1
    assert torch.equal(SHARD_PROBES[-1][0], torch.tensor([2.0, 4.0, 6.0, 8.0]))
    assert torch.equal(SHARD_PROBES[-1][1:], torch.ones(3, 4))
    assert finding.explanation == (
        "On the shard probe (worker 0 holds 2 * (e + 1) at element e, the rest 1: every element a different "
        "value, the same in every order) rank 1 holds chunk 2, rank 2 holds chunk 1: a reduce-scatter leaves "
        "chunk r at rank r (reduce_scatter_tensor, MPI_Reduce_scatter_block, NCCL; clause "
        "difftest-collectives)"
    )


def _modifies_and_moves_shards(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Bugs: the input modified, and rank r holding chunk r + 1."""
    out = planted_impls.reduce_scatter_next_chunk(x.clone())
    x.zero_()
    return out


@pytest.mark.clause("difftest-collectives", "difftest-diagnoses")
def test_no_shard_probe_runs_after_a_structural_finding() -> None:
    c = Case(
        2, 2, (), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0), collective=Collective.REDUCE_SCATTER
    )
    outcome = call_target(_modifies_and_moves_shards, c)
    assert wrong_shard(as_launcher(_modifies_and_moves_shards), outcome) is not None  # it would name one
    finding = diagnose(_modifies_and_moves_shards, outcome, "bound")
    assert finding is not None and finding.codes[0] == "input-modified" and "wrong-shard" not in finding.codes
