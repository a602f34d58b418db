"""The oracles on their own.

The bound accepts every summation order and is tight; exact agrees with the independent ring fold.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ring_ref._dtypes import FORMATS
from ring_ref._order import canonical
from ring_ref.difftest import DTYPES, Case
from ring_ref.difftest._inputs import (
    cases,
)
from ring_ref.difftest._oracles import (
    SPEC_ORDER,
    BoundCheck,
    SavedOrder,
    ValueMismatch,
    check_avg_bound,
    check_bound,
    check_prod_bound,
    check_values,
    exact_oracle,
    extreme_oracle,
    flat_of,
    locate,
    order_free_oracle,
    zeros_as_the_oracle_wants,
)
from ring_ref.difftest._orders import schedule_order
from ring_ref.difftest._vocabulary import Mode, Op
from ring_ref.schedule import OPENMPI_RING
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
    layout = schedule_order(schedule).layout
    assert [locate(flat, e, layout) for e in range(10)] == [((e,), c) for e, c in enumerate(want)]
    assert [locate(rows, e, layout)[1] for e in range(10)] == want


# ==========================================================================================================
# What each oracle reports about the first bad element.
#
# The mismatch names the element (its index in the ``(M, ...)`` result and its
# chunk), the expected and the actual value, why it failed and how many
# elements failed; the bound oracle also counts the elements it let pass
# because some order could overflow.  Expected values are worked out by hand
# from small cases whose sums are exact.
# ==========================================================================================================


Oracle = Callable[[Case, torch.Tensor], ValueMismatch | None]

# N = 2 workers of M = 4 rows of 2: worker 0 holds 0 .. 7, worker 1 holds 10 .. 17 (flat),
# so result element e is exactly 10 + 2 e under every order; chunks are rows 0-1 and 2-3.
PAIRS = Case(2, 4, (2,), torch.float32, "contiguous", tuple(float(v) for v in [*range(8), *range(10, 18)]))
RIGHT = torch.tensor([10.0 + 2 * e for e in range(8)]).reshape(4, 2)


def _unit_roundoff_gamma_1(p: int) -> Fraction:
    u = Fraction(1, 2**p)
    return u / (1 - u)


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize(
    ("oracle", "what"),
    [(exact_oracle, "the ring order (fold-order)"), (order_free_oracle, "the exact sum")],
)
def test_a_bitwise_oracle_names_the_first_wrong_element_and_the_count(oracle: Oracle, what: str) -> None:
    assert oracle(PAIRS, RIGHT.clone()) is None
    wrong = RIGHT.clone()
    wrong[2, 1] = -1.0  # flat element 5
    wrong[3, 1] = -0.0  # flat element 7 (its value is 24)
    mismatch = oracle(PAIRS, wrong)
    assert mismatch is not None
    assert (mismatch.index, mismatch.chunk) == ((2, 1), 1)
    assert (mismatch.expected, mismatch.actual) == (20.0, -1.0)
    assert (mismatch.detail, mismatch.count) == (f"not bitwise equal to {what}", 2)
    assert type(mismatch.chunk) is int  # the report's schema types it as an integer


@pytest.mark.clause("difftest-oracles")
def test_a_bitwise_oracle_tells_minus_zero_from_zero() -> None:
    zeros = Case(1, 2, (), torch.float32, "contiguous", (0.0, -0.0))
    mismatch = exact_oracle(zeros, torch.tensor([0.0, 0.0]))
    assert mismatch is not None and (mismatch.index, mismatch.expected, mismatch.count) == ((1,), -0.0, 1)


@pytest.mark.clause("difftest-oracles")
def test_locate_and_flat_of_are_inverse_and_name_the_chunk_by_its_rows() -> None:
    case = Case(2, 6, (2, 3), torch.float32, "contiguous", tuple(0.0 for _ in range(2 * 6 * 6)))
    for e in range(6 * 6):
        index, chunk = locate(case, e)
        assert index == (e // 6, (e // 3) % 2, e % 3)
        assert chunk == e // 6 // 3 and type(chunk) is int
        assert flat_of(case, index) == e


@pytest.mark.clause("difftest-oracles")
def test_bound_names_the_first_element_out_of_bound_with_its_distance_and_the_bound() -> None:
    case = Case(2, 4, (), torch.float32, "contiguous", (1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0))
    checked = check_bound(case, [3.0, 3.0, 3.0, 7.0])
    assert checked.overflow_skipped == 0
    mismatch = checked.mismatch
    assert mismatch is not None
    assert (mismatch.index, mismatch.chunk, mismatch.expected, mismatch.actual, mismatch.count) == (
        (3,),
        1,
        3.0,
        7.0,
        1,
    )
    bound = float(_unit_roundoff_gamma_1(24) * 3)
    assert mismatch.detail == f"|actual - exact| = 4 > gamma_1 * sum|x_i| = {bound:.6g}"
    assert type(mismatch.chunk) is int


@pytest.mark.clause("difftest-oracles")
def test_bound_counts_every_bad_element_and_words_an_impossible_infinity() -> None:
    case = Case(2, 2, (), torch.float16, "contiguous", (1.0, -3.0, 2.0, 1.0))
    checked = check_bound(case, [float("inf"), 0.0])
    mismatch = checked.mismatch
    assert mismatch is not None and mismatch.count == 2
    bound = float(_unit_roundoff_gamma_1(11) * 3)
    assert mismatch.detail == (
        f"|actual - exact| must be <= gamma_1 * sum|x_i| = {bound:.6g} (exact sum 3.0); "
        "no summation order can overflow here"
    )
    assert (mismatch.expected, mismatch.actual) == (3.0, float("inf"))


@pytest.mark.clause("difftest-oracles")
def test_bound_counts_each_element_it_lets_overflow() -> None:
    case = Case(2, 3, (), torch.float16, "contiguous", (65504.0, 65504.0, 1.0, 65504.0, 65504.0, 1.0))
    checked = check_bound(case, [float("inf"), float("inf"), 2.0])
    assert (checked.mismatch, checked.overflow_skipped) == (None, 2)


@pytest.mark.clause("difftest-oracles")
def test_check_values_runs_the_modes_own_oracle_and_counts_no_overflow_for_bitwise_modes() -> None:
    """``1 + (-1)`` is exactly 0; ``2**-30`` there is within the bound (gamma_1 * 2) but not the same bits."""
    cancelling = Case(2, 2, (), torch.float32, "contiguous", (1.0, 2.0, -1.0, 2.0))
    right, close = torch.tensor([0.0, 4.0]), torch.tensor([2.0**-30, 4.0])
    for mode in ("exact", "order-free"):
        assert check_values(mode, cancelling, right) == (None, 0, 0)
        mismatch, skipped, _ = check_values(mode, cancelling, close)
        assert mismatch is not None and mismatch.index == (0,) and skipped == 0, mode
    assert check_values("bound", cancelling, close) == (None, 0, 0)


# ==========================================================================================================
# The oracles of the other ops (``prod``, ``avg``, ``max``, ``min``) on small cases worked out by hand.
#
# Fast (no target is run), so that ``make mutation`` can run it for each
# mutant of ``ring_ref.difftest._oracles``.  Bounds are recomputed here in
# rational arithmetic from the formats' parameters (float16: p = 11, emin =
# -14, emax = 15), never taken from the code under test.
# ==========================================================================================================


F16, F32, F64 = torch.float16, torch.float32, torch.float64
U16 = Fraction(1, 2**11)
INF, NAN = math.inf, math.nan


def gamma(k: int, u: Fraction = U16) -> Fraction:
    return k * u / (1 - k * u)


def case(n: int, dtype: torch.dtype, op: Op, *workers: list[float]) -> Case:
    """Worker ``i`` holds ``workers[i]`` (``M`` = its length, no trailing dimensions)."""
    assert len(workers) == n
    return Case(n, len(workers[0]), (), dtype, "contiguous", tuple(v for w in workers for v in w), op)


def same(a: float, b: float) -> bool:
    return (a == b and math.copysign(1.0, a) == math.copysign(1.0, b)) or (math.isnan(a) and math.isnan(b))


def verdict(checked: BoundCheck) -> tuple[ValueMismatch | None, int, int]:
    return checked.mismatch, checked.overflow_skipped, checked.underflow_skipped


def column_case(xs: list[float], dtype: torch.dtype, op: Op) -> Case:
    """``N = len(xs)`` workers, ``M = N`` rows: worker ``i`` holds ``xs[i]`` in every row."""
    return case(len(xs), dtype, op, *[[x] * len(xs) for x in xs])


def result(values: list[float], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(dtype)


# --- order-free prod and avg ---------------------------------------------------------------------------


@pytest.mark.clause("difftest-ops")
def test_order_free_prod_is_the_exact_product_with_the_sign_of_the_signs() -> None:
    c = case(2, F16, "prod", [2.0, -0.5, -2.0, 0.0], [4.0, -0.0, 0.25, -4.0])
    assert check_values("order-free", c, result([8.0, 0.0, -0.5, -0.0], F16)) == (None, 0, 0)
    mismatch, _, _ = check_values("order-free", c, result([8.0, -0.0, 0.5, -0.0], F16))
    assert mismatch is not None
    assert (mismatch.index, mismatch.chunk, mismatch.count) == ((1,), 0, 2)
    assert same(mismatch.expected, 0.0) and same(mismatch.actual, -0.0)
    assert mismatch.detail == "not bitwise equal to the exact product"


@pytest.mark.clause("difftest-ops")
def test_order_free_prod_holds_products_beyond_float32_in_float64() -> None:
    c = case(2, F64, "prod", [2.0**150, 2.0**-100], [2.0**100, 2.0**-60])
    assert check_values("order-free", c, result([2.0**250, 2.0**-160], F64)) == (None, 0, 0)


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize(
    ("xs", "rounds"),
    [
        ([2.0**8, 2.0**7], False),  # 2**15: emax
        ([2.0**8, 2.0**8], True),
        ([2.0**-12, 2.0**-12], False),  # 2**-24: the smallest subnormal
        ([2.0**-13, 2.0**-12], True),
        ([1.0, 2.0**-12, 2.0**-12], False),
        ([2.0**-12, 2.0**-12, 2.0], False),
        ([0.5, 2.0**15, 2.0**1], True),  # 2**15 * 2 in some order
        ([2.0**-13, 2.0**-12, 2.0**2], True),  # 2**-25 in some order, whatever comes last
        ([3.0, 2.0], True),  # not a power of two
        ([0.0, 3.0], True),
    ],
)
def test_order_free_prod_refuses_inputs_whose_product_rounds(xs: list[float], rounds: bool) -> None:
    c = column_case(xs, F16, "prod")
    want = [float(math.prod(Fraction(x) for x in xs))] * len(xs)
    if rounds:
        with pytest.raises(AssertionError, match=r"^order-free generator produced a product that rounds; "):
            check_values("order-free", c, result(want, F16))
    else:
        assert check_values("order-free", c, result(want, F16)) == (None, 0, 0)


@pytest.mark.clause("difftest-ops")
def test_order_free_avg_is_the_exact_sum_divided_by_n_rounded_once() -> None:
    third = float(torch.tensor(1 / 3, dtype=F64).to(F16))
    c = case(3, F16, "avg", [1.0, 2.0, -4.0], [0.0, 2.0, 0.0], [0.0, 2.0, 1.0])
    assert check_values("order-free", c, result([third, 2.0, -1.0], F16)) == (None, 0, 0)
    mismatch, _, _ = check_values("order-free", c, result([third, 2.0, -3.0 / 3.0 - 2.0**-10], F16))
    assert mismatch is not None and (mismatch.index, mismatch.chunk, mismatch.expected) == ((2,), 2, -1.0)
    assert mismatch.detail == "not bitwise equal to the exact sum divided by N, rounded once"
    in_doubles = column_case([1.0, 0.0, 0.0], F64, "avg")
    assert check_values("order-free", in_doubles, result([1 / 3] * 3, F64)) == (None, 0, 0)
    rounding = column_case([2048.0, 1.0], F16, "avg")
    with pytest.raises(AssertionError, match=r"^order-free generator produced a sum that rounds; "):
        check_values("order-free", rounding, result([1024.0] * 2, F16))


# --- max and min -----------------------------------------------------------------------------------------


@pytest.mark.clause("difftest-ops")
def test_max_and_min_accept_any_input_equal_to_the_extreme_bit_for_bit() -> None:
    workers = ([1.0, -0.0, 5.0], [2.0, 0.0, 5.0], [-1.0, 0.0, -7.0])
    extremes: list[tuple[Op, list[float]]] = [("max", [2.0, 0.0, 5.0]), ("min", [-1.0, 0.0, -7.0])]
    for op, right in extremes:
        c = case(3, F32, op, *workers)
        for zero in (0.0, -0.0):
            got = [right[0], zero, right[2]]
            for mode in ("order-free", "bound"):
                assert check_values(mode, c, result(got, F32)) == (None, 0, 0), (op, zero)


@pytest.mark.clause("difftest-ops")
def test_a_wrong_extreme_is_named_with_its_holders() -> None:
    c = case(3, F32, "max", [1.0, -0.0, 5.0], [2.0, 0.0, 5.0], [-1.0, 0.0, -7.0])
    mismatch = extreme_oracle(c, result([2.0, 1.0, -7.0], F32))
    assert mismatch is not None
    assert (mismatch.index, mismatch.chunk, mismatch.expected, mismatch.actual, mismatch.count) == (
        (1,),
        1,
        -0.0,
        1.0,
        2,
    )
    assert mismatch.detail == "not the maximum of the workers' values there (-0.0 or 0.0)"
    first = extreme_oracle(c, result([1.0, 0.0, 5.0], F32))
    assert first is not None and (first.index, first.expected, first.count) == ((0,), 2.0, 1)
    assert first.detail == "not the maximum of the workers' values there (2.0)"
    low = case(3, F32, "min", [1.0, -0.0, 5.0], [2.0, 0.0, 5.0], [-1.0, 0.0, -7.0])
    mismatch = extreme_oracle(low, result([-1.0, 0.0, 5.0], F32))
    assert mismatch is not None and (mismatch.index, mismatch.chunk, mismatch.count) == ((2,), 2, 1)
    assert (mismatch.expected, mismatch.detail) == (
        -7.0,
        "not the minimum of the workers' values there (-7.0)",
    )


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize(("op", "which"), [("max", "maximum"), ("min", "minimum")])
def test_a_zero_of_a_sign_nobody_holds_is_named_so(op: Op, which: str) -> None:
    c = case(2, F32, op, [0.0, 3.0], [0.0, 3.0])
    mismatch = extreme_oracle(c, result([-0.0, 3.0], F32))
    assert mismatch is not None and mismatch.index == (0,) and same(mismatch.actual, -0.0)
    assert mismatch.detail == f"a zero of a sign no worker holds with the {which} there (the {which} is 0.0)"


@pytest.mark.clause("difftest-ops")
def test_exact_max_wants_the_rings_zero_the_other_modes_either() -> None:
    c = case(2, F32, "max", [0.0, -0.0], [-0.0, 0.0])
    zeros = [[a, b] for a in (0.0, -0.0) for b in (0.0, -0.0)]  # the four pairs of signed zeros

    def passing(mode: Mode) -> int:
        return sum(check_values(mode, c, result(pair, F32)).mismatch is None for pair in zeros)

    assert (passing("exact"), passing("order-free"), passing("bound")) == (1, 4, 4)


# --- the avg bound ---------------------------------------------------------------------------------------


def avg_room(
    n: int, s: Fraction, a: Fraction, u: Fraction = U16, eta: Fraction = Fraction(1, 2**25)
) -> Fraction:
    g = gamma(n - 1, u)
    return g * a / n + (0 if n == 1 else max(u * (abs(s) + g * a) / n, eta))


@pytest.mark.clause("difftest-ops")
def test_the_avg_bound_is_the_sums_bound_over_n_and_one_rounding() -> None:
    c = case(2, F16, "avg", [1.0, 65504.0], [2.0, 65504.0])
    room = avg_room(2, Fraction(3), Fraction(3))
    assert Fraction(2**-10) <= room < Fraction(2**-9)
    assert verdict(check_avg_bound(c, [1.5 + 2**-10, INF])) == (None, 1, 0)
    assert check_values("bound", c, result([1.5 - 2**-10, INF], F16)) == (None, 1, 0)
    checked = check_avg_bound(c, [1.5 + 2**-9, 65504.0])
    mismatch = checked.mismatch
    assert mismatch is not None and checked.overflow_skipped == 0
    assert (mismatch.index, mismatch.chunk, mismatch.expected, mismatch.actual, mismatch.count) == (
        (0,),
        0,
        1.5,
        1.5 + 2**-9,
        1,
    )
    bound = f"gamma_1 * sum|x_i| / N + one rounding of the quotient = {float(room):.6g}"
    assert mismatch.detail == f"|actual - exact average| = {2**-9:.6g} > {bound}"


@pytest.mark.clause("difftest-ops")
def test_an_impossible_infinite_average_is_named_and_counted() -> None:
    c = case(2, F16, "avg", [1.0, 2.0], [2.0, 3.0])
    mismatch = check_avg_bound(c, [INF, -INF]).mismatch
    assert mismatch is not None and mismatch.count == 2 and mismatch.expected == 1.5
    room = avg_room(2, Fraction(3), Fraction(3))
    assert mismatch.detail == (
        f"|actual - exact average| must be <= gamma_1 * sum|x_i| / N + one rounding of the quotient = "
        f"{float(room):.6g} (exact average 1.5); no summation order can overflow here"
    )


@pytest.mark.clause("difftest-ops")
def test_one_workers_average_is_its_value_exactly_and_never_overflows() -> None:
    c = case(1, F16, "avg", [1.0, 65504.0])
    assert verdict(check_avg_bound(c, [1.0, 65504.0])) == (None, 0, 0)
    below_one = 1.0 - 2.0**-11  # one unit roundoff below: within u |s|, still not exact
    assert check_avg_bound(c, [below_one, 65504.0]).mismatch is not None
    assert check_avg_bound(c, [1.0, INF]).mismatch is not None


@pytest.mark.clause("difftest-ops")
def test_the_avg_bound_allows_half_the_smallest_subnormal_for_a_tiny_quotient() -> None:
    tiny = 2.0**-24  # float16's smallest subnormal
    c = column_case([tiny, 0.0], F16, "avg")  # exact average 2**-25, half way between 0 and tiny
    assert verdict(check_avg_bound(c, [0.0, tiny])) == (None, 0, 0)
    assert check_avg_bound(c, [0.0, 2 * tiny]).mismatch is not None


@pytest.mark.clause("difftest-ops")
def test_the_avg_bound_of_many_workers_in_float32() -> None:
    c = column_case([1.0, 2.0, 4.0, -8.0], F32, "avg")  # S = -1, A = 15
    u = Fraction(1, 2**24)
    room = avg_room(4, Fraction(-1), Fraction(15), u, Fraction(1, 2**150))
    inside = float(Fraction(-1, 4) + room * Fraction(9, 10))
    outside = float(Fraction(-1, 4) - room * Fraction(11, 10))
    assert verdict(check_avg_bound(c, [inside] * 4)) == (None, 0, 0)
    assert check_avg_bound(c, [inside, inside, outside, inside]).mismatch is not None


# --- the prod bound ---------------------------------------------------------------------------------------


PROD_ELEMENTS = [
    # (inputs, result, verdict: "ok", "overflow", "underflow" or the start of the reason it is bad)
    ([0.0, 256.0, 256.0], NAN, "overflow"),  # inf * 0 where 256 * 256 could overflow
    ([0.0, 16.0, 16.0], NAN, "NaN where no order can multiply an infinity by zero"),
    ([2.0, 3.0], NAN, "NaN where no order"),
    ([2.0, -3.0], 6.0, "the sign of a product is the exclusive or of the signs: - here"),
    ([-2.0, -3.0], -6.0, "the sign of a product is the exclusive or of the signs: + here"),
    ([-0.0, 3.0], 0.0, "the sign of a product is the exclusive or of the signs: - here"),
    ([-0.0, -3.0], 0.0, "ok"),
    ([0.0, 3.0], 1.0, "an input is zero, so every order gives a zero (or NaN after an overflow)"),
    ([256.0, 256.0], INF, "overflow"),
    ([-256.0, 256.0], -INF, "overflow"),
    ([128.0, 256.0], INF, "infinite, and no order can overflow here"),
    ([2.0**-8, 2.0**-8], 0.0, "underflow"),
    ([2.0**-8, 2.0**-6], 2.0**-14, "ok"),  # 2**-14: the smallest normal, no underflow
    ([2.0**-5, 2.0**-5, 2.0**-5, 4.0], 2.0**-13, "underflow"),
    ([2.0**-5, 2.0**-5, 2.0, 4.0], 2.0**-7, "ok"),
    ([64.0, 64.0, 16.0, 0.5], INF, "overflow"),
    ([64.0, 64.0, 0.5, 0.5], INF, "infinite"),
    ([3.0, 5.0], 15.0, "ok"),
    ([3.0, 5.0], 15.0 + 2.0**-7, "|actual - exact| = 0.0078125 > gamma_1 * |P| = "),
    ([2047.0, 1.0], 2046.0, "ok"),  # distance 1 = gamma_1 * 2047 exactly
    ([2047.0, -1.0], -2048.0, "ok"),
]


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize(("xs", "y", "expected"), PROD_ELEMENTS)
def test_each_rule_of_the_prod_bound(xs: list[float], y: float, expected: str) -> None:
    n = len(xs)
    checked = check_prod_bound(column_case(xs, F16, "prod"), [y] * n)
    assert (checked.overflow_skipped, checked.underflow_skipped) == (
        n * (expected == "overflow"),
        n * (expected == "underflow"),
    )
    if expected in ("ok", "overflow", "underflow"):
        assert checked.mismatch is None
        return
    mismatch = checked.mismatch
    assert mismatch is not None
    assert mismatch.detail.startswith(expected), mismatch.detail
    negative = sum(math.copysign(1.0, x) < 0 for x in xs) % 2 == 1  # IEEE 754: the sign of the signs
    assert same(
        mismatch.expected, math.copysign(float(math.prod(Fraction(x) for x in xs)), -1 if negative else 1)
    )
    assert same(mismatch.actual, y) and mismatch.count == n and mismatch.index == (0,)


@pytest.mark.clause("difftest-ops")
def test_the_prod_bound_is_gamma_of_the_exact_product() -> None:
    c = column_case([3.0, 5.0], F16, "prod")
    mismatch = check_prod_bound(c, [15.0, 15.0 + 2.0**-7]).mismatch
    assert mismatch is not None and mismatch.expected == 15.0
    assert mismatch.detail == f"|actual - exact| = 0.0078125 > gamma_1 * |P| = {float(gamma(1) * 15):.6g}"
    three = column_case([3.0, 5.0, 1.0], F16, "prod")
    assert verdict(check_prod_bound(three, [15.0 + 2.0**-7] * 3)) == (None, 0, 0)  # gamma_2 * 15 > 2**-7


@pytest.mark.clause("difftest-ops")
def test_the_prod_bound_counts_and_names_the_first_bad_element() -> None:
    c = case(2, F16, "prod", [256.0, 2.0**-8, 1.0, -2.0, 3.0, 0.0], [256.0, 2.0**-8, 1.0, 5.0, -1.0, -1.0])
    checked = check_prod_bound(c, [INF, 0.0, 1.0, 10.0, 3.0, 0.0])  # chunks: elements 0 .. 2, 3 .. 5
    assert (checked.overflow_skipped, checked.underflow_skipped) == (1, 1)
    mismatch = checked.mismatch
    assert mismatch is not None and (mismatch.index, mismatch.chunk, mismatch.count) == ((3,), 1, 3)
    assert (mismatch.expected, mismatch.actual) == (-10.0, 10.0)
    assert check_values("bound", c, result([INF, 0.0, 1.0, -10.0, -3.0, -0.0], F16)) == (None, 1, 1)


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize(("op", "mode"), [("prod", "bound"), ("avg", "bound"), ("sum", "bound")])
def test_check_values_takes_each_ops_own_bound(op: Op, mode: Mode) -> None:
    c = column_case([3.0, 5.0], F16, op)
    for value, wanted in ((15.0, "prod"), (4.0, "avg"), (8.0, "sum")):
        assert (check_values(mode, c, result([value] * 2, F16)).mismatch is None) == (wanted == op), value


# --- zeros as the oracle wants ---------------------------------------------------------------------------


def signs(t: torch.Tensor) -> list[tuple[float, bool]]:
    return [(float(v), math.copysign(1.0, float(v)) < 0) for v in t.reshape(-1).tolist()]


@pytest.mark.clause("difftest-ops")
def test_exact_gives_each_zero_the_rings_sign_where_the_ring_has_a_zero() -> None:
    c = case(2, F32, "sum", [-0.0, 1.0, -0.0, 2.0], [-0.0, -1.0, 3.0, 0.0])  # ring: -0, +0, 3, 2
    fixed = zeros_as_the_oracle_wants("exact", c, result([0.0, -0.0, 0.0, 5.0], F32))
    assert fixed is not None and fixed.shape == (4,)
    assert signs(fixed) == [(0.0, True), (0.0, False), (0.0, False), (5.0, False)]


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("mode", ["order-free", "bound"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_sum_and_avg_have_no_zero_of_their_own_outside_exact(mode: Mode, op: Op) -> None:
    assert zeros_as_the_oracle_wants(mode, case(2, F32, op, [0.0], [-0.0]), result([0.0], F32)) is None


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("mode", ["order-free", "bound"])
def test_prod_zeros_get_the_sign_of_the_signs_where_an_input_is_zero(mode: Mode) -> None:
    c = case(2, F16, "prod", [3.0, -0.0, 0.0, 1.0, 2.0**-8, -0.0], [0.0, 2.0, -2.0, -2.0, -(2.0**-8), -3.0])
    fixed = zeros_as_the_oracle_wants(mode, c, result([4.0, 0.0, 0.0, 0.0, 0.0, -0.0], F16))
    assert fixed is not None
    # not a zero: left; an input zero: the sign of the signs; no input zero (an underflow): left as it is
    assert signs(fixed) == [(4.0, False), (0.0, True), (0.0, True), (0.0, False), (0.0, False), (0.0, False)]


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("mode", ["order-free", "bound"])
@pytest.mark.parametrize(("op", "wanted"), [("max", [True, False, True]), ("min", [False, False, True])])
def test_max_and_min_zeros_get_the_first_zero_where_the_extreme_is_zero(
    mode: Mode, op: Op, wanted: list[bool]
) -> None:
    c = case(2, F32, op, [-0.0, 0.0, -1.0], [-1.0, -0.0, 1.0])
    # max: -0 (its first zero), +0 (its first zero), 1 (not a zero: left); min: -1 (left), +0, -1 (left)
    fixed = zeros_as_the_oracle_wants(mode, c, result([0.0, -0.0, -0.0], F32))
    assert fixed is not None
    assert [negative for _, negative in signs(fixed)] == wanted


# --- more edges: rounding, thresholds, the check_values dispatch, result lengths ---------------------------


@pytest.mark.clause("difftest-ops")
def test_check_values_catches_a_wrong_max_or_min_in_order_free_and_bound() -> None:
    for op in ("max", "min"):
        c = column_case([1.0, -3.0], F32, op)
        for mode in ("order-free", "bound"):
            mismatch = check_values(mode, c, result([7.0, 7.0], F32)).mismatch
            assert mismatch is not None and mismatch.count == 2, (op, mode)


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize(
    ("q", "want"),
    [
        (Fraction(1) + Fraction(2, 5) * Fraction(1, 1024), 1.0),  # below half an ulp: down
        (Fraction(1) + Fraction(1, 2) * Fraction(1, 1024), 1.0),  # a tie to the even 1.0
        (Fraction(1) + Fraction(3, 2) * Fraction(1, 1024), 1.0 + 2 * 2**-10),  # a tie to the even 1 + 2 ulp
        (Fraction(1) + Fraction(5, 2) * Fraction(1, 1024), 1.0 + 2 * 2**-10),
        (Fraction(1) + Fraction(3, 5) * Fraction(1, 1024), 1.0 + 2**-10),  # above half an ulp: up
        (-(Fraction(1) + Fraction(3, 5) * Fraction(1, 1024)), -(1.0 + 2**-10)),
        (Fraction(65504), 65504.0),  # the largest finite float16 stays finite
        (Fraction(65519), 65504.0),
        (Fraction(65520), INF),
        (Fraction(-65520), -INF),
        (Fraction(3, 2**26), 2.0**-24),  # subnormal: 1.5 of the smallest spacing rounds to even 2 * 2**-25
        (Fraction(1, 2**26), 0.0),
    ],
)
def test_round_to_rounds_to_nearest_ties_to_even(q: Fraction, want: float) -> None:
    from ring_ref._dtypes import FORMATS
    from ring_ref.difftest._oracles import round_to

    assert same(round_to(FORMATS["float16"], q), want)


@pytest.mark.clause("difftest-ops")
def test_round_to_gives_a_zero_the_sign_asked_for() -> None:
    from ring_ref._dtypes import FORMATS
    from ring_ref.difftest._oracles import round_to

    fmt = FORMATS["float16"]
    assert same(round_to(fmt, Fraction(0)), 0.0)
    assert same(round_to(fmt, Fraction(0), negative_zero=True), -0.0)
    assert same(round_to(fmt, Fraction(0), negative_zero=False), 0.0)


@pytest.mark.clause("difftest-ops")
def test_an_average_of_zero_is_a_positive_zero_in_order_free() -> None:
    c = column_case([1.0, -1.0], F16, "avg")
    assert check_values("order-free", c, result([0.0, 0.0], F16)) == (None, 0, 0)
    assert check_values("order-free", c, result([-0.0, 0.0], F16)).mismatch is not None


@pytest.mark.clause("difftest-ops")
def test_an_order_free_sum_is_exact_in_double_precision() -> None:
    c = column_case([1.0, 2.0**-40], F64, "sum")
    assert check_values("order-free", c, result([1.0 + 2.0**-40] * 2, F64)) == (None, 0, 0)


@pytest.mark.clause("difftest-ops")
def test_an_overflowing_report_value_is_an_infinity_of_its_sign() -> None:
    for sign in (1.0, -1.0):
        c = column_case([sign * 1.5e308, sign * 1.5e308], F64, "sum")
        from ring_ref.difftest._oracles import check_bound

        mismatch = check_bound(c, [0.0, 0.0]).mismatch
        assert mismatch is not None and mismatch.expected == sign * INF


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize(
    ("xs", "verdict_"),
    [
        ([32768.0, 32736.0], "bad"),  # sum|x| = 65504: no order of two overflows
        ([65504.0, 16.0], "overflow"),  # 65520: exactly the threshold
        ([32768.0, 32720.0, 2.0], "overflow"),  # (1 + gamma_1) 65490 >= 65520
        ([32768.0, 32704.0, 8.0], "bad"),  # (1 + gamma_1) 65480 < 65520
    ],
)
def test_an_infinite_average_is_accepted_exactly_where_an_order_could_overflow(
    xs: list[float], verdict_: str
) -> None:
    checked = check_avg_bound(column_case(xs, F16, "avg"), [INF] * len(xs))
    if verdict_ == "overflow":
        assert verdict(checked) == (None, len(xs), 0)
    else:
        assert checked.mismatch is not None and checked.mismatch.count == len(xs)


MORE_PROD_ELEMENTS = [
    ([2.0**-13, 0.25], 0.0, "underflow"),  # the two smallest: 2**-15
    ([2.0**-7, 1.5 * 2.0**-8, 1.5], 0.0, "underflow"),  # 0.75 * 2**-14: 1.5 (>= 1) is not taken
    ([512.0, 128.0], INF, "overflow"),  # the two largest: 65536
    ([256.0, 128.0, 2.0], INF, "overflow"),  # 2 (> 1) is taken: 65536
    ([-1.0, -2.0, -4.0], -8.0, "ok"),  # three signs: negative
    ([-1.0, -2.0, -4.0], 8.0, "the sign of a product"),
    ([2.0**-7, 2.0**-7, 1.0], 0.0, "underflow"),  # 2**-14 (1 - gamma_1) is below the smallest normal
    ([1.0, 2.0**-20], 0.0, "underflow"),  # 1.0 is an input like any other
    ([48.0, 1365.0], INF, "overflow"),  # exactly 65520
    ([3.0], INF, "infinite, and no order can overflow here"),
    ([0.0, 3.0], NAN, "NaN where no order"),
]


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize(("xs", "y", "expected"), MORE_PROD_ELEMENTS)
def test_more_edges_of_the_prod_bound(xs: list[float], y: float, expected: str) -> None:
    test_each_rule_of_the_prod_bound(xs, y, expected)


@pytest.mark.clause("difftest-ops")
def test_a_result_of_another_length_is_refused() -> None:
    from ring_ref.difftest._oracles import check_bound

    for op, check in (("sum", check_bound), ("avg", check_avg_bound), ("prod", check_prod_bound)):
        c = column_case([1.0, 2.0], F32, op)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="zip"):
            check(c, [3.0])
    for op in ("max", "min"):
        with pytest.raises(ValueError, match="zip"):
            extreme_oracle(column_case([1.0, 2.0], F32, op), result([2.0], F32))  # type: ignore[arg-type]


# --- the trees and sizes the order probes are designed from ------------------------------------------


def test_an_orders_trees_follow_its_preset_below_n_and_its_file_at_its_own_inputs_only() -> None:
    named = replace(SPEC_ORDER, ring=OPENMPI_RING, preset="openmpi-ring")
    doubling = ((0, 1), (2, 3))  # N = 4: (x0 + x1) + (x2 + x3), OpenMPI's ring below 4 elements
    assert named.trees(4, 3, torch.float32) == [doubling] * 3
    # the ring itself from N elements on (chunk c folds c, c+1, ...), and at every size as a value
    folds = [(((c, (c + 1) % 4), (c + 2) % 4), (c + 3) % 4) for c in range(4)]
    assert named.trees(4, 4, torch.float32) == replace(named, preset=None).trees(4, 4, torch.float32)
    assert [canonical(t) for t in replace(named, preset=None).trees(4, 4, torch.float32) or []] == [
        canonical(t) for t in folds
    ]
    assert replace(named, preset=None).trees(4, 3, torch.float32) != [doubling] * 3
    saved = SavedOrder(3, 2, torch.float32, [((0, 1), 2), ((1, 2), 0)], "blocks")
    from_file = replace(SPEC_ORDER, ring=None, saved=saved)
    assert from_file.trees(3, 2, torch.float32) == saved.trees
    assert from_file.trees(3, 2, torch.float64) is None and from_file.trees(4, 2, torch.float32) is None
    assert replace(SPEC_ORDER, ring=None).trees(3, 2, torch.float32) is None  # neither ring nor file
    assert from_file.probe_sizes(3) == (2,) and from_file.probe_sizes(4) == ()


def test_the_probe_sizes_add_n_minus_1_for_a_library_ring_from_two_workers_on() -> None:
    named = replace(SPEC_ORDER, ring=OPENMPI_RING, preset="openmpi-ring")
    assert named.probe_sizes(2) == (4, 3, 1)  # 2N, 2N - 1 (blocks take any M), N - 1
    assert named.probe_sizes(1) == (2, 1)  # one worker: no size below it
    assert SPEC_ORDER.probe_sizes(2) == (4,)  # at two workers every chunk folds alike: no layout sizes
