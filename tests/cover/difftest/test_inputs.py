"""Inputs: generated cases are valid ring inputs in their layout.

Order-free values sum exactly in every summation order.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ring_ref.difftest import DTYPES, Case
from ring_ref.difftest._inputs import (
    LAYOUTS,
    MAX_NUMEL,
    ORDER_FREE_EXPONENTS,
    TIES,
    _in_dtype,
    _near_one,
    _pow2,
    _random_floats,
    cases,
    lay_out,
    near_one_log_bound,
    one_worker_cases,
    order_free_k_bound,
    order_free_values,
    probe_cases,
    prod_exponent_bound,
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


# ==========================================================================================================
# The tester's inputs (``ring_ref.difftest._inputs``): cases, layouts, value generators and probes.
#
# Fast, so that ``make mutation`` can run it for each mutant of the module.
# The formats' parameters are written out here (IEEE 754 binary16, bfloat16,
# binary32, binary64); the generators are checked against what their
# docstrings promise, over many draws from fixed seeds (so every run draws the
# same values), and the ``cases`` strategy with derandomized Hypothesis runs.
# ==========================================================================================================


F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
FLOAT_DTYPES = (F16, BF16, F32, F64)
# precision p (significand bits, the implicit one included), emin, emax, largest finite value
FORMAT = {
    F16: (11, -14, 15, 65504.0),
    BF16: (8, -126, 127, float((2 - Fraction(1, 2**7)) * 2**127)),
    F32: (24, -126, 127, float((2 - Fraction(1, 2**23)) * 2**127)),
    F64: (53, -1022, 1023, float((2 - Fraction(1, 2**52)) * 2**1023)),
}
DERANDOMIZED = settings(
    derandomize=True, database=None, max_examples=15, deadline=None, suppress_health_check=list(HealthCheck)
)


def negative(v: float) -> bool:
    return math.copysign(1.0, v) < 0


def representable(v: float, dtype: torch.dtype) -> bool:
    return float(torch.tensor(v, dtype=F64).to(dtype).to(F64)) == v


def power_of_two_exponent(v: float) -> int | None:
    mantissa, exponent = math.frexp(abs(v))
    return exponent - 1 if mantissa == 0.5 else None


# --- Case and layouts ----------------------------------------------------------------------------------


@pytest.mark.clause("difftest-ops")
def test_a_case_knows_its_op_shape_and_json() -> None:
    c = Case(2, 2, (3,), F16, "contiguous", tuple(float(v) for v in range(12)), "max")
    assert (c.reduction, c.shape) == ("max", (2, 2, 3))
    assert Case(2, 2, (), F16, "contiguous", (1.0, 2.0, 3.0, 4.0)).reduction == "sum"
    assert c.to_json() == {
        "n": 2,
        "m": 2,
        "shape": [2, 2, 3],
        "dtype": "float16",
        "layout": "contiguous",
        "op": "max",
        "input": [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]],
    }


@pytest.mark.clause("difftest-ops")
def test_a_rank_tensor_and_the_json_keep_float64_values_exactly() -> None:
    third = 1 / 3
    c = Case(2, 2, (), F64, "contiguous", (third, 0.1, -third, 1e300))
    assert c.rank_tensor(0).tolist() == [third, 0.1] and c.rank_tensor(1).tolist() == [-third, 1e300]
    assert c.to_json()["input"] == [[third, 0.1], [-third, 1e300]]


@pytest.mark.clause("difftest-ops")
def test_a_rank_tensor_is_that_workers_rows_with_their_trailing_shape() -> None:
    c = Case(2, 2, (3,), F32, "strided", tuple(float(v) for v in range(12)))
    for rank in (0, 1):
        t = c.rank_tensor(rank)
        assert t.shape == (2, 3) and t.dtype == F32 and t.is_contiguous()
        assert t.reshape(-1).tolist() == [float(v) for v in range(6 * rank, 6 * rank + 6)]


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "sliced"])
def test_each_layout_holds_the_same_values_in_its_own_memory(layout: str) -> None:
    values = tuple(float(v) for v in range(1, 25))
    c = Case(2, 4, (3,), F64, layout, values)
    x = c.tensor()
    assert x.shape == (2, 4, 3) and x.dtype == F64
    assert x.reshape(-1).tolist() == list(values)
    dense = torch.tensor(values, dtype=F64).reshape(2, 4, 3)
    laid = lay_out(dense, layout)
    assert laid.data_ptr() != dense.data_ptr()  # never the caller's storage
    assert torch.equal(laid, dense)
    if layout == "contiguous":
        assert x.is_contiguous()
    elif layout == "transposed":
        assert x.stride() == (3, 6, 1)  # workers side by side in memory
    elif layout == "strided":
        assert x.stride() == (24, 6, 2)  # every other element of a twice as wide buffer
    else:
        assert x.stride() == (16, 4, 1) and x.storage_offset() == 1  # rows one element longer, shifted


@pytest.mark.clause("difftest-ops")
def test_rounding_to_a_dtype_clamps_overflow_to_the_largest_finite_value() -> None:
    assert _in_dtype([1e6, -1e6, 0.1, -0.0], F16) == (65504.0, -65504.0, 0.0999755859375, -0.0)
    big = FORMAT[BF16][3]
    assert _in_dtype([1e39, -1e39, 1.0], BF16) == (big, -big, 1.0)
    assert negative(_in_dtype([-0.0], F32)[0])


# --- bounds ------------------------------------------------------------------------------------------------


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 64])
def test_the_bounds_follow_from_the_formats(dtype: torch.dtype, n: int) -> None:
    p, emin, emax, _ = FORMAT[dtype]
    assert order_free_k_bound(dtype, n) == 2**p // n
    assert prod_exponent_bound(dtype, n) == min(emax, p - 1 - emin) // n
    assert near_one_log_bound(dtype, n) == (min(emax, -emin) - 1) / n


# --- value generators --------------------------------------------------------------------------------------


@pytest.mark.clause("difftest-ops")
def test_order_free_sums_are_multiples_of_one_power_of_two_within_the_bound() -> None:
    rng = random.Random(3)
    exponents = set()
    for dtype in FLOAT_DTYPES:
        for n in (1, 3, 16):
            values = order_free_values(dtype, n, 64, rng)
            assert len(values) == 64
            bound = 2 ** FORMAT[dtype][0] // n
            scale = max(2.0**e for e in range(-8, 5) if all((v / 2.0**e).is_integer() for v in values))
            assert all(abs(v / scale) <= bound for v in values)
            assert max(abs(v / scale) for v in values) > bound / 4 or all(v == 0 for v in values)
            exponents.add(int(math.log2(scale)))
    assert min(exponents) < -4 and max(exponents) > 0  # the shared exponent is drawn from -8 .. 4


@pytest.mark.clause("difftest-ops")
def test_order_free_sums_reach_the_bound_and_both_signs() -> None:
    rng = random.Random(4)
    values = [v for _ in range(20) for v in order_free_values(F16, 16, 64, rng, "avg")]
    ks = {round(v / 2.0 ** math.floor(math.log2(abs(v)))) for v in values if v}
    assert any(v > 0 for v in values) and any(v < 0 for v in values) and ks


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_order_free_products_are_powers_of_two_or_zeros_within_the_bound(dtype: torch.dtype) -> None:
    rng = random.Random(5)
    n = 4
    k_max = prod_exponent_bound(dtype, n)
    values = order_free_values(dtype, n, 2000, rng, "prod")
    powers = [power_of_two_exponent(v) for v in values if v != 0]
    assert all(k is not None and abs(k) <= k_max for k in powers)
    drawn = {k for k in powers if k is not None}
    assert max(drawn) >= 0.9 * k_max and min(drawn) <= -0.9 * k_max
    zeros = [v for v in values if v == 0]
    assert 0.09 < len(zeros) / len(values) < 0.16  # one time in eight
    assert any(negative(z) for z in zeros) and not all(negative(z) for z in zeros)
    signs = [negative(v) for v in values if v != 0]
    assert 0.4 < sum(signs) / len(signs) < 0.6


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("op", ["max", "min"])
def test_order_free_extremes_are_ties(op: Op) -> None:
    values = order_free_values(F32, 3, 600, random.Random(6), op)
    assert set(values) <= set(TIES)
    assert {(v, negative(v)) for v in values} == {(t, negative(t)) for t in TIES}


@pytest.mark.clause("difftest-ops")
def test_pow2_draws_every_exponent_both_signs_and_some_zeros() -> None:
    rng = random.Random(7)
    values = [_pow2(rng, 3) for _ in range(4000)]
    zeros = [v for v in values if v == 0]
    assert 0.10 < len(zeros) / len(values) < 0.15
    assert {negative(z) for z in zeros} == {True, False}
    nonzero = [v for v in values if v != 0]
    assert {power_of_two_exponent(v) for v in nonzero} == {-3, -2, -1, 0, 1, 2, 3}
    assert 0.45 < sum(negative(v) for v in nonzero) / len(nonzero) < 0.55
    assert set(_pow2(random.Random(8), 0) for _ in range(200)) <= {1.0, -1.0, 0.0}


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_values_near_one_stay_within_the_log_bound(dtype: torch.dtype) -> None:
    n = 5
    t_max = near_one_log_bound(dtype, n)
    values = _near_one(dtype, n, 3000, random.Random(9))
    assert all(representable(v, dtype) for v in values)
    nonzero = [v for v in values if v != 0]
    logs = [math.log2(abs(v)) for v in nonzero]
    ulp = 2.0 ** (1 - FORMAT[dtype][0])
    assert all(abs(t) <= t_max + ulp for t in logs)
    assert max(logs) > 0.9 * t_max and min(logs) < -0.9 * t_max
    assert 0.04 < (len(values) - len(nonzero)) / len(values) < 0.09  # one time in sixteen
    assert {negative(v) for v in values if v == 0} == {True, False}
    assert 0.45 < sum(negative(v) for v in nonzero) / len(nonzero) < 0.55


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_normal_random_floats_are_moderate_and_centred(dtype: torch.dtype) -> None:
    values = _random_floats(dtype, "normal", 3000, random.Random(10))
    assert len(values) == 3000 and all(representable(v, dtype) for v in values)
    assert 0.45 < sum(v < 0 for v in values) / len(values) < 0.55
    assert max(abs(v) for v in values) < 6 * 2**6
    magnitudes = sorted(abs(v) for v in values)
    assert magnitudes[0] > 0 and 0.1 < magnitudes[1500] < 4  # a normal deviate times 2**k, k in -6 .. 6
    assert sum(m < 2**-4 for m in magnitudes) > 300


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_wide_random_floats_span_the_finite_range(dtype: torch.dtype) -> None:
    values = _random_floats(dtype, "wide", 3000, random.Random(11))
    assert all(math.isfinite(v) and representable(v, dtype) for v in values)
    big = FORMAT[dtype][3]
    assert max(abs(v) for v in values) > big / 2**8
    assert min(abs(v) for v in values if v) < 2.0 ** (FORMAT[dtype][1] + 8)
    assert 0.45 < sum(negative(v) for v in values) / len(values) < 0.55


@pytest.mark.clause("difftest-ops")
def test_wide_random_float16_replaces_nan_and_infinity_by_zero() -> None:
    values = _random_floats(F16, "wide", 4000, random.Random(12))
    # 2 * 1024 of the 65536 float16 patterns are NaN or infinite: about 3 % become zeros
    assert 0.02 < sum(v == 0 for v in values) / len(values) < 0.05


# --- the cases strategy --------------------------------------------------------------------------------


def values_of(c: Case) -> list[float]:
    return list(c.values)


def check_case(c: Case, mode: Mode, op: Op | None, dtypes: tuple[torch.dtype, ...], max_workers: int) -> None:
    """What every case promises: a valid shape, the op, the dtype's values, and the op's and mode's kind."""
    assert c.op == op and c.dtype in dtypes and 1 <= c.n <= max_workers
    assert c.m % c.n == 0 and 1 <= c.m // c.n <= 3 and len(c.trailing) <= 3
    assert len(c.values) == c.n * c.m * math.prod(c.trailing) <= MAX_NUMEL
    assert all(math.isfinite(v) and representable(v, c.dtype) for v in c.values)
    reduction = op or "sum"
    order_free = mode == "order-free"
    if reduction in ("max", "min") and order_free:
        assert set(c.values) <= set(TIES)
    elif reduction == "prod" and order_free:
        k_max = prod_exponent_bound(c.dtype, c.n)
        exponents = [power_of_two_exponent(v) for v in c.values if v != 0]
        assert all(k is not None and abs(k) <= k_max for k in exponents)
    elif reduction == "prod":
        t_max = near_one_log_bound(c.dtype, c.n)
        ulp = 2.0 ** (1 - FORMAT[c.dtype][0])
        assert all(v == 0 or abs(math.log2(abs(v))) <= t_max + ulp for v in c.values)
    elif order_free:
        bound = order_free_k_bound(c.dtype, c.n)
        scales = [2.0**e for e in range(-8, 5) if all((v / 2.0**e).is_integer() for v in c.values)]
        assert scales and all(abs(v) / max(scales) <= bound for v in c.values)


SAMPLES: dict[tuple[object, ...], list[Case]] = {}


@pytest.fixture(autouse=True)
def _draw_anew() -> None:
    """Each test draws its own cases (mutmut forks its runs from a process that has run every test once)."""
    SAMPLES.clear()


def sample(  # noqa: PLR0917 - the strategy's own arguments, in its order
    mode: Mode,
    dtypes: tuple[torch.dtype, ...],
    max_workers: int,
    op: Op | None = None,
    layouts: tuple[str, ...] = ("contiguous",),
    examples: int = 80,
) -> list[Case]:
    """The same cases every run (derandomized Hypothesis, never shrunk), each checked by check_case."""
    key = (mode, dtypes, max_workers, op, layouts, examples)
    if key not in SAMPLES:
        drawn: list[Case] = []

        @settings(DERANDOMIZED, max_examples=examples)
        @given(cases(mode, dtypes, max_workers, layouts, op=op))
        def collect(c: Case) -> None:
            check_case(c, mode, op, dtypes, max_workers)
            drawn.append(c)

        collect()
        SAMPLES[key] = drawn
    return SAMPLES[key]


def found(drawn: list[Case], condition: Callable[[Case], bool]) -> bool:
    return any(condition(c) for c in drawn)


# At most eight elements are drawn over a case's fill: a property of nine or more values is the fill's.
DRAWN = 8


def many(c: Case, predicate: Callable[[float], bool]) -> bool:
    return sum(map(predicate, c.values)) > DRAWN


def zero_fill(c: Case, signs: set[bool]) -> bool:
    """All but the drawn elements are zeros: positive ones (``signs == {False}``), or more zeros of each sign
    than can have been drawn (``{False, True}``)."""
    if signs == {False}:
        return (
            len(c.values) >= 12 and sum(v == 0 and not negative(v) for v in c.values) >= len(c.values) - DRAWN
        )
    zeros = [negative(v) for v in c.values if v == 0]
    return len(zeros) >= len(c.values) - DRAWN and min(zeros.count(True), zeros.count(False)) > DRAWN


def drawn_over_zeros(c: Case, predicate: Callable[[float], bool], signs: set[bool]) -> bool:
    """A zero fill with a drawn element (one not of the fill) for which ``predicate`` holds."""
    positive_only = signs == {False}
    drawn = [v for v in c.values if v != 0 or (positive_only and negative(v))]
    return zero_fill(c, signs) and any(map(predicate, drawn))


def moderate(v: float) -> bool:
    """What a normal fill gives (a normal deviate times 2**k, k in -6 .. 6), and a wide one rarely."""
    return 1e-6 < abs(v) < 1e4


SCALED_TIES = {t * 2.0**-h for t in TIES for h in range(8)}
"""Ties, also as scaled down by a case's headroom."""


@pytest.mark.clause("difftest-ops")
def test_the_same_draws_give_the_same_cases() -> None:
    def draw() -> list[Case]:
        got: list[Case] = []

        @settings(DERANDOMIZED, max_examples=12)
        @given(cases("bound", (F32,), 3))
        def collect(c: Case) -> None:
            got.append(c)

        collect()
        return got

    first = draw()
    assert first == draw() and len({c.values for c in first}) > 3


@pytest.mark.clause("difftest-ops")
def test_cases_reach_every_size_layout_and_trailing_shape() -> None:
    drawn = sample("bound", (F32,), 4, layouts=("sliced", "transposed"), examples=40)
    assert found(drawn, lambda c: c.n >= 3 and c.m == 3 * c.n)
    assert found(drawn, lambda c: len(c.trailing) == 3 and c.n >= 2)
    assert found(drawn, lambda c: c.layout == "transposed") and found(drawn, lambda c: c.layout == "sliced")
    big = [c for c in sample("exact", (F16,), 16, examples=40) if c.n >= 12]
    assert big and all(c.m == c.n for c in big)  # N * 2N > 256 elements: one row per worker


@pytest.mark.clause("difftest-ops")
def test_sum_cases_have_zero_normal_and_wide_fills() -> None:
    drawn = sample("exact", (F32,), 4)
    assert found(drawn, lambda c: zero_fill(c, {False}))
    assert found(drawn, lambda c: many(c, moderate) and all(v == 0 or moderate(v) for v in c.values))
    assert found(drawn, lambda c: many(c, lambda v: abs(v) > 1e10))


@pytest.mark.clause("difftest-ops")
def test_order_free_sum_cases_have_zero_and_random_fills() -> None:
    drawn = sample("order-free", (F16,), 4, "sum")
    assert found(drawn, lambda c: zero_fill(c, {False}))
    assert found(drawn, lambda c: many(c, lambda v: v != 0) and len(set(c.values)) > DRAWN)
    assert found(drawn, lambda c: any(not v.is_integer() for v in c.values))  # a negative exponent


@pytest.mark.clause("difftest-ops")
def test_order_free_prod_cases_have_zero_and_power_fills_and_drawn_powers_and_zeros() -> None:
    drawn = sample("order-free", (F16,), 4, "prod", examples=200)
    assert found(drawn, lambda c: zero_fill(c, {False}))
    assert found(drawn, lambda c: many(c, lambda v: v != 0))
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: v < 0, {False}))
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: v > 1, {False}))
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: v == 0, {False}))  # a drawn -0.0
    assert found(
        drawn,
        lambda c: drawn_over_zeros(c, lambda v: 0 < abs(v) < 2.0 ** prod_exponent_bound(F16, c.n), {False}),
    )


@pytest.mark.clause("difftest-ops")
def test_prod_cases_near_one_have_zero_and_near_fills_and_drawn_values_of_both_signs() -> None:
    drawn = sample("bound", (F32,), 4, "prod", examples=200)
    assert found(drawn, lambda c: zero_fill(c, {False}))
    assert found(drawn, lambda c: many(c, lambda v: v != 0))
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: v < 0, {False}))
    assert found(
        drawn,
        lambda c: drawn_over_zeros(c, lambda v: 1 < v < 2.0 ** near_one_log_bound(F32, c.n) / 2, {False}),
    )
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: 0 < abs(v) < 1, {False}))
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: v == 0, {False}))  # a drawn -0.0


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("op", ["max", "min"])
def test_order_free_extreme_cases_have_zero_and_tie_fills(op: Op) -> None:
    drawn = sample("order-free", (F32,), 4, op)
    assert found(drawn, lambda c: zero_fill(c, {False, True}))
    assert found(drawn, lambda c: many(c, lambda v: v != 0))
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: abs(v) in (1.0, 2.0), {False, True}))


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("op", ["max", "min"])
def test_extreme_cases_have_zero_tie_normal_and_wide_fills_and_drawn_floats(op: Op) -> None:
    drawn = sample("bound", (F32,), 4, op, examples=200)
    assert found(drawn, lambda c: zero_fill(c, {False, True}))
    assert found(drawn, lambda c: many(c, lambda v: v in TIES and v != 0))
    assert found(
        drawn,
        lambda c: (
            many(c, lambda v: v not in SCALED_TIES and moderate(v))
            and all(v == 0 or moderate(v) for v in c.values)
        ),
    )
    assert found(drawn, lambda c: many(c, lambda v: abs(v) > 1e10))
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: v not in SCALED_TIES, {False, True}))
    assert found(drawn, lambda c: drawn_over_zeros(c, lambda v: v in TIES and v != 0, {False, True}))


# --- one-worker cases and probes ------------------------------------------------------------------------


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("op", [None, "sum", "avg", "prod", "max", "min"])
def test_one_worker_cases_for_each_op(op: Op | None) -> None:
    for mode in ("exact", "order-free", "bound"):
        got = one_worker_cases(mode, [F16, BF16, F32], op=op)
        assert [(c.n, c.m, c.trailing) for c in got] == [(1, 2, ()), (1, 2, (2,))] * 3
        assert [c.layout for c in got] == [
            "contiguous",
            "sliced",
            "contiguous",
            "strided",
            "contiguous",
            "sliced",
        ]
        assert all(c.op == op and all(representable(v, c.dtype) for v in c.values) for c in got)
        assert all(got[i].values == got[i + 1].values[:2] for i in range(0, 6, 2))
        values = got[1].values
        assert any(v > 0 for v in values) and any(v < 0 for v in values)  # nonzero values of both signs
        if op == "prod":
            assert all(v == 0 or power_of_two_exponent(v) is not None for v in values)
            assert any(v == 0 and negative(v) for v in values) and any(v < 0 for v in values)
        elif op in ("max", "min"):
            assert {(v, negative(v)) for v in values if v == 0} == {(0.0, True), (0.0, False)}
        elif mode == "order-free":
            assert all((v * 4).is_integer() for v in values)  # exact in every dtype, in any order
        else:
            assert any(not (v * 2**20).is_integer() for v in got[5].values)  # some round: not dyadic
    ranks = one_worker_cases("bound", [F16, F32], per_rank=True, op=op)
    assert [c.layout for c in ranks] == ["contiguous"] * 4


@pytest.mark.clause("difftest-ops")
def test_probes_mark_one_worker_each() -> None:
    c = Case(3, 3, (2,), F32, "transposed", tuple(float(v) for v in range(18)), "min")
    probes = probe_cases(c)
    assert len(probes) == 3
    for j, probe in enumerate(probes):
        assert (probe.n, probe.m, probe.trailing, probe.dtype, probe.layout, probe.op) == (
            3,
            3,
            (2,),
            F32,
            "transposed",
            "min",
        )
        assert probe.values == tuple(1.0 if i == j else 0.0 for i in range(3) for _ in range(6))
    marked = probe_cases(c, base=2.0, mark=-0.5)
    assert marked[2].values == (2.0,) * 12 + (-0.5,) * 6
