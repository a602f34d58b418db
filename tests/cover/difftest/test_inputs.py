"""Inputs: generated cases are valid ring inputs in their layout.

Order-free values sum exactly in every summation order.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ring_ref.difftest import DTYPES, Case
from ring_ref.difftest._inputs import (
    LAYOUTS,
    MAX_NUMEL,
    ORDER_FREE_EXPONENTS,
    cases,
    one_worker_cases,
    order_free_k_bound,
    uneven_cases,
)
from ring_ref.difftest._vocabulary import Mode, Op
from tests.common.oracles import exact_sum, fold, sums_in_several_orders
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())


@pytest.mark.clause("difftest-oracles")
@given(cases("bound", ALL_DTYPES, max_workers=6))
def test_generated_cases_are_valid_ring_inputs_in_their_layout(case: Case) -> None:
    x = case.tensor()
    assert tuple(x.shape) == case.shape and case.m % case.n == 0 and 0 <= len(case.trailing) <= 3
    assert x.dtype == case.dtype and case.layout in LAYOUTS
    assert bool(torch.isfinite(x).all())
    assert x.to(torch.float64).reshape(-1).tolist() == list(case.values)
    if case.layout in ("strided", "sliced"):
        # A view into a larger buffer (torch calls degenerate shapes such as (1, 2) contiguous anyway).
        assert x.untyped_storage().nbytes() > x.numel() * x.element_size()
    if case.layout == "transposed" and case.n > 1:
        assert not x.is_contiguous() and x.stride(0) < x.stride(1)


@pytest.mark.clause("difftest-oracles")
def test_one_worker_cases_cover_every_requested_dtype_contiguous_and_not() -> None:
    for mode in ("exact", "order-free", "bound"):
        got = one_worker_cases(mode, ALL_DTYPES)
        assert all(c.n == 1 for c in got)
        for dtype in ALL_DTYPES:
            contiguous = sorted(c.tensor().is_contiguous() for c in got if c.dtype == dtype)
            assert contiguous == [False, True], (mode, dtype)


@pytest.mark.clause("difftest-oracles")
@given(cases("order-free", ALL_DTYPES), st.randoms(use_true_random=False))
def test_order_free_inputs_sum_exactly_in_every_order(case: Case, rnd: random.Random) -> None:
    x = case.tensor()
    exact = exact_sum(x)
    for total in sums_in_several_orders(x, rnd):
        assert [Fraction(v) for v in total.to(torch.float64).reshape(-1).tolist()] == exact


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_order_free_extremes_sum_exactly_with_sixteen_workers(dtype: torch.dtype) -> None:
    # The largest |k| and the largest and smallest shared exponent, all one sign: every
    # prefix of the fold reaches |K| = 16 * floor(2**p / 16), the worst partial sum.
    k = order_free_k_bound(dtype, 16)
    for e in ORDER_FREE_EXPONENTS:
        x = torch.full((16, 16), float(k) * 2.0**e, dtype=torch.float64).to(dtype)
        assert torch.equal(x.to(torch.float64), torch.full((16, 16), float(k) * 2.0**e, dtype=torch.float64))
        for prefix in range(1, 17):
            assert float(fold([x[i] for i in range(prefix)])[0]) == prefix * k * 2.0**e, (dtype, e, prefix)


@pytest.mark.clause("difftest-exact-orders")
@pytest.mark.parametrize(
    ("mode", "op"), [("exact", None), ("order-free", None), ("bound", "max"), ("bound", "prod")]
)
def test_a_layout_that_takes_any_m_draws_m_not_divisible_by_n(mode: Mode, op: Op | None) -> None:
    """Issue #29 item 2: with ``any_m`` the search draws M not divisible by N, M < N among them, beside
    even M; the explicit cases run first have both too."""
    shapes: list[tuple[int, int]] = []

    @settings(derandomize=True, database=None, max_examples=150, deadline=None)
    @given(cases(mode, ALL_DTYPES, 6, op=op, any_m=True))
    def collect(case: Case) -> None:
        assert case.tensor().numel() <= MAX_NUMEL and 1 <= case.n <= 6
        shapes.append((case.n, case.m))

    collect()
    assert any(m % n and m > n for n, m in shapes) and any(m < n for n, m in shapes)
    assert any(m % n == 0 and n > 1 for n, m in shapes)
    first = [(c.n, c.m) for c in uneven_cases(mode, ALL_DTYPES, 6, op=op)]
    assert first and all(m % n for n, m in first) and any(m < n for n, m in first)
    assert [(c.n, c.m) for c in uneven_cases(mode, ALL_DTYPES, 2, op=op)] == [(2, 3)]
