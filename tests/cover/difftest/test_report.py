"""The report and the command line: replay lines, the JSON schema, exit statuses and usage errors."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest

from ring_ref import ring_all_reduce
from ring_ref._cli import main
from ring_ref.difftest import DTYPES, Report, difftest
from tests import planted_hints, planted_impls
from tests.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())


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


@pytest.mark.clause("difftest-raised-at")
@pytest.mark.parametrize(
    ("name", "function"), [("helper", "raises_in_a_helper"), ("torch", "raises_inside_torch")]
)
def test_raised_names_the_file_line_and_source_in_the_target_s_code(
    name: str, function: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The innermost frame in the target's code: a helper of its file, or its own line that called into
    ``torch`` (never ``torch``'s, never the tester's); in the text and the JSON, in-process."""
    line, source = planted_hints.marked_line(name)
    argv = ["difftest", f"{planted_hints.FILE}:{function}", "--in-process", "--mode", "bound", "--seed", "1"]
    assert main([*argv, "--examples", "2", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    bound = doc["modes"]["bound"]
    assert bound["diagnoses"] == ["raised"]
    assert bound["counterexample"]["raised_at"] == {
        "file": planted_hints.FILE,
        "line": line,
        "source": source,
    }
    assert f"(on a valid input) at {planted_hints.FILE}:{line}: {source}" in bound["explanation"]
    assert main([*argv, "--examples", "2"]) == 1
    assert f" at {planted_hints.FILE}:{line}: {source}" in capsys.readouterr().out
    no_frame = {**bound["counterexample"], "raised_at": {"file": "t.py", "line": "1", "source": ""}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc, "modes": {"bound": {**bound, "counterexample": no_frame}}}, SCHEMA)
