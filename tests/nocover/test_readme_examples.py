"""The README's worked examples, run: their verdicts, codes, counterexamples and exit status as pasted.

Each ```` ```console ```` block of README.md is one example: ``$ ring-ref ...``, the
output pasted from a real run, then ``$ echo $?`` and the exit status.  The
command runs again here (``python -m ring_ref``, the same program) and its key
lines (verdicts, diagnosis codes, counterexamples and inputs, the replay line,
reveal's folds and classification) and exit status must be the pasted ones, so
an example that rots fails the build.  Timings and counts of inputs tried are
left out of the comparison; the explanations' wording is the diagnosis tests'.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.common.paths import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")

KEY = re.compile(
    r"^\s*(FAIL|PASS|\(isolated|\(per rank|exact:|order-free:|bound:|diagnosis:|counterexample:|input = |"
    r"Replay:|ring-ref reveal |elements |classification:|matches presets:|calls:)"
)
NOT_KEY = re.compile(
    r" \(\d+ inputs tried\)|; time [\d.]+ s( revealing, [\d.]+ s in all \(start-up included\))?"
)


@dataclass(frozen=True)
class Example:
    command: str
    output: str
    status: int


def examples(readme: str) -> list[Example]:
    """The README's console blocks: ``$ command``, its output, ``$ echo $?`` and the status."""
    found = []
    for block in re.findall(r"^```console\n(.*?)^```$", readme, flags=re.MULTILINE | re.DOTALL):
        first, rest = block.split("\n", 1)
        output, status = rest.split("$ echo $?\n")
        assert first.startswith("$ ring-ref "), first
        found.append(Example(first.removeprefix("$ "), output, int(status)))
    return found


def key_lines(output: str) -> list[str]:
    """The lines that must not drift, without timings and counts of inputs tried."""
    return [NOT_KEY.sub("", line.rstrip()) for line in output.splitlines() if KEY.match(line)]


def test_the_readme_has_its_three_worked_examples() -> None:
    commands = [example.command.split()[:3] for example in examples(README)]
    assert commands == [
        ["ring-ref", "difftest", "examples/buggy_allreduce.py:ring_all_reduce"],
        ["ring-ref", "difftest", "--ranks"],
        ["ring-ref", "reveal", "--ranks"],
    ]


def test_key_lines_keep_verdicts_codes_and_inputs_and_drop_timings() -> None:
    pasted = examples(README)[0].output
    kept = key_lines(pasted)
    assert kept[0].startswith("FAIL: examples/buggy_allreduce.py:ring_all_reduce: double-counted")
    assert "  exact: FAIL" in kept and "    diagnosis: double-counted" in kept
    assert any(line.startswith("Replay: ring-ref difftest") for line in kept)
    assert not any("double-counted: First differing" in line for line in kept)
    assert key_lines("calls: 9 (4 probing); time 0.34 s\n  bound: PASS (38 inputs tried)") == [
        "calls: 9 (4 probing)",
        "  bound: PASS",
    ]
    assert key_lines("calls: 9 (4 probing); time 0.34 s revealing, 8.23 s in all (start-up included)") == [
        "calls: 9 (4 probing)"
    ]


@pytest.mark.parametrize("example", examples(README), ids=lambda e: " ".join(e.command.split()[1:3]))
def test_a_worked_example_prints_what_the_readme_shows(example: Example) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ring_ref", *shlex.split(example.command)[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert key_lines(run.stdout) == key_lines(example.output), run.stdout + run.stderr
    assert run.returncode == example.status, run.stdout + run.stderr


def templates(readme: str) -> tuple[str, list[str]]:
    """Worked example (d): the ```` ```python ```` block that defines ``stacked`` and ``per_rank``, and
    the ``ring-ref difftest ... my_ring.py:NAME`` commands the text around it says to run."""
    (code,) = [
        b for b in re.findall(r"^```python\n(.*?)^```$", readme, flags=re.M | re.S) if "def stacked" in b
    ]
    return code, re.findall(r"`(ring-ref difftest\s[^`]*my_ring\.py:\w+)`", readme)


def test_the_templates_pass_as_the_readme_says(tmp_path: Path) -> None:
    """Saved as ``my_ring.py`` and run with the README's commands and ``--mode order-free --mode bound``,
    the stacked and the per-rank template each pass (exit status 0)."""
    code, commands = templates(README)
    assert [c.split(":")[-1] for c in commands] == ["stacked", "per_rank"], commands
    (tmp_path / "my_ring.py").write_text(code, encoding="utf-8")
    for command in commands:
        options = [
            "--mode",
            "order-free",
            "--mode",
            "bound",
            "--examples",
            "10",
            "--seed",
            "1",
            "--max-workers",
            "3",
        ]
        run = subprocess.run(
            [sys.executable, "-m", "ring_ref", *shlex.split(command)[1:], *options],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert run.returncode == 0 and run.stdout.startswith("PASS: my_ring.py:"), run.stdout + run.stderr
