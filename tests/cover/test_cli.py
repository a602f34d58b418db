"""The command line: ``python -m ring_ref`` and the ``ring-ref`` console script."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ring_ref
from ring_ref._cli import main
from ring_ref.difftest import difftest
from tests.common.paths import ROOT


@pytest.mark.clause("worked-example", "round-count")
def test_demo_prints_the_worked_example_and_every_round_for_n4(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "after reduce-scatter round 0: worker buffers [[1.0, 6.0], [4.0, 4.0]]" in out
    assert "ring_all_reduce(x) = [4.0, 6.0]" in out
    for phase in ("reduce-scatter", "all-gather"):
        for r in range(3):
            assert f"{phase} round {r} " in out
    assert f"{phase} round 3 " not in out


def test_python_dash_m_and_console_script_run() -> None:
    module = subprocess.run(
        [sys.executable, "-m", "ring_ref", "demo"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert "[4.0, 6.0]" in module.stdout
    script = shutil.which("ring-ref", path=str(Path(sys.executable).parent))
    assert script is not None, "the ring-ref console script is not installed next to this Python"
    console = subprocess.run([script, "demo"], capture_output=True, text=True, check=True, cwd=ROOT)
    assert console.stdout == module.stdout


def test_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_vectors_into_a_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "not-a-dir"
    target.write_text("keep me", encoding="utf-8")
    assert main(["vectors", "--out", str(target)]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert target.read_text(encoding="utf-8") == "keep me"


def test_version_is_the_package_version_and_the_citation_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    printed = capsys.readouterr().out.split()
    citation = {
        key.strip(): value.strip().strip('"')
        for key, _, value in (
            line.partition(":") for line in (ROOT / "CITATION.cff").read_text(encoding="utf-8").splitlines()
        )
    }
    assert printed == ["ring-ref", importlib.metadata.version("ring-ref")]
    assert citation["version"] == ring_ref.__version__ == printed[1]


def test_vectors_into_an_empty_path_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vectors", "--out", ""]) == 2
    assert "--out must name a directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fmt", "too_many", "hint"),
    [("svg", 9, "--format table (N <= 16)"), ("table", 17, "--format json (N <= 64)"), ("json", 65, "-n")],
)
def test_trace_refuses_rings_it_cannot_show_readably(
    fmt: str, too_many: int, hint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["trace", "-n", str(too_many), "--format", fmt]) == 2
    err = capsys.readouterr().err
    assert f"N = {too_many} workers is too many to show readably as {fmt}" in err and hint in err
    assert main(["trace", "-n", str(too_many - 1), "-m", str(too_many - 1), "--format", fmt]) == 0


@pytest.mark.clause("difftest-exact-orders")
def test_a_schedule_that_starts_with_a_dash_or_is_unknown_is_told_the_command_line_syntax(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #29 item 13: ``--schedule -1,2,blocks`` (argparse reads it as an option) and an unknown name."""
    for command in (["trace", "-n", "3"], ["difftest", "ring_ref:ring_all_reduce"]):
        with pytest.raises(SystemExit) as stopped:
            main([*command, "--schedule", "-1,2,blocks"])
        assert stopped.value.code == 2
        assert "write --schedule=-1,2,blocks" in capsys.readouterr().err
        assert main([*command, "--schedule", "ring"]) == 2
        err = capsys.readouterr().err
        assert "unknown schedule 'ring'" in err and "--schedule=-1,2,blocks on the command line" in err
    assert main(["trace", "-n", "3", "--schedule=-1,2,blocks"]) == 0
    assert "direction -1, offset 2, layout blocks" in capsys.readouterr().out


@pytest.mark.clause("reveal-report")
def test_reveal_of_an_order_that_is_no_ring_suggests_difftest_and_still_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["reveal", "tests.common.planted_impls:gather_adds", "-n", "3", "-m", "3"]) == 0
    assert "run: ring-ref difftest tests.common.planted_impls:gather_adds" in capsys.readouterr().err
    assert main(["reveal", "ring_ref:ring_all_reduce", "-n", "3", "-m", "3"]) == 0
    assert "ring-ref difftest" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "options"),
    [
        (["--ranks", "gloo", "--in-process"], {"ranks": "gloo", "isolate": False}),
        (["--mca", "btl=self"], {"mca": {"btl": "self"}}),
        (["--ranks", "mpi", "--dtypes", "bfloat16"], {"ranks": "mpi", "dtypes": [torch.bfloat16]}),
        (["--subgroups"], {"subgroups": True}),
        (["--op", "max", "--schedule", "auto"], {"op": "max", "schedule": "auto"}),
    ],
)
def test_a_broken_option_rule_is_exit_2_in_the_words_the_api_raises(
    argv: list[str], options: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    """One set of option rules (difftest's ``_options.refused``): the command line says what the API says."""
    target = "ring_ref:ring_all_reduce"
    assert main(["difftest", target, "--examples", "1", *argv]) == 2
    said = capsys.readouterr().err
    with pytest.raises(ValueError) as refused:
        difftest(target, examples=1, **options)  # type: ignore[arg-type]
    assert said == f"ring-ref difftest: error: {refused.value}\n"
