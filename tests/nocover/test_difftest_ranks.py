"""Per-rank targets on real gloo groups: every rank checked, deadlocks and dead ranks named."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref._cli import main
from ring_ref.difftest import Mode, Report, difftest
from ring_ref.difftest._options import Options
from ring_ref.difftest._orders import schedule_order
from ring_ref.difftest._search import run_difftest
from ring_ref.testing import assert_matches_reference
from tests import planted_rank_impls
from tests.paths import ROOT
from tests.planted_rank_impls import RankImpl

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))


@pytest.mark.clause("difftest-ranks", "difftest-oracles")
def test_torch_distributed_all_reduce_passes_order_free_and_bound() -> None:
    report = difftest(
        "torch.distributed:all_reduce", ranks="gloo", modes=("order-free", "bound"), examples=8, seed=4
    )
    assert report.verdict == "pass" and report.ranks == "gloo" and report.isolated, report.render()
    assert all(r.examples >= 8 for r in report.modes.values())


@pytest.mark.clause("difftest-ranks", "fold-order")
@pytest.mark.parametrize(
    "target", ["ring_ref.distributed:ring_all_reduce_", "tests.planted_rank_impls:returns_a_new_tensor"]
)
def test_ring_all_reduce_underscore_passes_every_mode(target: str) -> None:
    report = assert_matches_reference(target, ranks="gloo", examples=10, seed=2, max_workers=4)
    assert set(report.modes) == {"exact", "order-free", "bound"}


@pytest.mark.clause("difftest-ranks", "difftest-diagnoses")
@pytest.mark.parametrize("bug", list(planted_rank_impls.EXPECTED), ids=lambda f: f.__name__)
def test_planted_per_rank_bug_gets_its_code(bug: RankImpl) -> None:
    code = planted_rank_impls.EXPECTED[bug]
    report = difftest(
        bug, ranks="gloo", modes=("order-free", "bound"), examples=20, seed=1, max_workers=3, timeout=2
    )
    assert report.diagnoses == [code], report.render()
    for mode, result in report.modes.items():
        finding, cex = result.finding, result.counterexample
        assert finding is not None and cex is not None and finding.codes == [code], (mode, report.render())
        assert cex.layout == "contiguous"
        if code == "timed-out":
            # Both neighbours block in recv: every rank is named, with its stack there.
            assert finding.ranks == list(range(cex.n)) and cex.n >= 2
            assert f"rank(s) {finding.ranks} of {cex.n} were still inside the call" in finding.explanation
            for rank in finding.ranks:
                assert f"rank {rank}:\n" in finding.stack
            assert finding.stack.count("in receives_first") == cex.n
        if code == "crashed":
            assert (
                finding.ranks == [1]
                and "rank 1: the worker process exited with status 3" in finding.explanation
            )
        if bug is planted_rank_impls.constant_on_last_rank:
            last = cex.n - 1
            assert finding.ranks == [last] and f"rank {last} has " in finding.explanation
            m = finding.mismatch
            assert m is not None and m.actual == m.expected + 1  # the constant the last rank adds
        if code == "double-counted":
            assert "counted more than once" in finding.explanation
        if code == "out-of-bound":  # the stacked twin's words, from the failing rank's one-hot probes
            assert "Contributions missing: with only worker j holding ones" in finding.explanation
            assert re.search(r"so worker\(s\) \[\d\] lost", finding.explanation), finding.explanation
        if bug is planted_rank_impls.gather_drops_last_chunk_on_rank_0:  # each failing rank's counts
            assert finding.ranks == [0] and "per failing rank: rank 0: element" in finding.explanation
            assert re.search(r"\(worker\(s\) \[\d\] lost\)$", finding.explanation), finding.explanation
        if code == "input-modified":
            assert "the input was modified" in finding.explanation


@pytest.mark.clause("difftest-ranks", "difftest-report")
def test_cli_ranks_gloo_json_names_the_ranks(capfd: pytest.CaptureFixture[str]) -> None:
    args = ["difftest", "--ranks", "gloo", "tests.planted_rank_impls:constant_on_last_rank"]
    args += ["--mode", "order-free", "--examples", "10", "--seed", "3", "--max-workers", "3", "--json"]
    assert main(args) == 1
    doc = json.loads(capfd.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["ranks"] == "gloo" and doc["diagnoses"] == ["ranks-disagree"]
    cex = doc["modes"]["order-free"]["counterexample"]
    assert cex["ranks"] == [cex["n"] - 1] and cex["element"]["rank"] == cex["n"] - 1
    assert doc["replay"].startswith(
        "ring-ref difftest --ranks gloo tests.planted_rank_impls:constant_on_last_rank"
    )
    passing = ["difftest", "--ranks", "gloo", "torch.distributed:all_reduce", "--mode", "bound"]
    assert main([*passing, "--examples", "3", "--max-workers", "2"]) == 0
    assert "PASS" in capfd.readouterr().out


def test_a_lambda_cannot_be_a_per_rank_target() -> None:
    with pytest.raises(ValueError, match="must be a module-level function or a TARGET string"):
        difftest(lambda t: None, ranks="gloo")
    with pytest.raises(ValueError, match="ranks must be one of"):
        difftest("torch.distributed:all_reduce", ranks="nccl")  # type: ignore[arg-type]
    assert torch.distributed.is_available()


@pytest.mark.clause("difftest-ranks")
def test_the_buggy_per_rank_example_is_diagnosed_and_its_fix_passes(tmp_path: Path) -> None:
    example = ROOT / "examples" / "buggy_rank_allreduce.py"
    report = difftest(f"{example}:ring_all_reduce", ranks="gloo", examples=10, seed=7, max_workers=3)
    assert report.diagnoses == ["ranks-disagree"], report.render()
    source = example.read_text(encoding="utf-8")
    bug = "    if rank == 0:  # BUG: every rank should copy the result back\n        tensor.copy_(work)"
    assert bug in source
    fixed = tmp_path / "fixed_rank_allreduce.py"
    fixed.write_text(source.replace(bug, "    tensor.copy_(work)"), encoding="utf-8")
    again = difftest(f"{fixed}:ring_all_reduce", ranks="gloo", examples=10, seed=7, max_workers=3)
    assert again.verdict == "pass", again.render()


@pytest.mark.soak
@pytest.mark.clause("difftest-ranks")
@pytest.mark.parametrize("target", ["ring_ref.distributed:ring_all_reduce_", "torch.distributed:all_reduce"])
def test_soak_per_rank_targets_up_to_eight_ranks(target: str) -> None:
    modes: tuple[Mode, ...] = (
        ("exact", "order-free", "bound") if "ring_ref" in target else ("order-free", "bound")
    )
    report = difftest(target, ranks="gloo", modes=modes, examples=150, max_workers=8)
    assert report.verdict == "pass", report.render()


@pytest.mark.clause("difftest-ranks", "difftest-exact-orders")
def test_a_per_rank_ring_that_drops_the_remainder_fails_under_openmpi_ring_blocks() -> None:
    """Issue #29 item 2, per rank: under ``--schedule openmpi-ring`` the ranks get M not divisible by N."""
    blocks, options = schedule_order("openmpi-ring"), Options(ranks="gloo", examples=2, seed=3, max_workers=4)
    dropped = run_difftest(planted_rank_impls.openmpi_ring_dropping_the_remainder, options, blocks)
    correct = run_difftest(planted_rank_impls.openmpi_ring, dataclasses.replace(options, examples=4), blocks)
    for mode, result in dropped.modes.items():
        case = result.counterexample
        assert result.verdict == "fail" and case is not None and case.m % case.n, (mode, dropped.render())
    assert correct.verdict == "pass", correct.render()


@pytest.mark.clause("difftest-ranks", "difftest-diagnoses")
def test_a_stacked_target_under_ranks_gloo_is_told_to_drop_ranks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue #29 item 8, on a real group: difftest's raised explanation and reveal's error both say it."""
    (tmp_path / "stacked.py").write_text("def total(x):\n    return x.sum(1).sum(0)\n", encoding="utf-8")
    target = f"{tmp_path / 'stacked.py'}:total"
    options = ["--mode", "bound", "--examples", "2", "--seed", "1", "--max-workers", "2"]
    assert main(["difftest", "--ranks", "gloo", target, *options]) == 1
    out = capsys.readouterr().out
    assert "raised IndexError: Dimension out of range" in out and "drop --ranks (ranks=None)" in out
    assert main(["reveal", "--ranks", "gloo", target, "-n", "2", "-m", "2"]) == 2
    err = capsys.readouterr().err
    assert "rank 1 raised IndexError: Dimension out of range" in err and "drop --ranks" in err


def _every_mode_fails_at_three(report: Report) -> None:
    for mode, result in report.modes.items():
        case = result.counterexample
        assert result.verdict == "fail" and case is not None and case.n == 3, (mode, report.render())


@pytest.mark.clause("difftest-every-n", "difftest-ranks")
def test_a_per_rank_bug_at_one_odd_n_fails_every_mode() -> None:
    """Issue #40 item 1: a ring whose reduce-scatter takes the wrong chunk at ``N = 3`` alone (zeros
    pass) fails every mode under ``--ranks gloo`` at ``--examples 20`` (the 20 seeds: the soak test)."""
    bug = "tests.planted_rank_impls:wrong_chunk_at_three"
    # seed 4: before every N got its probes, bound passed this bug at it
    _every_mode_fails_at_three(difftest(bug, ranks="gloo", examples=20, seed=4, max_workers=4))


@pytest.mark.soak
@pytest.mark.clause("difftest-every-n", "difftest-ranks")
@pytest.mark.parametrize("seed", range(20))
def test_soak_a_per_rank_bug_at_one_odd_n_fails_every_mode_at_every_seed(seed: int) -> None:
    bug = "tests.planted_rank_impls:wrong_chunk_at_three"
    _every_mode_fails_at_three(difftest(bug, ranks="gloo", examples=20, seed=seed))
