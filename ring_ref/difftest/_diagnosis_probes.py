"""The diagnosis' probes and what they read, without words (those are the diagnosis'): how often a target
counts each worker's contribution (the one-hot *counting probes*), which op it computed (the *op probes*),
and the shapes and values those probes take.

Not the order probes (:mod:`ring_ref.difftest._probes`), which make ``exact`` fail another order during the
search; these run after a failure, to name it (:mod:`ring_ref.difftest._diagnosis`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from fractions import Fraction
from typing import Final, cast

import torch

from ring_ref._dtypes import FloatFormat, format_of
from ring_ref.difftest._call import results as results_of
from ring_ref.difftest._call import well_formed
from ring_ref.difftest._inputs import Case, probe_cases
from ring_ref.difftest._launch import Launcher, as_launcher
from ring_ref.difftest._oracles import ValueMismatch, as_float_list, exact_sums, flat_of, round_to
from ring_ref.difftest._vocabulary import OPS, Op, Target

__all__ = [
    "PROBE_VALUES",
    "count_contributions",
    "counts_by_rank",
    "counts_once",
    "is_mean",
    "lost_workers",
    "off_counts",
    "op_on_probe",
    "op_probe_rows",
    "op_probe_values",
    "position_probe",
    "scaled_first",
    "several_workers",
    "times_reciprocal",
    "who",
]


PROBE_VALUES: Final[dict[Op, tuple[float, float]]] = {
    "sum": (0.0, 1.0),
    "avg": (0.0, 1.0),
    "prod": (1.0, 2.0),
    "max": (0.0, 1.0),
    "min": (0.0, -1.0),
}
"""Per op, the value every worker holds in a counting probe, and the mark worker ``j`` holds instead."""


def is_mean(case: Case, actual: list[float]) -> bool:
    """True when every element is the sum divided by ``N`` (within a rounding allowance), ``N >= 2``."""
    sums, mags = exact_sums(case)
    if case.n < 2 or not any(sums):
        return False
    fmt = format_of(case.dtype)
    g = 2 * fmt.gamma(case.n)
    tiny = Fraction(fmt.smallest_normal) * fmt.unit_roundoff * case.n
    return all(
        math.isfinite(y) and abs(Fraction(y) - s / case.n) <= g * a / case.n + tiny
        for s, a, y in zip(sums, mags, actual, strict=True)
    )


def _count(op: Op, case: Case, base: float, y: float) -> float:
    """The contribution count one probe element shows, measured from ``base`` (the all-base result there).

    ``sum``, ``max``: ``y - base``; ``min``: ``base - y``; ``avg``: ``(y - base) N``, taken as the
    nearest whole number within two roundings (``k / N`` is rounded once); ``prod``: ``log2(y / base)``
    when that is a whole number.  Anything else is NaN (not a count).
    """
    if not (math.isfinite(y) and math.isfinite(base)):
        return math.nan
    if op == "min":
        return base - y
    if op == "avg":
        c = (y - base) * case.n
        k = round(c)
        return (
            float(k) if abs(c - k) <= 2 * float(format_of(case.dtype).unit_roundoff) * max(1, abs(k)) else c
        )
    if op == "prod":
        if base <= 0 or y <= 0:
            return math.nan
        ratio = Fraction(y) / Fraction(base)
        whole = ratio.denominator == 1 and ratio.numerator & (ratio.numerator - 1) == 0
        return float(ratio.numerator.bit_length() - 1) if whole else math.nan
    return y - base


def count_contributions(
    fn: Target | Launcher, case: Case, rank: int | None = None
) -> list[list[float]] | None:
    """``counts[j][e]``: how often the target counts worker ``j``'s contribution to element ``e``.

    Read from probes of ``case``'s shape, dtype, layout and op in which every
    worker holds the op's base value and worker ``j`` its mark
    (:data:`PROBE_VALUES`: for ``sum`` ones in worker ``j``, zeros elsewhere).
    Each count is measured from the target's result on all base values (called
    first): a correct all-reduce gives 1 everywhere; ``k`` means worker ``j``'s
    contribution to element ``e`` was counted ``k`` times (for ``max`` and ``min``
    only 0 or 1 can show), and a target that adds a constant is not taken for
    one that counts twice.  ``None`` when a probe call does not return a
    well-formed result (the remaining probes are not run, so a target that
    hangs costs at most one more time limit).  For a per-rank target the probes
    run on the whole group and ``rank``'s result is read
    (:func:`counts_by_rank` reads every rank's).
    """
    return counts_by_rank(fn, case).get(rank)


def counts_by_rank(fn: Target | Launcher, case: Case) -> dict[int | None, list[list[float]]]:
    """:func:`count_contributions` for every rank at once (one run of the probes), by rank (``None``
    for a stacked target); a rank is left out once a probe gives it no well-formed result, and the
    probes stop when no rank is left."""
    launcher = as_launcher(fn)
    op = case.reduction
    base_value, mark = PROBE_VALUES[op]
    outcome = launcher.call(replace(case, values=(base_value,) * len(case.values)))
    bases = results_of(outcome)
    counts: dict[int | None, list[list[float]]] = {r: [] for r, b in bases.items() if b is not None}
    for probe in probe_cases(case, base_value, mark):
        if not counts:
            break
        outcome = launcher.call(probe)
        for rank in list(counts):
            result = well_formed(outcome, rank)
            if result is None:
                del counts[rank]
                continue
            base = as_float_list(cast(torch.Tensor, bases[rank]))
            counts[rank].append(
                [_count(op, case, b, c) for c, b in zip(as_float_list(result), base, strict=True)]
            )
    return counts


def off_counts(
    case: Case, counts: list[list[float]], mismatch: ValueMismatch
) -> tuple[int, list[float]] | None:
    """The element whose whole-number counts are not all 1, and its count per worker.

    The counterexample's first differing element when it is one, else the
    first element; one counted more than once before one only missing a
    worker.  ``None`` when every count is 1, or when some count is not a
    whole number (then the counts are not contribution counts: a mean, a
    scaling, rounding).
    """
    per_element = [list(col) for col in zip(*counts, strict=True)]
    if not all(math.isfinite(c) and c == round(c) and c >= 0 for col in per_element for c in col):
        return None
    off = [e for e, col in enumerate(per_element) if any(c != 1 for c in col)]
    if not off:
        return None
    doubled = [e for e in off if any(c >= 2 for c in per_element[e])]
    pool = doubled or off
    first_flat = flat_of(case, mismatch.index)
    e = first_flat if first_flat in pool else pool[0]
    return e, per_element[e]


def who(per: list[float]) -> tuple[list[int], list[int]]:
    """The workers one element's counts show lost (0) and counted more than once (2 or more)."""
    return [j for j, c in enumerate(per) if c == 0], [j for j, c in enumerate(per) if c >= 2]


def lost_workers(case: Case, counts: list[list[float]] | None, mismatch: ValueMismatch) -> bool:
    """Whether whole-number probe counts show a worker lost (the counting form of ``out-of-bound``)."""
    off = None if counts is None else off_counts(case, counts, mismatch)
    return off is not None and bool(who(off[1])[0])


def counts_once(counts: list[list[float]] | None) -> bool:
    """Whether probe counts show every worker counted once in every element (``None``: none came)."""
    return counts is not None and all(c == 1 for row in counts for c in row)


def position_probe(case: Case) -> Case:
    """A probe of ``case``'s shape, dtype, layout and op whose result differs from element to element.

    ``max``, ``min``: worker ``j`` holds ``(3 e + j) % 251 + 1`` at element ``e``
    (whole numbers below 256: exact in every dtype); ``prod``: worker 0 holds
    ``+-2**(e % 5)``, negative where ``(e // 5)`` is odd, the others ones
    (every partial product exact).  No zeros, so no sign of zero is in question.

    >>> c = position_probe(Case(2, 2, (), torch.float32, "contiguous", (0.0,) * 4, "prod"))
    >>> c.values
    (1.0, 2.0, 1.0, 1.0)
    """
    per_worker = len(case.values) // case.n
    if case.reduction == "prod":
        values = [
            (-1.0 if (e // 5) % 2 else 1.0) * 2.0 ** (e % 5) if j == 0 else 1.0
            for j in range(case.n)
            for e in range(per_worker)
        ]
    else:
        values = [float((3 * e + j) % 251 + 1) for j in range(case.n) for e in range(per_worker)]
    return replace(case, values=tuple(values))


def op_probe_rows(n: int, flipped: bool = False) -> list[float]:
    """The op probes' worker values: ``2 + j % 2`` (2, 3, 2, ...), or ``flipped``, ``3 - j % 2``."""
    return [float(3 - j % 2 if flipped else 2 + j % 2) for j in range(n)]


def op_probe_values(n: int, dtype: torch.dtype, flipped: bool = False) -> dict[Op, float]:
    """Each op's exact result on an op probe (:func:`op_probe_rows`), the same in every order.

    For ``N >= 2`` every op gives a different value there (the partial sums
    are whole numbers below ``2**8``; the product is left out when some
    partial product would round or overflow).

    >>> op_probe_values(3, torch.float32)
    {'sum': 7.0, 'prod': 12.0, 'max': 3.0, 'min': 2.0, 'avg': 2.3333332538604736}
    """
    fmt = format_of(dtype)
    xs = [int(x) for x in op_probe_rows(n, flipped)]
    total = sum(xs)
    threes, twos = xs.count(3), xs.count(2)
    values: dict[Op, float] = {"sum": float(total)}
    if 3**threes < 2**fmt.precision and 2**twos * 3**threes <= fmt.max_finite:
        values["prod"] = float(2**twos * 3**threes)
    values.update({"max": float(max(xs)), "min": float(min(xs)), "avg": round_to(fmt, Fraction(total, n))})
    return values


def op_on_probe(fn: Launcher, case: Case, rank: int | None, flipped: bool) -> Op | None:
    """The op (not the case's) whose exact value the target gives on every element of an op probe."""
    values = op_probe_values(case.n, case.dtype, flipped)
    per_worker = len(case.values) // case.n
    rows = op_probe_rows(case.n, flipped)
    got = well_formed(fn.call(replace(case, values=tuple(x for x in rows for _ in range(per_worker)))), rank)
    if got is None:
        return None
    actual = as_float_list(got)
    asked = case.reduction
    for other in OPS:
        if other == asked or other not in values or (asked == "sum" and other == "avg"):
            continue
        if all(y == values[other] for y in actual):
            return other
    return None


def several_workers(case: Case) -> Case:
    """``case`` itself for ``N >= 2``; for ``N = 1``, a case of two workers of twice its rows (any layout
    takes that shape), each holding ``case``'s values twice: the shape the op and position probes take,
    as one worker tells no op from another (``sum``, ``max`` and ``min`` all return it).

    >>> several_workers(Case(1, 1, (), torch.float32, "contiguous", (5.0,), "max")).values
    (5.0, 5.0, 5.0, 5.0)
    """
    if case.n >= 2:
        return case
    return replace(case, n=2, m=2 * case.m, values=case.values * 4)


@functools.lru_cache(maxsize=256)
def times_reciprocal(fmt: FloatFormat, n: int) -> tuple[int, int, float] | None:
    """Two small whole contributions ``a <= b`` that tell the sum times ``fl(1/N)`` from every other average.

    Returns ``(a, b, times)``: with every other worker holding zero the sum ``a + b`` is exact (one
    addition, the same in every order), and ``times`` is ``(a + b) * fl(1/N)`` rounded, which differs
    from ``(a + b) / N`` rounded once and from the sums of the contributions divided by ``N`` or
    multiplied by ``fl(1/N)`` first.  ``None`` when no pair up to 64 does (``N`` a power of two).
    """
    if n & (n - 1) == 0:
        return None
    reciprocal = Fraction(round_to(fmt, Fraction(1, n)))
    for b in range(1, 65):
        for a in range(1, b + 1):
            times = round_to(fmt, (a + b) * reciprocal)
            others = {
                round_to(fmt, Fraction(a + b, n)),
                round_to(
                    fmt, Fraction(round_to(fmt, Fraction(a, n))) + Fraction(round_to(fmt, Fraction(b, n)))
                ),
                round_to(
                    fmt, Fraction(round_to(fmt, a * reciprocal)) + Fraction(round_to(fmt, b * reciprocal))
                ),
            }
            if times not in others:
                return a, b, times
    return None


def scaled_first(
    fmt: FloatFormat, n: int, premultiply: bool
) -> tuple[int, int, float, frozenset[float]] | None:
    """Two small whole contributions ``a <= b`` that tell an average of scaled contributions apart.

    Returns ``(a, b, scaled, right)``: with every other worker holding zero,
    the sum ``a + b`` is exact and there is one addition whatever the order,
    so an average divided once gives ``a + b`` over ``N`` rounded, or
    ``(a + b) * fl(1/N)`` rounded (``right``); dividing each contribution by
    ``N`` first (``premultiply``: multiplying each by ``fl(1/N)``) gives
    ``scaled``, outside ``right``.  ``None`` when no pair up to 64 does
    (``N`` a power of two: scaling is exact).
    """
    if n & (n - 1) == 0:
        return None  # dividing whole numbers this small by a power of two is exact
    reciprocal = Fraction(round_to(fmt, Fraction(1, n)))

    def scale(x: int) -> Fraction:
        return Fraction(round_to(fmt, x * reciprocal if premultiply else Fraction(x, n)))

    for b in range(1, 65):
        for a in range(1, b + 1):
            total = Fraction(a + b)
            right = frozenset({round_to(fmt, total / n), round_to(fmt, total * reciprocal)})
            scaled = round_to(fmt, scale(a) + scale(b))
            if scaled not in right:
                return a, b, scaled, right
    return None
