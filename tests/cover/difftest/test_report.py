"""The report and the command line: replay lines, the JSON schema, exit statuses and usage errors."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._cli import main
from ring_ref.difftest import DTYPES, Case, Report, difftest
from ring_ref.difftest._diagnosis import Finding
from ring_ref.difftest._oracles import SPEC_ORDER, SavedOrder, ValueMismatch
from ring_ref.difftest._report import ModeResult
from ring_ref.difftest._vocabulary import Op
from tests.common import planted_impls
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())


@pytest.mark.clause("difftest-report")
def test_printed_replay_command_reproduces_the_counterexample(capsys: pytest.CaptureFixture[str]) -> None:
    report = difftest(planted_impls.gather_adds, modes=("order-free",), examples=10, seed=123)
    assert report.modes["order-free"].counterexample is not None
    assert report.replay.startswith(
        "ring-ref difftest tests.common.planted_impls:gather_adds --mode order-free"
    )
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
    args = [
        "difftest",
        "tests.common.planted_impls:torch_sum",
        "--mode",
        "exact",
        "--examples",
        "20",
        "--seed",
        "1",
    ]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "not-ring-order" in out and "Replay: ring-ref difftest" in out
    order_free = [
        "difftest",
        "tests.common.planted_impls:torch_sum",
        "--mode",
        "order-free",
        "--examples",
        "10",
    ]
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
        ("f = 3\n", "{path}:f", "is not a function but an object of type int"),
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


@pytest.mark.clause("difftest-report", "difftest-isolation")
def test_json_stdout_stays_one_object_when_the_target_prints(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "chatty.py"
    path.write_text(
        "import os\nimport torch\nprint('loading chatty')\n\n"
        "def f(x):\n    print('called')\n    os.write(1, b'{ raw bytes on fd 1\\n')\n"
        "    os.write(2, b'raw bytes on fd 2\\n')\n    return torch.sum(x, 0)\n",
        encoding="utf-8",
    )
    args = ["difftest", f"{path}:f", "--mode", "order-free", "--examples", "3", "--seed", "1", "--json"]
    assert main(args) == 0
    captured = capfd.readouterr()  # file-descriptor level: nothing of the target's reaches fd 1 or 2
    doc = json.loads(captured.out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["isolated"] is True and captured.err == ""
    text = doc["output"]["text"]
    assert text.startswith("loading chatty\n")
    assert "called\n" in text and "{ raw bytes on fd 1\n" in text and "raw bytes on fd 2\n" in text
    calls = doc["modes"]["order-free"]["examples"]
    assert doc["output"]["bytes"] == len("loading chatty\n") + calls * len(
        "called\n{ raw bytes on fd 1\nraw bytes on fd 2\n"
    )
    assert main([*args[:-1]]) == 0
    assert "The target wrote" in capfd.readouterr().out


# ==========================================================================================================
# The report built by hand (``ring_ref.difftest._report``): its JSON, its verdicts and its text.
#
# Fast (no target is run: the modes' results are written here), so that
# ``make mutation`` can run it for each mutant of the report.  Every expected
# JSON object and line of text is written out here from the report's format
# (``docs/guide/difftest.md``, clause ``difftest-report``).
# ==========================================================================================================


CASE = Case(2, 2, (1,), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0))
CASE_JSON = {
    "n": 2,
    "m": 2,
    "shape": [2, 2, 1],
    "dtype": "float32",
    "layout": "contiguous",
    "op": "sum",
    "input": [[[1.0], [2.0]], [[3.0], [4.0]]],
}


def mismatch(expected: float = 6.0, actual: float = math.inf) -> ValueMismatch:
    return ValueMismatch((1, 0), 1, expected, actual, "off", 1)


def failed(
    codes: list[str], *, ranks: list[int] | None = None, stack: str = "", output: str = "", **kw: Any
) -> ModeResult:
    finding = Finding(codes, "what went wrong", mismatch(), stack, ranks or [])
    return ModeResult("exact", "fail", 4, finding=finding, counterexample=CASE, output=output, **kw)


def passed(mode: str = "bound", examples: int = 7) -> ModeResult:
    return ModeResult(mode, "pass", examples)  # type: ignore[arg-type]


# --- ModeResult.to_json --------------------------------------------------------------------------------


@pytest.mark.clause("difftest-report")
def test_a_passing_mode_reports_its_counts_only() -> None:
    result = ModeResult("bound", "pass", 5, overflow_skipped=2, underflow_skipped=3)
    assert result.to_json(1) == {
        "verdict": "pass",
        "examples": 5,
        "overflow_skipped": 2,
        "underflow_skipped": 3,
    }


@pytest.mark.clause("difftest-report")
def test_a_finding_is_reported_only_with_its_counterexample() -> None:
    finding = Finding(["raised"], "it raised")
    for result in (
        ModeResult("exact", "fail", 1, finding=finding),
        ModeResult("exact", "fail", 1, counterexample=CASE),
    ):
        assert set(result.to_json(1)) == {"verdict", "examples", "overflow_skipped", "underflow_skipped"}


@pytest.mark.clause("difftest-report")
def test_a_failing_mode_reports_the_element_ranks_stack_and_output() -> None:
    result = failed(["double-counted"], ranks=[2, 0], stack="trace\n", output="printed")
    assert result.to_json(9) == {
        "verdict": "fail",
        "examples": 4,
        "overflow_skipped": 0,
        "underflow_skipped": 0,
        "diagnoses": ["double-counted"],
        "explanation": "what went wrong",
        "counterexample": {
            **CASE_JSON,
            "seed": 9,
            "element": {"index": [1, 0], "chunk": 1, "expected": 6.0, "actual": "inf", "rank": 2},
            "ranks": [2, 0],
            "stack": "trace\n",
            "output": "printed",
        },
    }


@pytest.mark.clause("difftest-report")
def test_non_finite_values_are_written_as_strings_finite_ones_as_numbers() -> None:
    for expected, actual, want in [
        (math.nan, -math.inf, ("nan", "-inf")),
        (-0.5, math.nan, (-0.5, "nan")),
        (math.inf, 1e300, ("inf", 1e300)),
    ]:
        result = ModeResult("exact", "fail", 1, finding=Finding(["x"], "e", mismatch(expected, actual)))
        result.counterexample = CASE
        element = result.to_json(0)["counterexample"]["element"]
        assert (element["expected"], element["actual"]) == want


@pytest.mark.clause("difftest-report")
def test_without_ranks_stack_or_output_those_keys_are_absent() -> None:
    cex = failed(["raised"]).to_json(3)["counterexample"]
    assert cex == {
        **CASE_JSON,
        "seed": 3,
        "element": {"index": [1, 0], "chunk": 1, "expected": 6.0, "actual": "inf"},
    }
    no_element = ModeResult(
        "exact", "fail", 1, finding=Finding(["crashed"], "gone", ranks=[1]), counterexample=CASE
    )
    assert no_element.to_json(3)["counterexample"] == {**CASE_JSON, "seed": 3, "ranks": [1]}


# --- Report: verdict, diagnoses, only_ring_order -------------------------------------------------------


def report(modes: dict[str, ModeResult], op: Op | None = None, **kw: Any) -> Report:
    return Report("t", 9, "ring-ref difftest t --seed 9", modes, op=op, **kw)


@pytest.mark.clause("difftest-report")
def test_the_verdict_passes_only_when_every_mode_passes() -> None:
    assert report({}).verdict == "pass"
    assert report({"exact": passed("exact"), "bound": passed()}).verdict == "pass"
    assert report({"exact": failed(["raised"]), "bound": passed()}).verdict == "fail"
    assert report({"bound": passed(), "exact": failed(["raised"])}).verdict == "fail"


@pytest.mark.clause("difftest-report")
def test_the_diagnoses_are_every_modes_codes_once_in_vocabulary_order() -> None:
    modes = {
        "exact": failed(["not-ring-order", "raised"]),
        "order-free": failed(["wrong-shape", "raised"]),
        "bound": passed(),
    }
    assert report(modes).diagnoses == ["wrong-shape", "raised", "not-ring-order"]
    assert report({"bound": passed()}).diagnoses == []


ONLY_EXACT = [
    (None, ["not-ring-order"], True),
    ("sum", ["not-ring-order"], True),
    ("max", ["not-ring-order"], True),
    ("max", ["signed-zero"], True),
    ("min", ["signed-zero"], True),
    ("prod", ["signed-zero"], False),
    (None, ["signed-zero"], True),  # a fold from +0.0 (clause difftest-oracles): order-free and bound pass
    ("avg", ["signed-zero"], True),
    ("min", ["signed-zero", "not-ring-order"], False),
    (None, ["not-ring-order", "double-counted"], False),
    (None, ["double-counted"], False),
]


@pytest.mark.clause("difftest-report")
@pytest.mark.parametrize(("op", "codes", "only"), ONLY_EXACT)
def test_only_ring_order_when_exact_alone_fails_for_the_order(
    op: Op | None, codes: list[str], only: bool
) -> None:
    modes = {"exact": failed(codes), "order-free": passed("order-free"), "bound": passed()}
    assert report(modes, op).only_ring_order is only


@pytest.mark.clause("difftest-report")
def test_only_ring_order_needs_the_other_modes_run_and_passed() -> None:
    exact = failed(["not-ring-order"])
    assert not report({"exact": exact}).only_ring_order
    assert not report({"exact": exact, "bound": passed()}).only_ring_order
    assert not report({"exact": exact, "order-free": passed("order-free")}).only_ring_order
    assert not report({"exact": exact, "order-free": failed(["raised"]), "bound": passed()}).only_ring_order
    assert not report(
        {"exact": passed("exact"), "order-free": passed("order-free"), "bound": passed()}
    ).only_ring_order
    unfound = ModeResult("exact", "fail", 1)  # failed without a finding
    assert not report(
        {"exact": unfound, "order-free": passed("order-free"), "bound": passed()}
    ).only_ring_order


# --- summary -------------------------------------------------------------------------------------------

ONLY_ORDER = (
    "FAIL (exact only): t{op} computes a correct {what} - it passes order-free and bound - but {verb} in a "
    "different order than the ring, so it is not bitwise the reference (not-ring-order). Only an "
    "implementation of this exact schedule must pass exact."
)


@pytest.mark.clause("difftest-report")
@pytest.mark.parametrize(
    ("op", "what", "verb"),
    [
        (None, "all-reduce", "sums"),
        ("sum", "all-reduce", "sums"),
        ("avg", "avg all-reduce", "sums"),
        ("prod", "prod all-reduce", "combines"),
        ("max", "max all-reduce", "combines"),
        ("min", "min all-reduce", "combines"),
    ],
)
def test_the_summary_of_a_target_failing_only_for_its_order(op: Op | None, what: str, verb: str) -> None:
    modes = {"exact": failed(["not-ring-order"]), "order-free": passed("order-free"), "bound": passed()}
    suffix = f" (op {op})" if op else ""
    assert report(modes, op).summary() == ONLY_ORDER.format(op=suffix, what=what, verb=verb)


@pytest.mark.clause("difftest-report")
@pytest.mark.parametrize("op", ["max", "min"])
def test_the_summary_of_a_max_or_min_keeping_another_zero(op: Op) -> None:
    modes = {"exact": failed(["signed-zero"]), "order-free": passed("order-free"), "bound": passed()}
    assert report(modes, op).summary() == (
        f"FAIL (exact only): t computes a correct {op} - it passes order-free and bound - but keeps another "
        "zero than the ring where -0 and +0 tie (signed-zero), so it is not bitwise the reference. Only an "
        "implementation of this exact schedule must pass exact."
    )


@pytest.mark.clause("difftest-report")
def test_the_summary_of_a_pass_and_of_any_other_failure() -> None:
    both = {"exact": passed("exact"), "bound": passed()}
    assert report(both, "prod").summary() == (
        "PASS: t (op prod) matches the reference in every mode run (exact, bound)."
    )
    assert report({"order-free": passed("order-free")}).summary() == (
        "PASS: t matches the reference in every mode run (order-free)."
    )
    modes = {"exact": failed(["raised", "wrong-shape"]), "bound": failed(["raised"])}
    assert report(modes, "max").summary() == "FAIL: t (op max): wrong-shape, raised."
    assert report(modes).summary() == "FAIL: t: wrong-shape, raised."


# --- to_json and to_json_text --------------------------------------------------------------------------


@pytest.mark.clause("difftest-report")
def test_the_json_report_holds_every_field() -> None:
    exact = failed(["raised"])
    full = report(
        {"exact": exact}, None, isolated=True, ranks="gloo", timeout_s=5.0, output_bytes=3, output="abc"
    )
    assert full.to_json() == {
        "target": "t",
        "collective": "all-reduce",
        "verdict": "fail",
        "seed": 9,
        "replay": "ring-ref difftest t --seed 9",
        "diagnoses": ["raised"],
        "summary": "FAIL: t: raised.",
        "isolated": True,
        "ranks": "gloo",
        "op": "sum",
        "timeout_s": 5.0,
        "exact_against": None,
        "output": {"bytes": 3, "text": "abc"},
        "modes": {"exact": exact.to_json(9)},
    }
    plain = report({"bound": passed()}, "min").to_json()
    assert (plain["op"], plain["isolated"], plain["ranks"], plain["timeout_s"]) == ("min", False, None, None)
    assert plain["output"] == {"bytes": 0, "text": ""} and plain["verdict"] == "pass"


@pytest.mark.clause("difftest-report")
def test_the_json_text_is_one_line_of_strict_json() -> None:
    full = report({"exact": failed(["raised"], stack="a\nb")}, "avg", timeout_s=1.5)
    text = full.to_json_text()
    assert "\n" not in text and json.loads(text) == full.to_json()
    with pytest.raises(ValueError, match="JSON compliant"):
        report({}, timeout_s=math.nan).to_json_text()


# --- render --------------------------------------------------------------------------------------------


@pytest.mark.clause("difftest-report")
def test_the_text_report_of_a_failing_per_rank_target() -> None:
    exact = failed(
        ["double-counted"], ranks=[1], stack="s1\ns2\n", output="o1", overflow_skipped=2, underflow_skipped=1
    )
    full = report({"exact": exact, "bound": passed()}, "prod", ranks="gloo", timeout_s=2.5, output_bytes=12)
    assert full.render().splitlines() == [
        "FAIL: t (op prod): double-counted.",
        "  (op prod: the target was called with op= too, and checked with prod's oracles)",
        "  (per rank: the target ran on every rank of a gloo process group of N processes, "
        "at most 2.5 s per call)",
        "  exact: FAIL (4 inputs tried, 2 overflowing element(s) accepted, "
        "1 element(s) that could underflow accepted)",
        "    diagnosis: double-counted",
        "    what went wrong",
        "    counterexample: N = 2, M = 2, shape (2, 2, 1), float32, contiguous layout; rank(s) [1]",
        "    input = [[[1.0], [2.0]], [[3.0], [4.0]]]",
        "    the target's Python stack (every thread, most recent call first):",
        "      s1",
        "      s2",
        "    the target's output on this input:",
        "      o1",
        "  bound: PASS (7 inputs tried)",
        "The target wrote 12 byte(s) to stdout/stderr in all (text in --json).",
        "Replay: ring-ref difftest t --seed 9",
    ]


@pytest.mark.clause("difftest-report")
def test_the_text_report_names_an_mpi_job_in_plain_words() -> None:
    mpi = report({"bound": passed()}, ranks="mpi", timeout_s=3.0)
    assert (
        "  (per rank: the target ran on every rank of an MPI job of N processes, at most 3 s per call)"
        in (mpi.render().splitlines())
    )


@pytest.mark.clause("difftest-report")
def test_the_text_report_of_isolated_and_in_process_targets() -> None:
    isolated = report({"order-free": passed("order-free", 3)}, isolated=True, timeout_s=60.0)
    assert isolated.render().splitlines() == [
        "PASS: t matches the reference in every mode run (order-free).",
        "  (isolated: the target ran in a worker process, at most 60 s per call)",
        "  order-free: PASS (3 inputs tried)",
        "Replay: ring-ref difftest t --seed 9",
    ]
    skipped = ModeResult("bound", "pass", 2, underflow_skipped=5)
    bf16 = Case(2, 2, (), torch.bfloat16, "sliced", (1.0, -2.0, 0.5, 4.0))
    found = ModeResult(
        "exact", "fail", 1, finding=Finding(["raised", "crashed"], "boom"), counterexample=bf16
    )
    unfound = ModeResult("order-free", "fail", 6, finding=Finding(["raised"], "no case"))
    in_process = report({"bound": skipped, "exact": found, "order-free": unfound})
    assert in_process.render().splitlines() == [
        "FAIL: t: raised, crashed.",
        "  (not isolated: the target ran in the tester's own process, with no time limit)",
        "  bound: PASS (2 inputs tried, 5 element(s) that could underflow accepted)",
        "  exact: FAIL (1 inputs tried)",
        "    diagnosis: raised, crashed",
        "    boom",
        "    counterexample: N = 2, M = 2, shape (2, 2), bfloat16, sliced layout",
        "    input = [[1.0, -2.0], [0.5, 4.0]]",
        "  order-free: FAIL (6 inputs tried)",
        "Replay: ring-ref difftest t --seed 9",
    ]


@pytest.mark.clause("difftest-report")
@pytest.mark.parametrize(("lines", "shown"), [(24, 24), (25, 24), (30, 24), (3, 3)])
def test_a_long_stack_or_output_is_cut_to_its_first_24_lines(lines: int, shown: int) -> None:
    text = "".join(f"l{i}\n" for i in range(lines))
    rendered = report({"exact": failed(["raised"], stack=text, output=text)}).render().splitlines()
    want = [f"      l{i}" for i in range(shown)]
    if lines > shown:
        want.append(f"      ... ({lines - shown} more line(s) in --json)")
    start = rendered.index("    the target's Python stack (every thread, most recent call first):") + 1
    assert rendered[start : start + len(want) + 1] == [*want, "    the target's output on this input:"]
    assert rendered[-len(want) - 1 : -1] == want


def values_dumped_to(length: int) -> tuple[float, ...]:
    """Values of a (2, 39) case whose input is ``length`` characters of JSON (394 with every value 1.0)."""
    values = [10.0] * (length - 394) + [1.0] * (78 - (length - 394))
    assert len(json.dumps([values[:39], values[39:]])) == length
    return tuple(values)


@pytest.mark.clause("difftest-report")
@pytest.mark.parametrize("length", [399, 400, 401, 404])
def test_an_input_longer_than_400_characters_is_abbreviated(length: int) -> None:
    values = values_dumped_to(length)
    case = Case(2, 39, (), torch.float64, "contiguous", values)
    result = ModeResult("exact", "fail", 1, finding=Finding(["raised"], "e"), counterexample=case)
    line = next(x for x in report({"exact": result}).render().splitlines() if x.startswith("    input = "))
    dumped = json.dumps([list(values[:39]), list(values[39:])])
    want = dumped if length <= 400 else dumped[:400] + " ... (full input in --json)"
    assert line == f"    input = {want}"


@pytest.mark.clause("difftest-report")
def test_trailing_blank_lines_are_dropped_and_every_line_kept_as_written() -> None:
    result = failed(["raised"], stack="  File t.py   \n\n\n", output="raise TOO_MAX\n\n")
    rendered = report({"exact": result}).render().splitlines()
    start = rendered.index("    the target's Python stack (every thread, most recent call first):")
    assert rendered[start + 1 : start + 5] == [
        "        File t.py   ",
        "    the target's output on this input:",
        "      raise TOO_MAX",
        "Replay: ring-ref difftest t --seed 9",
    ]


# --- exact_against ---------------------------------------------------------------------------------


@pytest.mark.clause("difftest-report")
def test_a_pass_shows_its_replay_line_with_the_seed() -> None:
    """Issue #29 item 4: a pass is as reproducible from the text as a fail."""
    lines = report({"bound": passed()}).render().splitlines()
    assert lines[-1] == "Replay: ring-ref difftest t --seed 9"


@pytest.mark.clause("difftest-report")
def test_every_report_says_what_exact_checked_against() -> None:
    spec = report({"exact": passed("exact")}, exact_against=SPEC_ORDER)
    assert "  (exact checks against the ring order (fold-order))" in spec.render().splitlines()
    assert spec.to_json()["exact_against"] == {
        "source": "spec",
        "order": "the ring order (fold-order)",
        "option": "",
        "inputs": None,
        "revealed": None,
    }
    trees = SavedOrder(3, 6, torch.float32, [], "even")
    saved = replace(SPEC_ORDER, name="the order saved in o.json", source="order", ring=None, saved=trees)
    text = report({"exact": passed("exact")}, exact_against=saved).render()
    assert (
        "  (exact checks against the order saved in o.json; exact's inputs are all N = 3, M = 6, float32, "
        "the file's (--max-workers and --dtypes apply to the other modes))"
    ) in text.splitlines()
    auto = replace(SPEC_ORDER, name="the gloo schedule's order", source="auto", revealed="revealed at X")
    doc = report({"exact": passed("exact")}, exact_against=auto).to_json()["exact_against"]
    assert (doc["source"], doc["revealed"]) == ("auto", "revealed at X")
    assert (
        "which --schedule auto found in the target (revealed at X)"
        in report({"exact": passed("exact")}, exact_against=auto).render()
    )
