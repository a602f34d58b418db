"""``ring-ref difftest`` checking ``exact`` against other orders: ``--schedule NAME`` and ``auto``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from ring_ref import RingSchedule, ring_all_reduce
from ring_ref._cli import main
from ring_ref.difftest import difftest
from ring_ref.difftest._oracles import EXACT_ORDER, SPEC_ORDER
from ring_ref.difftest._orders import (
    OrderError,
    checking_against,
    command_line_order,
    mark_replay,
    parse_schedule,
    schedule_order,
)
from tests.oracles import gloo_bounds, same_bits, schedule_fold

TARGETS = textwrap.dedent(
    '''
    import torch

    def gloo_order(x):
        """gloo's ring, written out: chunk c (gloo's segments) folds workers c-1, c-2, ..., c."""
        n = x.shape[0]
        flat = x.reshape(n, -1)
        total = flat.shape[1]
        segments = max(-(-total * x.element_size() // 2**20), 2 * n)
        segments = -(-segments // n) * n
        size = segments // n * -(-total // segments)
        out = torch.empty_like(flat[0])
        for c in range(n):
            lo, hi = min(c * size, total), min((c + 1) * size, total)
            acc = flat[(c - 1) % n, lo:hi].clone()
            for k in range(2, n + 1):
                acc = acc + flat[(c - k) % n, lo:hi]
            out[lo:hi] = acc
        return out.reshape(x.shape[1:])

    def pairwise(x):
        terms = [x[i] for i in range(x.shape[0])]
        while len(terms) > 1:
            pairs = range(0, len(terms), 2)
            terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in pairs]
        return terms[0].clone()
    '''
)


@pytest.fixture
def targets(tmp_path: Path) -> Path:
    path = tmp_path / "orders_targets.py"
    path.write_text(TARGETS, encoding="utf-8")
    return path


def _gloo_written_out(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    return schedule_fold(x, -1, -1, gloo_bounds(n, x[0].numel(), x.element_size()))


@pytest.mark.clause("difftest-exact-orders")
def test_exact_against_a_schedule_passes_its_ring_and_fails_others() -> None:
    with checking_against(schedule_order("gloo")):
        assert EXACT_ORDER.get().name == "the gloo schedule's order"
        passed = difftest(_gloo_written_out, modes=("exact",), examples=15, seed=3, max_workers=5)
        failed = difftest(
            ring_all_reduce, modes=("exact",), examples=15, seed=3, max_workers=5, isolate=False
        )
    assert EXACT_ORDER.get() is SPEC_ORDER
    assert passed.verdict == "pass", passed.render()
    assert failed.verdict == "fail" and failed.diagnoses == ["not-ring-order"], failed.render()
    mismatch = failed.modes["exact"].finding
    assert mismatch is not None and "not bitwise equal to the gloo schedule's order" in mismatch.explanation
    # and against the spec's ring, the other way round
    assert difftest(_gloo_written_out, modes=("exact",), examples=15, seed=3, max_workers=5).verdict == "fail"


@pytest.mark.clause("difftest-exact-orders")
def test_schedule_options_name_rings() -> None:
    assert parse_schedule("gloo") == "gloo"
    assert parse_schedule("-1,2,blocks") == RingSchedule(-1, 2, "blocks")
    assert schedule_order(RingSchedule(1, 0, "blocks")).option == "--schedule openmpi-ring"
    assert schedule_order(RingSchedule(-1, 2, "blocks")).option == "--schedule -1,2,blocks"
    with pytest.raises(OrderError, match="unknown schedule 'ring'"):
        schedule_order("ring")
    with pytest.raises(OrderError, match="two integers"):
        parse_schedule("a,b,gloo")
    with pytest.raises(OrderError, match="unknown schedule layout 'rows'"):
        command_line_order("1,0,rows", None, "ring_ref:ring_all_reduce", 4)
    assert mark_replay("ring-ref difftest T", schedule_order("gloo")) == "ring-ref difftest T --schedule gloo"
    assert command_line_order(None, None, "ring_ref:ring_all_reduce", 4) == (None, "")


@pytest.mark.clause("difftest-exact-orders")
def test_the_fitted_order_checks_the_written_out_gloo_ring_on_every_dtype_and_size() -> None:
    gen = torch.Generator().manual_seed(5)
    order = schedule_order("gloo")
    for n, m in ((2, 3), (3, 7), (5, 5), (8, 17)):
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            x = (torch.randn(n, m, 2, generator=gen, dtype=torch.float64) * 100).to(dtype)
            from ring_ref.difftest import Case

            case = Case(n, m, (2,), dtype, "contiguous", tuple(x.to(torch.float64).reshape(-1).tolist()))
            assert same_bits(order.expected(case), _gloo_written_out(case.tensor()))


@pytest.mark.clause("difftest-exact-orders")
def test_command_line_schedule_and_auto(targets: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--mode", "exact", "--examples", "40", "--seed", "3", "--max-workers", "5", "--in-process"]
    assert main(["difftest", f"{targets}:gloo_order", *common, "--schedule", "gloo", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "pass" and doc["replay"].endswith("--schedule gloo")
    assert main(["difftest", f"{targets}:gloo_order", *common]) == 1
    assert "not-ring-order" in capsys.readouterr().out
    assert main(["difftest", f"{targets}:gloo_order", *common, "--schedule", "auto"]) == 0
    captured = capsys.readouterr()
    assert "exact checks the gloo schedule's order" in captured.err and "exact: PASS" in captured.out
    assert main(["difftest", f"{targets}:pairwise", *common, "--schedule", "auto"]) == 1
    err = capsys.readouterr().err
    assert "not one ring's fold" in err and "((0+1)+(2+3))" in err
    assert main(["difftest", f"{targets}:gloo_order", *common, "--schedule", "ring"]) == 2
    assert "unknown schedule 'ring'" in capsys.readouterr().err


@pytest.mark.clause("difftest-exact-orders", "difftest-diagnoses")
def test_not_ring_order_names_the_revealed_order_of_the_element() -> None:
    report = difftest(_gloo_written_out, modes=("exact",), examples=15, seed=3, max_workers=5)
    result = report.modes["exact"]
    finding, case = result.finding, result.counterexample
    assert finding is not None and case is not None and finding.mismatch is not None
    assert finding.codes == ["not-ring-order"]
    # The element's chunk under gloo's layout of float32 probes (float64 for a float64 case), by hand:
    # gloo folds chunk c as c-1, c-2, ..., c; the first two commute, printed so that the chain reads in
    # one ring direction: gloo's own at N >= 4, the +1 one at N = 3 (both read), the smaller first at N = 2.
    per_worker = len(case.values) // case.n
    flat = 0
    for size, i in zip((case.m, *case.trailing), finding.mismatch.index, strict=True):
        flat = flat * size + i
    itemsize = 8 if case.dtype == torch.float64 else 4
    chunk = next(c for c, (lo, hi) in enumerate(gloo_bounds(case.n, per_worker, itemsize)) if lo <= flat < hi)
    order = [(chunk - 1 - j) % case.n for j in range(case.n)]
    shown = order if case.n >= 4 else [order[1], order[0], *order[2:]] if case.n == 3 else sorted(order)
    printed = ",".join(map(str, shown))
    assert f"the target sums that element as fold {printed}" in finding.explanation, finding.explanation
    spec_fold = [(finding.mismatch.chunk + j) % case.n for j in range(case.n)]
    spec_order = ",".join(map(str, spec_fold if case.n > 2 else sorted(spec_fold)))
    assert f"where the spec's ring folds {spec_order}" in finding.explanation


@pytest.mark.clause("difftest-exact-orders")
def test_order_file_records_an_order_and_catches_a_changed_one(
    targets: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "gloo_order.json"
    assert main(["reveal", f"{targets}:gloo_order", "-n", "4", "-m", "9", "--json"]) == 0
    saved.write_text(capsys.readouterr().out, encoding="utf-8")
    common = ["--mode", "exact", "--examples", "25", "--seed", "4", "--in-process", "--order", str(saved)]
    assert main(["difftest", f"{targets}:gloo_order", *common, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "pass" and doc["replay"].endswith(f"--order {saved}")
    # A changed order (the spec's ring on OpenMPI's blocks) is caught, on inputs of the file's N, M and dtype.
    openmpi = textwrap.dedent(
        """
        from ring_ref import ring_all_reduce

        def upgraded(x):
            return ring_all_reduce(x, schedule="openmpi-ring")
        """
    )
    (tmp_path / "upgraded.py").write_text(openmpi, encoding="utf-8")
    assert main(["difftest", f"{tmp_path / 'upgraded.py'}:upgraded", *common, "--json"]) == 1
    failed = json.loads(capsys.readouterr().out)["modes"]["exact"]
    assert failed["diagnoses"] == ["not-ring-order"]
    assert f"not bitwise equal to the order saved in {saved} (N = 4, M = 9, float32)" in failed["explanation"]
    cex = failed["counterexample"]
    assert (cex["n"], cex["m"], cex["dtype"], cex["shape"]) == (4, 9, "float32", [4, 9])


@pytest.mark.clause("difftest-exact-orders")
def test_order_files_that_cannot_serve_are_refused(
    targets: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    base = {"format": "ring-ref-reveal", "version": 1, "n": 3, "m": 2, "dtype": "float32"}
    cases: list[tuple[object, str]] = [
        ({**base, "trees": [[[0, 1], 2], None]}, "have no tree"),
        ({**base, "trees": [[[0, 1], 1], [[0, 1], 2]]}, "exactly once"),
        ({**base, "trees": [[[0, 1], 2]]}, "one tree per element"),
        ({**base, "format": "ring-ref-trace", "trees": []}, "is not a `ring-ref reveal --json` file"),
        ("not json", "cannot read the order file"),
    ]
    for doc, words in cases:
        bad.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
        assert main(["difftest", f"{targets}:gloo_order", "--mode", "exact", "--order", str(bad)]) == 2
        assert words in capsys.readouterr().err, words
    with pytest.raises(SystemExit):
        main(["difftest", f"{targets}:gloo_order", "--order", str(bad), "--schedule", "gloo"])
