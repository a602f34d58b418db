"""Isolation: targets that exit, hang, crash, print, leave threads or patch the tester get a true verdict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

import ring_ref
from ring_ref._cli import main
from ring_ref.difftest import difftest
from ring_ref.difftest._oracles import check_values
from tests.common import planted_impls
from tests.common.paths import ROOT
from tests.common.planted_impls import Impl

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
ORIGINAL_RING_ALL_REDUCE = ring_ref.ring_all_reduce
ORIGINAL_CHECK_VALUES = check_values

WORDS: dict[Impl, str] = {
    planted_impls.exits_with_sys_exit: "raised SystemExit: 0",
    planted_impls.exits_with_os_exit: "the worker process exited with status 0",
    planted_impls.sleeps_forever: "no answer within 1 s (--timeout); the worker was killed",
    planted_impls.segfaults: "was killed by signal SIGSEGV",
    planted_impls.raises_keyboard_interrupt: "raised KeyboardInterrupt",
    planted_impls.wrong_every_other_call: "The same input, called twice, gave different answers",
    planted_impls.patches_the_tester: "counted more than once",
    planted_impls.writes_over_the_tester_pipes: "its reply was garbled",
    planted_impls.crashes_with_three_workers: "the worker process exited with status 3",
}


@pytest.mark.clause("difftest-isolation", "difftest-report")
@pytest.mark.parametrize("bug", list(planted_impls.MISBEHAVING), ids=lambda f: f.__name__)
def test_misbehaving_target_gets_its_code_and_exit_1(bug: Impl, capfd: pytest.CaptureFixture[str]) -> None:
    target = f"tests.common.planted_impls:{bug.__name__}"
    args = ["difftest", target, "--examples", "30", "--max-workers", "3", "--seed", "3", "--timeout", "1"]
    status = main([*args, "--json"])
    captured = capfd.readouterr()
    doc = json.loads(captured.out)  # stdout, at the file-descriptor level, is exactly one JSON object
    jsonschema.validate(doc, SCHEMA)
    code = planted_impls.MISBEHAVING[bug]
    assert status == 1 and doc["verdict"] == "fail" and doc["isolated"] is True, doc["summary"]
    assert doc["diagnoses"] == [code]
    assert set(doc["modes"]) == {"exact", "order-free", "bound"}
    for mode, part in doc["modes"].items():
        assert part["diagnoses"] == [code], (mode, part["explanation"])
        assert WORDS[bug] in part["explanation"], (mode, part["explanation"])
        if code in ("timed-out", "crashed"):
            # Reported as found: no shrinking, so the case that failed is the last one tried.
            crash_n = 3 if bug is planted_impls.crashes_with_three_workers else 1
            assert part["counterexample"]["n"] == crash_n
        if code == "timed-out":
            assert part["examples"] == 1
            assert f"in {bug.__name__}" in part["counterexample"]["stack"]
            assert "_worker.py" not in part["counterexample"]["stack"]  # the tester's frames are cut
    if bug is planted_impls.segfaults:
        assert "in segfaults" in doc["modes"]["bound"]["counterexample"]["stack"]
    if bug is planted_impls.crashes_with_three_workers:
        # The worker is restarted for the next mode, which answers the N = 1 cases before it crashes again.
        assert all(part["examples"] > 8 for part in doc["modes"].values())


@pytest.mark.clause("difftest-isolation")
def test_a_target_that_patches_the_tester_changes_nothing_in_the_tester() -> None:
    report = difftest(planted_impls.patches_the_tester, modes=("order-free",), examples=3, seed=1)
    assert report.isolated and report.diagnoses == ["double-counted"], report.render()
    # Its patches stayed in the worker: the tester's own functions are the originals.
    assert ring_ref.ring_all_reduce is ORIGINAL_RING_ALL_REDUCE
    assert ring_ref.difftest._oracles.check_values is ORIGINAL_CHECK_VALUES
    assert not torch.equal(torch.zeros(1), torch.ones(1))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.clause("difftest-isolation", "difftest-report")
@pytest.mark.parametrize(
    ("bug", "status"),
    [(planted_impls.leaves_a_thread_and_a_child, 0), (planted_impls.exits_with_os_exit, 1)],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_the_tester_process_ends_with_the_checks(bug: Impl, status: int, tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    options = ["--mode", "bound", "--examples", "3", "--seed", "1", "--json"]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ring_ref",
            "difftest",
            f"tests.common.planted_impls:{bug.__name__}",
            *options,
        ],
        cwd=ROOT,
        env={**os.environ, "RING_REF_TEST_PIDFILE": str(pidfile)},
        capture_output=True,
        text=True,
        timeout=120,  # a leftover non-daemon thread would keep an unisolated tester alive forever
        check=False,
    )
    assert run.returncode == status, run.stderr
    doc = json.loads(run.stdout)
    assert doc["verdict"] == ("pass" if status == 0 else "fail")
    if bug is planted_impls.leaves_a_thread_and_a_child:
        pids = [int(line) for line in pidfile.read_text().split()]
        assert len(pids) == doc["modes"]["bound"]["examples"]
        assert not [pid for pid in pids if _alive(pid)]  # the worker's process group was killed
