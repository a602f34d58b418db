"""The three oracles, each on its own: ``exact``, ``order-free`` and ``bound`` (clause ``difftest-oracles``).

Each takes a case and a well-formed result and returns the first element
that breaks it (a :class:`ValueMismatch`, or ``None``); none reuses the code
under test.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from fractions import Fraction

import torch
from hypothesis import strategies as st

from ring_ref import ring_all_reduce
from ring_ref._dtypes import bits, format_of
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._vocabulary import Mode

__all__ = [
    "EXACT_ORDER",
    "SPEC_ORDER",
    "ExactOrder",
    "ValueMismatch",
    "as_float_list",
    "check_bound",
    "check_values",
    "exact_oracle",
    "exact_sums",
    "flat_of",
    "locate",
    "order_free_oracle",
]


def exact_sums(case: Case) -> tuple[list[Fraction], list[Fraction]]:
    """Per result element: the exact sum over workers and the sum of magnitudes."""
    per_worker = len(case.values) // case.n
    sums, mags = [], []
    for e in range(per_worker):
        terms = [Fraction(case.values[i * per_worker + e]) for i in range(case.n)]
        sums.append(sum(terms, Fraction(0)))
        mags.append(sum((abs(t) for t in terms), Fraction(0)))
    return sums, mags


@dataclass
class ValueMismatch:
    """The first element where the result disagrees with the mode's oracle."""

    index: tuple[int, ...]
    chunk: int
    expected: float
    actual: float
    detail: str
    count: int


def locate(case: Case, flat: int) -> tuple[tuple[int, ...], int]:
    """The multi-index in the ``(M, ...)`` result of flat element ``flat`` and its chunk."""
    index = tuple(int(v) for v in torch.unravel_index(torch.tensor(flat), (case.m, *case.trailing)))
    return index, index[0] // (case.m // case.n)


def flat_of(case: Case, index: tuple[int, ...]) -> int:
    flat = 0
    for size, i in zip((case.m, *case.trailing), index, strict=True):
        flat = flat * size + i
    return flat


@dataclass
class BoundCheck:
    mismatch: ValueMismatch | None
    overflow_skipped: int


def check_bound(case: Case, actual: list[float]) -> BoundCheck:
    """The ``bound`` oracle on one result (flattened, as floats).

    A non-finite element is accepted only if some order could overflow.  The
    addition that overflows adds two computed partial sums of disjoint sets of
    terms, after at most ``N - 2`` roundings, so its exact value is at most
    ``(1 + gamma_{N-2}) * sum|x_i|``; it rounds to infinity only when that
    reaches :func:`overflow_threshold`.  With one worker nothing can overflow.
    """
    sums, mags = exact_sums(case)
    fmt = format_of(case.dtype)
    g = fmt.gamma(case.n - 1)
    can_overflow = case.n >= 2
    overflow_factor = 1 + fmt.gamma(max(case.n - 2, 0))
    limit = fmt.overflow_threshold
    skipped, bad = 0, []
    for e, (s, a, y) in enumerate(zip(sums, mags, actual, strict=True)):
        if not math.isfinite(y):
            if can_overflow and overflow_factor * a >= limit:
                skipped += 1
            else:
                bad.append(e)
        elif abs(Fraction(y) - s) > g * a:
            bad.append(e)
    if not bad:
        return BoundCheck(None, skipped)
    e = bad[0]
    index, chunk = locate(case, e)
    detail = (
        f"|actual - exact| must be <= gamma_{case.n - 1} * sum|x_i| = {float(g * mags[e]):.6g} "
        f"(exact sum {float(sums[e])!r}); no summation order can overflow here"
        if not math.isfinite(actual[e])
        else f"|actual - exact| = {float(abs(Fraction(actual[e]) - sums[e])):.6g} > "
        f"gamma_{case.n - 1} * sum|x_i| = {float(g * mags[e]):.6g}"
    )
    return BoundCheck(ValueMismatch(index, chunk, float(sums[e]), actual[e], detail, len(bad)), skipped)


def _first_bitwise(
    case: Case, expected: torch.Tensor, actual: torch.Tensor, what: str
) -> ValueMismatch | None:
    diff = (bits(expected) != bits(actual)).reshape(-1).nonzero()
    if diff.numel() == 0:
        return None
    e = int(diff[0])
    index, chunk = locate(case, e)
    want = float(expected.reshape(-1)[e])
    got = float(actual.reshape(-1)[e])
    return ValueMismatch(index, chunk, want, got, f"not bitwise equal to {what}", int(diff.numel()))


def as_float_list(result: torch.Tensor) -> list[float]:
    return [float(v) for v in result.detach().to(torch.float64).reshape(-1).tolist()]


@dataclass(frozen=True)
class ExactOrder:
    """What ``exact`` compares with (clause ``difftest-exact-orders``): the spec's ring unless told otherwise.

    ``expected(case)`` is the result the order gives; ``option`` is how the
    command line names it (for the replay line); ``cases``, when set, is the
    strategy ``exact`` draws its inputs from instead of the usual one (an
    order saved for one ``N``, ``M`` and dtype covers only those).
    """

    name: str
    expected: Callable[[Case], torch.Tensor]
    option: str = ""
    cases: st.SearchStrategy[Case] | None = None


SPEC_ORDER = ExactOrder("the ring order (fold-order)", lambda case: ring_all_reduce(case.tensor()))

EXACT_ORDER: ContextVar[ExactOrder] = ContextVar("EXACT_ORDER", default=SPEC_ORDER)
"""The order ``exact`` checks against; :func:`ring_ref.difftest.difftest` sets it for its run."""


def exact_oracle(case: Case, result: torch.Tensor) -> ValueMismatch | None:
    """``exact``: the result's bits are the order's (by default the ring's, clause ``fold-order``)."""
    order = EXACT_ORDER.get()
    return _first_bitwise(case, order.expected(case), result, order.name)


def order_free_oracle(case: Case, result: torch.Tensor) -> ValueMismatch | None:
    """``order-free``: where every partial sum is exact, the result is the exact sum, bit for bit."""
    sums, _ = exact_sums(case)
    exact = torch.tensor([float(s) for s in sums], dtype=torch.float64).to(case.dtype)
    if any(Fraction(float(v)) != s for v, s in zip(exact.tolist(), sums, strict=True)):
        raise AssertionError("order-free generator produced a sum that rounds; this is a ring_ref bug")
    return _first_bitwise(case, exact.reshape(result.shape), result, "the exact sum")


def check_values(mode: Mode, case: Case, result: torch.Tensor) -> tuple[ValueMismatch | None, int]:
    """The mode's oracle on a well-formed result: the first mismatch (or ``None``) and overflow skips."""
    if mode == "exact":
        return exact_oracle(case, result), 0
    if mode == "order-free":
        return order_free_oracle(case, result), 0
    checked = check_bound(case, as_float_list(result))
    return checked.mismatch, checked.overflow_skipped
