"""The search: correct implementations pass, the N = 1 and non-contiguous cases are always tried."""

from __future__ import annotations

import json

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref.difftest import DTYPES, difftest
from tests import planted_impls
from tests.paths import ROOT
from tests.planted_impls import Impl, run_all

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())


@pytest.mark.clause("difftest-oracles", "fold-order")
@pytest.mark.parametrize("name", sorted(planted_impls.CORRECT))
def test_correct_implementations_pass_every_mode(name: str) -> None:
    report = run_all(planted_impls.CORRECT[name], examples=40)
    assert report.verdict == "pass", report.render()
    assert set(report.modes) == {"exact", "order-free", "bound"}
    assert all(r.examples >= 40 for r in report.modes.values())
    assert report.diagnoses == []


@pytest.mark.clause("difftest-diagnoses", "n1-no-rounds")
@pytest.mark.parametrize("bug", [planted_impls.raises_on_one_worker, planted_impls.returns_view_of_input])
def test_one_worker_is_always_tried(bug: Impl) -> None:
    report = difftest(bug, modes=("bound",), examples=1, seed=0, max_workers=16)
    result = report.modes["bound"]
    assert result.verdict == "fail" and result.counterexample is not None
    assert result.counterexample.n == 1


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


@pytest.mark.soak
@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("name", sorted(planted_impls.CORRECT))
def test_soak_correct_implementations_pass_many_examples(name: str) -> None:
    report = difftest(planted_impls.CORRECT[name], examples=1000, seed=7)
    assert report.verdict == "pass", report.render()


@pytest.mark.clause("difftest-every-n")
@pytest.mark.parametrize("seed", range(20))
def test_a_value_bug_at_one_n_fails_every_mode_at_every_seed(seed: int) -> None:
    """Issue #40 item 1, stacked: a bug at ``N = 3`` alone, which zeros hide, fails every mode at
    ``--examples 20``, whatever the seed: every ``N`` gets its value probes and a random case."""
    report = difftest(planted_impls.chunks_rotated_at_three, examples=20, seed=seed, isolate=False)
    for mode, result in report.modes.items():
        case = result.counterexample
        assert result.verdict == "fail" and case is not None and case.n == 3, (mode, report.render())


@pytest.mark.clause("difftest-coverage")
def test_a_pass_names_the_remainders_it_never_tried_and_the_option_that_tries_them() -> None:
    """Issue #40 item 2: a ring that drops the remainder passes the default schedule (every M a multiple
    of N); its report says, per mode, that no M had a remainder, and names ``--schedule openmpi-ring``."""
    report = difftest(planted_impls.drops_the_remainder, examples=10, seed=3, isolate=False)
    assert report.verdict == "pass", report.render()
    doc = report.to_json()
    jsonschema.validate(doc, SCHEMA)
    for mode, result in doc["modes"].items():
        coverage = result["coverage"]
        assert coverage["m_not_multiple_of_n"] is False and coverage["n"] == list(range(1, 17)), mode
        assert {"what": "M not a multiple of N", "option": "--schedule openmpi-ring"} in coverage["untried"]
    text = report.render()
    assert text.count("never tried: M not a multiple of N (--schedule openmpi-ring)") == 3, text
    assert "--op prod/max/min/avg" in text, text
    blocks = difftest(
        planted_impls.drops_the_remainder, examples=10, seed=3, isolate=False, schedule="openmpi-ring"
    )
    assert blocks.verdict == "fail" and blocks.modes["exact"].coverage is not None, blocks.render()
    assert blocks.modes["exact"].coverage.remainder, blocks.render()
