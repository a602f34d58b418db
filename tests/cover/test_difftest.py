"""The differential tester: planted bugs get the right code, correct implementations pass, oracles are sound.

The oracles are checked independently of ``ring_ref.difftest``: order-free inputs
against exact rational sums in every summation order, the bound against sums
computed in several orders, and the exact oracle against ``tests.oracles.ring_fold``.
"""

from __future__ import annotations

import json
import random
import shlex
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ring_ref import ring_all_reduce
from ring_ref._cli import main
from ring_ref.difftest import (
    CODES,
    DTYPES,
    LAYOUTS,
    ORDER_FREE_EXPONENTS,
    Case,
    Report,
    call_target,
    cases,
    check_values,
    diagnose,
    difftest,
    gamma,
    one_worker_cases,
    order_free_k_bound,
)
from ring_ref.testing import assert_matches_reference
from tests import planted_impls
from tests.oracles import exact_sum, ring_fold, same_bits
from tests.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
README = (ROOT / "README.md").read_text(encoding="utf-8")
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())

Impl = Callable[[torch.Tensor], torch.Tensor]


def run_all(fn: Impl, examples: int = 15, seed: int = 20260101) -> Report:
    return difftest(fn, examples=examples, seed=seed)


@pytest.mark.clause("difftest-oracles", "fold-order")
@pytest.mark.parametrize("name", sorted(planted_impls.CORRECT))
def test_correct_implementations_pass_every_mode(name: str) -> None:
    report = run_all(planted_impls.CORRECT[name], examples=40)
    assert report.verdict == "pass", report.render()
    assert set(report.modes) == {"exact", "order-free", "bound"}
    assert all(r.examples >= 40 for r in report.modes.values())
    assert report.diagnoses == []


@pytest.mark.clause("difftest-diagnoses", "sum-not-mean", "ag-copy-not-add", "input-unchanged")
@pytest.mark.clause("no-aliasing", "preserve-dtype-device", "output-shape", "n1-no-rounds")
@pytest.mark.parametrize("bug", list(planted_impls.EXPECTED), ids=lambda f: f.__name__)
def test_planted_bug_gets_its_code_in_every_mode(bug: Impl) -> None:
    report = run_all(bug)
    expected = planted_impls.EXPECTED[bug]
    assert report.verdict == "fail"
    for mode, result in report.modes.items():
        assert result.verdict == "fail", (mode, report.render())
        assert result.finding is not None and result.counterexample is not None
        assert set(result.finding.codes) == expected, (mode, result.finding.explanation)
    assert set(report.diagnoses) == expected
    rendered = report.render()
    assert "counterexample: N = " in rendered
    assert f"--seed {report.seed}" in rendered


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("bug", "words"),
    [
        (planted_impls.gather_adds, "worker(s) [0] counted more than once"),
        (planted_impls.drops_last_worker, "worker(s) [1] lost"),
        (planted_impls.mean_instead_of_sum, "divided by N = 2"),
    ],
    ids=lambda v: getattr(v, "__name__", "words"),
)
def test_value_bugs_shrink_to_two_workers_and_name_element_chunk_and_values(bug: Impl, words: str) -> None:
    result = difftest(bug, modes=("order-free",), examples=30, seed=5).modes["order-free"]
    assert result.counterexample is not None and result.finding is not None
    cex = result.counterexample
    assert (cex.n, cex.m, cex.trailing) == (2, 2, ())
    assert words in result.finding.explanation
    m = result.finding.mismatch
    assert m is not None
    # The named element really holds those values: recompute both independently.
    x = cex.tensor()
    want = float(exact_sum(x)[m.index[0]])
    got = float(bug(cex.tensor())[m.index])
    assert (m.expected, m.actual, m.chunk) == (want, got, m.index[0] // (cex.m // cex.n))
    assert want != got
    assert f"First differing element {m.index} (chunk {m.chunk})" in result.finding.explanation


@pytest.mark.clause("difftest-diagnoses", "fold-order")
def test_torch_sum_fails_only_exact_with_not_ring_order() -> None:
    report = run_all(planted_impls.torch_sum, examples=40)
    verdicts = {mode: r.verdict for mode, r in report.modes.items()}
    assert verdicts == {"exact": "fail", "order-free": "pass", "bound": "pass"}
    assert report.diagnoses == ["not-ring-order"]
    assert report.only_ring_order
    assert "passes order-free and bound" in report.summary()
    exact = report.modes["exact"]
    assert exact.counterexample is not None and exact.finding is not None
    x = exact.counterexample.tensor()
    assert not same_bits(torch.sum(x, 0), ring_fold(x))  # the counterexample really separates the orders


@pytest.mark.clause("difftest-diagnoses", "n1-no-rounds")
@pytest.mark.parametrize("bug", [planted_impls.raises_on_one_worker, planted_impls.returns_view_of_input])
def test_one_worker_is_always_tried(bug: Impl) -> None:
    report = difftest(bug, modes=("bound",), examples=1, seed=0, max_workers=16)
    result = report.modes["bound"]
    assert result.verdict == "fail" and result.counterexample is not None
    assert result.counterexample.n == 1


@pytest.mark.clause("difftest-oracles")
def test_one_worker_cases_cover_every_requested_dtype_contiguous_and_not() -> None:
    for mode in ("exact", "order-free", "bound"):
        got = one_worker_cases(mode, ALL_DTYPES)
        assert all(c.n == 1 for c in got)
        for dtype in ALL_DTYPES:
            contiguous = sorted(c.tensor().is_contiguous() for c in got if c.dtype == dtype)
            assert contiguous == [False, True], (mode, dtype)


@pytest.mark.clause("difftest-diagnoses", "n1-no-rounds")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_non_contiguous_input_is_tried_for_every_dtype_even_with_one_example(dtype: torch.dtype) -> None:
    report = difftest(
        planted_impls.rejects_non_contiguous, modes=("bound",), examples=1, seed=0, dtypes=[dtype]
    )
    result = report.modes["bound"]
    assert result.finding is not None and result.counterexample is not None, report.render()
    assert result.finding.codes == ["raised"] and "expected a contiguous tensor" in result.finding.explanation
    assert not result.counterexample.tensor().is_contiguous()


def _lose_second_worker(x: torch.Tensor) -> torch.Tensor:
    return x[0].clone() if x.shape[0] == 2 else ring_all_reduce(x)


def _count_first_worker_thrice(x: torch.Tensor) -> torch.Tensor:
    return 3 * x[0] if x.shape[0] == 2 else ring_all_reduce(x)


def _halve(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x) / x.shape[0]


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("bug", "code", "words"),
    [
        # Identical rows: x[0] is also exactly the mean; the one-hot probes show worker 1 lost.
        (_lose_second_worker, "out-of-bound", "worker(s) [1] lost"),
        (_halve, "mean-not-sum", "divided by N = 2"),
        # An element with one worker counted three times and the other lost is double-counted.
        (
            _count_first_worker_thrice,
            "double-counted",
            "worker(s) [0] counted more than once, worker(s) [1] lost",
        ),
    ],
    ids=["lost", "mean", "thrice-and-lost"],
)
def test_codes_on_inputs_where_a_lost_worker_looks_like_a_mean(bug: Impl, code: str, words: str) -> None:
    case = Case(2, 2, (), torch.float32, "contiguous", (3.0, 0.0, 3.0, 0.0))
    for mode in ("exact", "order-free", "bound"):
        finding = diagnose(bug, call_target(bug, case), mode)
        assert finding is not None and finding.codes == [code], (mode, finding)
        assert words in finding.explanation


@pytest.mark.clause("difftest-oracles")
@given(cases("bound", ALL_DTYPES, max_workers=6))
def test_generated_cases_are_valid_ring_inputs_in_their_layout(case: Case) -> None:
    x = case.tensor()
    assert tuple(x.shape) == case.shape and case.m % case.n == 0 and 0 <= len(case.trailing) <= 3
    assert x.dtype == case.dtype and case.layout in LAYOUTS
    assert bool(torch.isfinite(x).all())
    assert x.to(torch.float64).reshape(-1).tolist() == list(case.values)
    if case.layout in ("strided", "sliced"):
        # A view into a larger buffer (torch calls degenerate shapes such as (1, 2) contiguous anyway).
        assert x.untyped_storage().nbytes() > x.numel() * x.element_size()
    if case.layout == "transposed" and case.n > 1:
        assert not x.is_contiguous() and x.stride(0) < x.stride(1)


def _fold(terms: list[torch.Tensor]) -> torch.Tensor:
    acc = terms[0].clone()
    for t in terms[1:]:
        acc = acc + t
    return acc


def _tree(terms: list[torch.Tensor]) -> torch.Tensor:
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0].clone()


def _sums_in_several_orders(x: torch.Tensor, rnd: random.Random) -> list[torch.Tensor]:
    """The sum over axis 0 in the input dtype: shuffled fold, its reverse, pairwise tree, ring, torch.sum."""
    workers = [x[i] for i in range(x.shape[0])]
    rnd.shuffle(workers)
    return [_fold(workers), _fold(workers[::-1]), _tree(workers), ring_fold(x), torch.sum(x, 0)]


@pytest.mark.clause("difftest-oracles")
@given(cases("order-free", ALL_DTYPES), st.randoms(use_true_random=False))
def test_order_free_inputs_sum_exactly_in_every_order(case: Case, rnd: random.Random) -> None:
    x = case.tensor()
    exact = exact_sum(x)
    for total in _sums_in_several_orders(x, rnd):
        assert [Fraction(v) for v in total.to(torch.float64).reshape(-1).tolist()] == exact


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_order_free_extremes_sum_exactly_with_sixteen_workers(dtype: torch.dtype) -> None:
    # The largest |k| and the largest and smallest shared exponent, all one sign: every
    # prefix of the fold reaches |K| = 16 * floor(2**p / 16), the worst partial sum.
    k = order_free_k_bound(dtype, 16)
    for e in ORDER_FREE_EXPONENTS:
        x = torch.full((16, 16), float(k) * 2.0**e, dtype=torch.float64).to(dtype)
        assert torch.equal(x.to(torch.float64), torch.full((16, 16), float(k) * 2.0**e, dtype=torch.float64))
        for prefix in range(1, 17):
            assert float(_fold([x[i] for i in range(prefix)])[0]) == prefix * k * 2.0**e, (dtype, e, prefix)


@pytest.mark.clause("difftest-oracles")
@given(cases("bound", ALL_DTYPES), st.randoms(use_true_random=False))
def test_bound_accepts_every_summation_order(case: Case, rnd: random.Random) -> None:
    for total in _sums_in_several_orders(case.tensor(), rnd):
        mismatch, _ = check_values("bound", case, total)
        assert mismatch is None, mismatch


@pytest.mark.clause("difftest-oracles", "input-finite")
def test_bound_overflow_policy_is_tight_for_two_workers() -> None:
    # float16 overflows at 65520 = 65504 + ulp/2: 32768 + 32752 rounds to inf (a tie, to even),
    # 32768 + 32736 = 65504 is exact, so with one addition no order can give inf there.
    half = torch.tensor([32768.0], dtype=torch.float16)
    assert torch.isinf(half + 32752.0) and float(half + 32736.0) == 65504.0
    inf = torch.tensor([float("inf"), 0.0], dtype=torch.float16)
    tie = Case(2, 2, (), torch.float16, "contiguous", (32768.0, 0.0, 32752.0, 0.0))
    assert check_values("bound", tie, inf) == (None, 1)
    below = Case(2, 2, (), torch.float16, "contiguous", (32768.0, 0.0, 32736.0, 0.0))
    mismatch, skipped = check_values("bound", below, inf)
    assert mismatch is not None and skipped == 0
    # Three workers: the last addition's operands carry at most one rounding, so the
    # acceptance threshold is the overflow limit / (1 + gamma_1), just below 65520.
    three = Case(3, 3, (), torch.float16, "contiguous", (32768.0, 0, 0, 32736.0, 0, 0, 8.0, 0, 0))
    assert check_values("bound", three, torch.tensor([float("inf"), 0, 0], dtype=torch.float16)) == (None, 1)
    one = Case(1, 1, (), torch.float16, "contiguous", (65504.0,))
    assert check_values("bound", one, torch.tensor([float("inf")], dtype=torch.float16))[0] is not None


@pytest.mark.clause("difftest-oracles", "input-finite")
def test_bound_overflow_policy() -> None:
    big = Case(2, 2, (), torch.float16, "contiguous", (65504.0, 1.0, 65504.0, 1.0))
    inf_ok = torch.tensor([float("inf"), 2.0], dtype=torch.float16)
    mismatch, skipped = check_values("bound", big, inf_ok)
    assert (mismatch, skipped) == (None, 1)
    small = Case(2, 2, (), torch.float16, "contiguous", (1.0, 1.0, 1.0, 1.0))
    mismatch, skipped = check_values("bound", small, torch.tensor([float("inf"), 2.0], dtype=torch.float16))
    assert mismatch is not None and skipped == 0 and mismatch.index == (0,)
    assert "no summation order can overflow" in mismatch.detail


@pytest.mark.clause("difftest-oracles")
def test_bound_is_tight_to_gamma() -> None:
    # N = 2 in float16, exact sum 1 + 2**-11 (a tie): the bound is gamma_1 * (1 + 2**-11),
    # a hair above 2**-11.  Both neighbours of the tie (1 and 1 + 2**-10) are in bound;
    # the next float below, 1 - 2**-11, is 2 * 2**-11 away and out of bound.
    case = Case(2, 2, (), torch.float16, "contiguous", (1.0, 0.0, 2.0**-11, 0.0))
    bound = gamma(1, torch.float16) * (1 + Fraction(1, 2**11))
    assert Fraction(1, 2**11) < bound < Fraction(2, 2**11)
    for ok in (1.0, 1.0 + 2.0**-10):
        assert check_values("bound", case, torch.tensor([ok, 0.0], dtype=torch.float16))[0] is None
    off = check_values("bound", case, torch.tensor([1.0 - 2.0**-11, 0.0], dtype=torch.float16))[0]
    assert off is not None and off.index == (0,)


@pytest.mark.clause("difftest-oracles", "fold-order")
@given(cases("exact", ALL_DTYPES, max_workers=8))
def test_exact_oracle_agrees_with_the_independent_ring_fold(case: Case) -> None:
    assert check_values("exact", case, ring_fold(case.tensor()))[0] is None


@pytest.mark.clause("difftest-report")
def test_printed_replay_command_reproduces_the_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    report = difftest(planted_impls.gather_adds, modes=("order-free",), examples=10, seed=123)
    assert report.modes["order-free"].counterexample is not None
    assert report.replay.startswith("ring-ref difftest tests.planted_impls:gather_adds --mode order-free")
    assert main([*shlex.split(report.replay)[1:], "--json"]) == 1
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["modes"] == report.to_json()["modes"]
    # A function the CLI cannot import again gets a Python replay line instead.
    lam = difftest(lambda x: x.sum(0), modes=("order-free",), examples=1, seed=5)
    assert lam.replay.startswith("ring_ref.difftest.difftest(") and "<lambda>" in lam.replay
    assert "modes=('order-free',), examples=1, seed=5, max_workers=16, dtypes=[torch.float16, " in lam.replay


@pytest.mark.clause("difftest-report")
def test_json_report_follows_the_schema(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["difftest", f"{BUGGY_EXAMPLE}:ring_all_reduce", "--examples", "15", "--seed", "3", "--json"]
    )
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert status == 1 and doc["verdict"] == "fail" and doc["diagnoses"] == ["double-counted"]
    for mode in ("exact", "order-free", "bound"):
        part = doc["modes"][mode]
        assert part["verdict"] == "fail" and part["examples"] >= 1
        cex = part["counterexample"]
        assert cex["seed"] == 3 and cex["shape"][:2] == [cex["n"], cex["m"]]
        assert part["diagnoses"] == ["double-counted"]
    assert "--seed 3" in doc["replay"]
    passing = Report(
        "t", 1, "r", {"bound": difftest(ring_all_reduce, modes=("bound",), examples=3).modes["bound"]}
    )
    jsonschema.validate(passing.to_json(), SCHEMA)
    broken = {**doc, "modes": {"exact": {**doc["modes"]["exact"], "diagnoses": ["wrong-answer"]}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCHEMA)


@pytest.mark.clause("difftest-report")
def test_cli_exit_status_pass_and_fail(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["difftest", "ring_ref:ring_all_reduce", "--examples", "5", "--seed", "1", "--max-workers", "4"])
        == 0
    )
    assert "PASS" in capsys.readouterr().out
    args = ["difftest", "tests.planted_impls:torch_sum", "--mode", "exact", "--examples", "20", "--seed", "1"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "not-ring-order" in out and "Replay: ring-ref difftest" in out
    order_free = ["difftest", "tests.planted_impls:torch_sum", "--mode", "order-free", "--examples", "10"]
    assert main([*order_free, "--dtypes", "float16,bfloat16"]) == 0
    capsys.readouterr()


@pytest.mark.clause("difftest-report")
@pytest.mark.parametrize(
    ("source", "target", "reason"),
    [
        (None, "no_colon", "must be package.module:function"),
        (None, "no_such_module_xyz:f", "importing 'no_such_module_xyz' failed: ModuleNotFoundError"),
        (None, "missing.py:f", "does not exist"),
        ("def f(x):\n    return x\n", "{path}:g", "has no attribute 'g'"),
        ("f = 3\n", "{path}:f", "is a int, not a function"),
        ("import not_a_real_package_xyz\n", "{path}:f", "ModuleNotFoundError"),
        ("def f(:\n", "{path}:f", "SyntaxError"),
        ("import sys\nsys.exit(3)\n", "{path}:f", "SystemExit: 3"),
    ],
)
def test_cli_usage_errors_exit_2_with_the_reason(
    source: str | None, target: str, reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "user_impl.py"
    if source is not None:
        path.write_text(source, encoding="utf-8")
    assert main(["difftest", target.format(path=path)]) == 2
    captured = capsys.readouterr()
    assert reason in captured.err and captured.out == ""


@pytest.mark.clause("difftest-report")
@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (["--dtypes", "float8"], "unknown dtype(s) ['float8']"),
        (["--examples", "0"], "--examples) must be at least 1"),
        (["--max-workers", "0"], "--max-workers) must be between 1 and 64"),
        (["--seed", "-1"], "--seed) must be a non-negative integer"),
    ],
    ids=str,
)
def test_cli_bad_options_exit_2(extra: list[str], reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["difftest", "ring_ref:ring_all_reduce", *extra]) == 2
    captured = capsys.readouterr()
    assert "ring-ref difftest: error:" in captured.err and reason in captured.err and captured.out == ""


@pytest.mark.clause("difftest-report")
def test_json_stdout_stays_one_object_when_the_target_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "chatty.py"
    path.write_text(
        "import torch\nprint('loading chatty')\n\n"
        "def f(x):\n    print('called')\n    return torch.sum(x, 0)\n",
        encoding="utf-8",
    )
    args = ["difftest", f"{path}:f", "--mode", "order-free", "--examples", "3", "--seed", "1", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    jsonschema.validate(json.loads(captured.out), SCHEMA)
    assert "loading chatty" in captured.err and "called" in captured.err


@pytest.mark.clause("difftest-diagnoses")
def test_assert_matches_reference_message_carries_diagnosis_and_counterexample() -> None:
    with pytest.raises(AssertionError) as info:
        assert_matches_reference(planted_impls.gather_adds, mode="order-free", examples=20, seed=9)
    message = str(info.value)
    assert "double-counted" in message and "counterexample: N = 2" in message and "input = " in message
    assert "--seed 9" in message
    assert assert_matches_reference(planted_impls.in_place_ring, mode="exact", examples=10).verdict == "pass"
    with pytest.raises(ValueError, match="mode must be one of"):
        assert_matches_reference(ring_all_reduce, mode="bitwise")


@pytest.mark.clause("difftest-diagnoses")
def test_readme_documents_every_code_and_the_schema() -> None:
    section = README[README.index("## Differential testing") :]
    for code in CODES:
        assert f"`{code}`" in section, code
    assert "spec/difftest_report.schema.json" in section
    # The schema's vocabularies are the module's.
    assert SCHEMA["$defs"]["code"]["enum"] == list(CODES)
    assert SCHEMA["$defs"]["counterexample"]["properties"]["dtype"]["enum"] == list(DTYPES)
    assert SCHEMA["$defs"]["counterexample"]["properties"]["layout"]["enum"] == list(LAYOUTS)


@pytest.mark.clause("difftest-oracles")
def test_gloo_all_reduce_passes_order_free_and_bound() -> None:
    from ring_ref import targets

    try:
        report = difftest(targets.gloo_all_reduce, examples=6, seed=11, max_workers=3)
    finally:
        targets.close()
    verdicts = {mode: r.verdict for mode, r in report.modes.items()}
    assert verdicts["order-free"] == "pass" and verdicts["bound"] == "pass", report.render()
    # What exact says about gloo (README): a valid different order, not the ring's fold.
    assert verdicts["exact"] == "fail" and report.diagnoses == ["not-ring-order"], report.render()


@pytest.mark.soak
@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("name", sorted(planted_impls.CORRECT))
def test_soak_correct_implementations_pass_many_examples(name: str) -> None:
    report = difftest(planted_impls.CORRECT[name], examples=1000, seed=7)
    assert report.verdict == "pass", report.render()


@pytest.mark.soak
@pytest.mark.clause("difftest-oracles")
def test_soak_gloo_all_reduce_up_to_six_processes() -> None:
    from ring_ref import targets

    try:
        report = difftest(targets.gloo_all_reduce, modes=("order-free", "bound"), examples=100, max_workers=6)
    finally:
        targets.close()
    assert report.verdict == "pass", report.render()
    assert all(r.examples >= 100 for r in report.modes.values())
