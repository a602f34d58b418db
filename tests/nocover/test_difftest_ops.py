"""``difftest --op`` on real gloo groups: ``torch.distributed.all_reduce`` and ``ring_all_reduce_`` per op.

A per-rank gloo target gets the ``torch.distributed.ReduceOp`` (clause
``difftest-ops``), so ``torch.distributed:all_reduce`` is a target as it is.
"""

from __future__ import annotations

import pytest

from ring_ref.difftest import difftest
from tests.common import planted_rank_impls
from tests.common.planted_rank_impls import RankImpl

pytestmark = pytest.mark.clause("difftest-ops")


@pytest.mark.clause("difftest-ranks")
@pytest.mark.parametrize("op", ["prod", "max", "min"])
def test_gloo_all_reduce_passes_order_free_and_bound_per_op(op: str) -> None:
    report = difftest(
        "torch.distributed:all_reduce",
        ranks="gloo",
        op=op,
        modes=("order-free", "bound"),
        examples=8,
        seed=4,
        max_workers=3,
    )
    assert report.verdict == "pass" and report.op == op, report.render()
    assert " --op " + op in report.replay


@pytest.mark.clause("difftest-ranks", "fold-order")
@pytest.mark.parametrize("op", ["prod", "max", "min", "avg"])
def test_ring_all_reduce_underscore_passes_exact_per_op(op: str) -> None:
    report = difftest(
        "ring_ref.distributed:ring_all_reduce_",
        ranks="gloo",
        op=op,
        modes=("exact",),
        examples=8,
        seed=5,
        max_workers=3,
    )
    assert report.verdict == "pass", report.render()


def test_stacked_gloo_target_takes_the_op_by_name() -> None:
    from ring_ref import targets

    try:
        # Runs isolated: the worker imports ring_ref.targets and starts its own process group there.
        report = difftest(
            targets.gloo_all_reduce,
            op="max",
            modes=("order-free", "bound"),
            examples=5,
            seed=3,
            max_workers=3,
        )
    finally:
        targets.close()
    assert report.verdict == "pass", report.render()


@pytest.mark.clause("difftest-ranks", "difftest-diagnoses")
@pytest.mark.parametrize("bug", list(planted_rank_impls.OP_EXPECTED), ids=lambda f: f.__name__)
def test_planted_per_rank_op_bug_gets_its_code(bug: RankImpl) -> None:
    op, expected = planted_rank_impls.OP_EXPECTED[bug]
    report = difftest(bug, ranks="gloo", op=op, examples=12, seed=1, max_workers=3, timeout=10)
    for mode, code in expected.items():
        result = report.modes[mode]
        codes = result.finding.codes if result.finding is not None else []
        assert codes == ([code] if code else []), (mode, report.render())
