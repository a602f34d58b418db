"""The sign of a zero sum (clause ``difftest-oracles``): where every worker holds ``-0.0``.

Every order of IEEE 754 additions of ``-0.0`` values gives ``-0.0``; a fold
that starts from the identity ``+0.0`` (XLA's ``psum``, ``torch.sum``,
``numpy.sum``) gives ``+0.0``.  ``order-free`` and ``bound`` accept either
there, ``exact`` requires the ring's ``-0.0`` and names the other
``signed-zero``.  Any other zero sum is ``+0.0`` in every order.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import find, settings

from ring_ref import ring_all_reduce
from ring_ref.difftest import difftest
from ring_ref.difftest._inputs import Case, cases
from ring_ref.difftest._oracles import check_values
from ring_ref.difftest._vocabulary import Mode

pytestmark = pytest.mark.clause("difftest-oracles")


def from_plus_zero(x: torch.Tensor) -> torch.Tensor:
    """The ring's sum, folded from ``+0.0``: ``-0.0 + +0.0`` is ``+0.0``, every other value unchanged."""
    return ring_all_reduce(x) + 0.0


def test_a_fold_from_plus_zero_fails_exact_only_as_signed_zero() -> None:
    report = difftest(from_plus_zero, examples=30, seed=3, max_workers=4, isolate=False)
    assert {m: r.verdict for m, r in report.modes.items()} == {
        "exact": "fail",
        "order-free": "pass",
        "bound": "pass",
    }
    finding = report.modes["exact"].finding
    assert finding is not None and finding.codes == ["signed-zero"]
    assert "a fold that starts from the identity +0.0" in finding.explanation
    assert report.only_ring_order
    assert "gives +0.0 where every worker holds -0.0" in report.summary()


@pytest.mark.parametrize("op", [None, "avg"])
def test_order_free_takes_either_zero_only_where_every_worker_holds_minus_zero(op: str | None) -> None:
    # element 0: workers -0.0, -0.0 (either zero); element 1: +0.0, -0.0 (+0.0 in every order)
    case = Case(2, 2, (), torch.float32, "contiguous", (-0.0, 0.0, -0.0, -0.0), op)  # type: ignore[arg-type]
    for first in (0.0, -0.0):
        assert check_values("order-free", case, torch.tensor([first, 0.0])).mismatch is None
    wrong = check_values("order-free", case, torch.tensor([0.0, -0.0])).mismatch
    assert wrong is not None and wrong.index == (1,)
    assert check_values("bound", case, torch.tensor([0.0, 0.0])).mismatch is None
    ring = check_values("exact", case, torch.tensor([0.0, 0.0])).mismatch
    assert ring is not None and ring.index == (0,) and math.copysign(1.0, ring.expected) < 0


def _minus_zero_column(case: Case) -> bool:
    per_worker = len(case.values) // case.n
    column = [case.values[i * per_worker] for i in range(case.n)]
    return case.n > 1 and all(v == 0 and math.copysign(1.0, v) < 0 for v in column)


@pytest.mark.parametrize("mode", ["exact", "order-free", "bound"])
def test_the_generators_draw_columns_of_minus_zero(mode: Mode) -> None:
    found = find(
        cases(mode, dtypes=[torch.float32], max_workers=3),
        _minus_zero_column,
        settings=settings(max_examples=500, database=None),
    )
    assert _minus_zero_column(found)
