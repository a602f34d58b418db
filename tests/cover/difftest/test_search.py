"""The search: correct implementations pass, the N = 1 and non-contiguous cases are always tried."""

from __future__ import annotations

import json

import pytest
import torch

from ring_ref.difftest import DTYPES, difftest
from tests.common import planted_impls
from tests.common.paths import ROOT
from tests.common.planted_impls import Impl, run_all

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
