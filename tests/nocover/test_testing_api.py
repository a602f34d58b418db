"""``ring_ref.testing.assert_matches_reference`` as a test suite sees it: pytest's report of a failure."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.clause("difftest-report")

TINY = textwrap.dedent(
    """
    from ring_ref.testing import assert_matches_reference

    def test_mean_is_not_a_sum():
        assert_matches_reference(lambda x: x.mean(0), mode=["order-free"], examples=20, seed=0)
    """
)


def test_a_failing_assertion_under_pytest_shows_the_report_and_not_the_source_of_testing_py(
    tmp_path: Path,
) -> None:
    """Issue #29 item 11: the failure is the report; the frames of ``ring_ref/testing.py`` are hidden."""
    (tmp_path / "test_tiny.py").write_text(TINY, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "test_tiny.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "FAIL: " in out and "mean-not-sum" in out and "Replay: ring_ref.difftest.difftest(" in out
    assert "assert_matches_reference(lambda x: x.mean(0)" in out  # the test's own line is shown
    for source in ("__tracebackhide__", "report = difftest(", "def assert_matches_reference", "testing.py:"):
        assert source not in out, source
