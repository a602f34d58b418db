"""The oracles on their own.

The bound accepts every summation order and is tight; exact agrees with the independent ring fold.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ring_ref._dtypes import FORMATS
from ring_ref.difftest import DTYPES, Case
from ring_ref.difftest._inputs import (
    cases,
)
from ring_ref.difftest._oracles import check_values, locate
from ring_ref.difftest._orders import checking_against, schedule_order
from tests.common.oracles import blocks_bounds, gloo_bounds, ring_fold, sums_in_several_orders
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())


@pytest.mark.clause("difftest-oracles")
@given(cases("bound", ALL_DTYPES), st.randoms(use_true_random=False))
def test_bound_accepts_every_summation_order(case: Case, rnd: random.Random) -> None:
    for total in sums_in_several_orders(case.tensor(), rnd):
        mismatch = check_values("bound", case, total).mismatch
        assert mismatch is None, mismatch


@pytest.mark.clause("difftest-oracles", "input-finite")
def test_bound_overflow_policy_is_tight_for_two_workers() -> None:
    # float16 overflows at 65520 = 65504 + ulp/2: 32768 + 32752 rounds to inf (a tie, to even),
    # 32768 + 32736 = 65504 is exact, so with one addition no order can give inf there.
    half = torch.tensor([32768.0], dtype=torch.float16)
    assert torch.isinf(half + 32752.0) and float(half + 32736.0) == 65504.0
    inf = torch.tensor([float("inf"), 0.0], dtype=torch.float16)
    tie = Case(2, 2, (), torch.float16, "contiguous", (32768.0, 0.0, 32752.0, 0.0))
    assert check_values("bound", tie, inf) == (None, 1, 0)
    below = Case(2, 2, (), torch.float16, "contiguous", (32768.0, 0.0, 32736.0, 0.0))
    mismatch, skipped, _ = check_values("bound", below, inf)
    assert mismatch is not None and skipped == 0
    # Three workers: the last addition's operands carry at most one rounding, so the
    # acceptance threshold is the overflow limit / (1 + gamma_1), just below 65520.
    three = Case(3, 3, (), torch.float16, "contiguous", (32768.0, 0, 0, 32736.0, 0, 0, 8.0, 0, 0))
    three_inf = torch.tensor([float("inf"), 0, 0], dtype=torch.float16)
    assert check_values("bound", three, three_inf) == (None, 1, 0)
    one = Case(1, 1, (), torch.float16, "contiguous", (65504.0,))
    assert check_values("bound", one, torch.tensor([float("inf")], dtype=torch.float16))[0] is not None


@pytest.mark.clause("difftest-oracles", "input-finite")
def test_bound_overflow_policy() -> None:
    big = Case(2, 2, (), torch.float16, "contiguous", (65504.0, 1.0, 65504.0, 1.0))
    inf_ok = torch.tensor([float("inf"), 2.0], dtype=torch.float16)
    mismatch, skipped, _ = check_values("bound", big, inf_ok)
    assert (mismatch, skipped) == (None, 1)
    small = Case(2, 2, (), torch.float16, "contiguous", (1.0, 1.0, 1.0, 1.0))
    small_inf = torch.tensor([float("inf"), 2.0], dtype=torch.float16)
    mismatch, skipped, _ = check_values("bound", small, small_inf)
    assert mismatch is not None and skipped == 0 and mismatch.index == (0,)
    assert "no summation order can overflow" in mismatch.detail


@pytest.mark.clause("difftest-oracles")
def test_bound_is_tight_to_gamma() -> None:
    # N = 2 in float16, exact sum 1 + 2**-11 (a tie): the bound is gamma_1 * (1 + 2**-11),
    # a hair above 2**-11.  Both neighbours of the tie (1 and 1 + 2**-10) are in bound;
    # the next float below, 1 - 2**-11, is 2 * 2**-11 away and out of bound.
    case = Case(2, 2, (), torch.float16, "contiguous", (1.0, 0.0, 2.0**-11, 0.0))
    bound = FORMATS["float16"].gamma(1) * (1 + Fraction(1, 2**11))
    assert Fraction(1, 2**11) < bound < Fraction(2, 2**11)
    for ok in (1.0, 1.0 + 2.0**-10):
        assert check_values("bound", case, torch.tensor([ok, 0.0], dtype=torch.float16))[0] is None
    off = check_values("bound", case, torch.tensor([1.0 - 2.0**-11, 0.0], dtype=torch.float16))[0]
    assert off is not None and off.index == (0,)


@pytest.mark.clause("difftest-oracles", "fold-order")
@given(cases("exact", ALL_DTYPES, max_workers=8))
def test_exact_oracle_agrees_with_the_independent_ring_fold(case: Case) -> None:
    assert check_values("exact", case, ring_fold(case.tensor()))[0] is None


@pytest.mark.clause("difftest-exact-orders")
@pytest.mark.parametrize("schedule", ["openmpi-ring", "gloo"])
def test_chunk_labels_follow_the_layout_in_force(schedule: str) -> None:
    """Issue #29 item 10: at N = 4, M = 10 (also as M = 5 rows of 2) every element is labelled with its
    chunk under the order's layout, 0 to 3, as the layout's bounds (typed in from the spec) say."""
    bounds = gloo_bounds(4, 10, 4) if schedule == "gloo" else blocks_bounds(4, 10)
    want = [c for c, (lo, hi) in enumerate(bounds) for _ in range(lo, hi)]
    flat = Case(4, 10, (), torch.float32, "contiguous", (0.0,) * 40)
    rows = Case(4, 5, (2,), torch.float32, "contiguous", (0.0,) * 40)
    with checking_against(schedule_order(schedule)):
        assert [locate(flat, e) for e in range(10)] == [((e,), c) for e, c in enumerate(want)]
        assert [locate(rows, e)[1] for e in range(10)] == want
