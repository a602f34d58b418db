"""What each oracle reports about the first bad element, where mutation testing found it unchecked.

The mismatch names the element (its index in the ``(M, ...)`` result and its
chunk), the expected and the actual value, why it failed and how many
elements failed; the bound oracle also counts the elements it let pass
because some order could overflow.  Expected values are worked out by hand
from small cases whose sums are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import pytest
import torch

from ring_ref.difftest import Case
from ring_ref.difftest._oracles import (
    ValueMismatch,
    check_bound,
    check_values,
    exact_oracle,
    flat_of,
    locate,
    order_free_oracle,
)

pytestmark = pytest.mark.clause("difftest-oracles")

Oracle = Callable[[Case, torch.Tensor], ValueMismatch | None]

# N = 2 workers of M = 4 rows of 2: worker 0 holds 0 .. 7, worker 1 holds 10 .. 17 (flat),
# so result element e is exactly 10 + 2 e under every order; chunks are rows 0-1 and 2-3.
PAIRS = Case(2, 4, (2,), torch.float32, "contiguous", tuple(float(v) for v in [*range(8), *range(10, 18)]))
RIGHT = torch.tensor([10.0 + 2 * e for e in range(8)]).reshape(4, 2)


def _unit_roundoff_gamma_1(p: int) -> Fraction:
    u = Fraction(1, 2**p)
    return u / (1 - u)


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


def test_a_bitwise_oracle_tells_minus_zero_from_zero() -> None:
    zeros = Case(1, 2, (), torch.float32, "contiguous", (0.0, -0.0))
    mismatch = exact_oracle(zeros, torch.tensor([0.0, 0.0]))
    assert mismatch is not None and (mismatch.index, mismatch.expected, mismatch.count) == ((1,), -0.0, 1)


def test_locate_and_flat_of_are_inverse_and_name_the_chunk_by_its_rows() -> None:
    case = Case(2, 6, (2, 3), torch.float32, "contiguous", tuple(0.0 for _ in range(2 * 6 * 6)))
    for e in range(6 * 6):
        index, chunk = locate(case, e)
        assert index == (e // 6, (e // 3) % 2, e % 3)
        assert chunk == e // 6 // 3 and type(chunk) is int
        assert flat_of(case, index) == e


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


def test_bound_counts_each_element_it_lets_overflow() -> None:
    case = Case(2, 3, (), torch.float16, "contiguous", (65504.0, 65504.0, 1.0, 65504.0, 65504.0, 1.0))
    checked = check_bound(case, [float("inf"), float("inf"), 2.0])
    assert (checked.mismatch, checked.overflow_skipped) == (None, 2)


def test_check_values_runs_the_modes_own_oracle_and_counts_no_overflow_for_bitwise_modes() -> None:
    """``1 + (-1)`` is exactly 0; ``2**-30`` there is within the bound (gamma_1 * 2) but not the same bits."""
    cancelling = Case(2, 2, (), torch.float32, "contiguous", (1.0, 2.0, -1.0, 2.0))
    right, close = torch.tensor([0.0, 4.0]), torch.tensor([2.0**-30, 4.0])
    for mode in ("exact", "order-free"):
        assert check_values(mode, cancelling, right) == (None, 0, 0)
        mismatch, skipped, _ = check_values(mode, cancelling, close)
        assert mismatch is not None and mismatch.index == (0,) and skipped == 0, mode
    assert check_values("bound", cancelling, close) == (None, 0, 0)
