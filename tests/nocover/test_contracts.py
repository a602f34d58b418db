"""CrossHair, run on planted faults, must report counterexamples.

``make contracts`` runs CrossHair on ``ring_ref/_contracts.py`` and requires none;
this shows the same statements catch a faulty all-gather and a faulty chunk index.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.common.paths import ROOT


@pytest.mark.clause("ag-copy-not-add", "rs-add")
def test_crosshair_finds_counterexamples_in_planted_faults() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "crosshair",
            "check",
            "--analysis_kind=asserts",
            "--per_condition_timeout=20",
            str(ROOT / "tests" / "crosshair_faults.py"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 1, report
    for name in ("faulty_ag_round_contract", "faulty_rs_round_contract"):
        assert f"when calling {name}(" in report, report
