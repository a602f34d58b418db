"""The three oracles, each on its own: ``exact``, ``order-free`` and ``bound`` (clause ``difftest-oracles``).

Each takes a case and a well-formed result and returns the first element
that breaks it (a :class:`ValueMismatch`, or ``None``); none reuses the code
under test.  Each has a form per op (clause ``difftest-ops``), for the op the
case carries:

* ``exact``: the ring's bits for that op (:func:`ring_ref.ring_all_reduce` with ``op=``).
* ``order-free``: ``sum``, the exact sum; ``avg``, the exact sum divided by
  ``N``, rounded once (:func:`round_to`); ``prod``, the exact product of
  powers of two, its sign the exclusive or of the signs; ``max``, ``min``
  (:func:`extreme_oracle`): one of the element's inputs equal to the extreme,
  bit for bit (either zero when the extreme is a zero and both occur).
* ``bound``: ``sum``, :func:`check_bound`; ``avg``, :func:`check_avg_bound`;
  ``prod``, :func:`check_prod_bound`; ``max``, ``min``, the order-free oracle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import torch
from hypothesis import strategies as st

from ring_ref._chunks import chunk_of_elements
from ring_ref._dispatch import ring_all_reduce, ring_reduce_scatter
from ring_ref._dtypes import FloatFormat, bits, dtype_name, format_of
from ring_ref._order import Tree, layout_matters, layout_sizes, ring_trees
from ring_ref.difftest._inputs import Case, exact_tensor
from ring_ref.difftest._vocabulary import OPS, Mode, Op
from ring_ref.schedule import BELOW_N, SPEC, Layout, Schedule, preset_schedule

__all__ = [
    "SPEC_ORDER",
    "BoundCheck",
    "Checked",
    "ExactOrder",
    "SavedOrder",
    "ValueMismatch",
    "all_negative_zeros",
    "as_float_list",
    "check_avg_bound",
    "check_bound",
    "check_prod_bound",
    "check_values",
    "columns",
    "exact_oracle",
    "exact_sums",
    "extreme_oracle",
    "flat_of",
    "gather_oracle",
    "locate",
    "order_free_oracle",
    "reduce_scatter_reference",
    "round_to",
    "zeros_as_the_oracle_wants",
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


def locate(case: Case, flat: int, layout: Layout = "even") -> tuple[tuple[int, ...], int]:
    """The multi-index in the ``(M, ...)`` result of flat element ``flat`` and its chunk.

    The chunk is cut by ``layout``, the expected order's (:attr:`ExactOrder.layout`: the spec's
    ``even`` rows, or the ``blocks`` or ``gloo`` ranges of ``--schedule`` and
    ``--order``), so every report labels an element's chunk the same way.

    >>> case = Case(4, 10, (), torch.float32, "contiguous", (0.0,) * 40)
    >>> locate(case, 9, "blocks")
    ((9,), 3)
    """
    index = tuple(int(v) for v in torch.unravel_index(torch.tensor(flat), (case.m, *case.trailing)))
    per_worker = len(case.values) // case.n
    return index, chunk_of_elements(layout, case.n, per_worker, itemsize=case.dtype.itemsize)[flat]


def flat_of(case: Case, index: tuple[int, ...]) -> int:
    flat = 0
    for size, i in zip((case.m, *case.trailing), index, strict=True):
        flat = flat * size + i
    return flat


@dataclass
class BoundCheck:
    """A bound oracle's verdict: the first mismatch, and the elements it accepted outside its hypotheses."""

    mismatch: ValueMismatch | None
    overflow_skipped: int
    underflow_skipped: int = 0


def _float(q: Fraction) -> float:
    """``q`` as the nearest float64, or an infinity beyond float64's range (for a report only)."""
    try:
        return float(q)
    except OverflowError:
        return math.inf if q > 0 else -math.inf


def columns(case: Case) -> list[list[float]]:
    """Per result element (row-major), the ``N`` workers' values there, in worker order."""
    per_worker = len(case.values) // case.n
    return [[case.values[i * per_worker + e] for i in range(case.n)] for e in range(per_worker)]


def round_to(fmt: FloatFormat, q: Fraction, negative_zero: bool = False) -> float:
    """``q`` correctly rounded to ``fmt`` (to nearest, ties to even; subnormals; beyond: +-inf).

    ``negative_zero``: the sign of a zero result.  Exact in rational arithmetic,
    so it shares nothing with the engines' divisions.

    >>> from ring_ref._dtypes import FORMATS
    >>> round_to(FORMATS["float16"], Fraction(5, 3)), round_to(FORMATS["float16"], Fraction(65520))
    (1.6669921875, inf)
    """
    if q == 0:
        return -0.0 if negative_zero else 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, fmt.emin) - fmt.precision + 1)
    k, rest = divmod(a, ulp)
    k = int(k)
    if rest * 2 > ulp or (rest * 2 == ulp and k % 2 == 1):
        k += 1
    rounded = k * ulp
    value = math.inf if rounded > Fraction(fmt.max_finite) else float(rounded)
    return -value if q < 0 else value


def check_bound(case: Case, actual: list[float], layout: Layout = "even") -> BoundCheck:
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
    index, chunk = locate(case, e, layout)
    detail = (
        f"|actual - exact| must be <= gamma_{case.n - 1} * sum|x_i| = {_float(g * mags[e]):.6g} "
        f"(exact sum {_float(sums[e])!r}); no summation order can overflow here"
        if not math.isfinite(actual[e])
        else f"|actual - exact| = {_float(abs(Fraction(actual[e]) - sums[e])):.6g} > "
        f"gamma_{case.n - 1} * sum|x_i| = {_float(g * mags[e]):.6g}"
    )
    return BoundCheck(ValueMismatch(index, chunk, _float(sums[e]), actual[e], detail, len(bad)), skipped)


def check_avg_bound(case: Case, actual: list[float], layout: Layout = "even") -> BoundCheck:
    """The ``bound`` oracle for ``avg``: the sum's bound, then one rounded division by ``N``.

    With ``S`` the exact sum, ``A = sum|x_i|``, ``g = gamma_{N-1}``: any order's
    computed sum ``s`` has ``|s - S| <= g A`` (subnormal additions are exact, so
    underflow does not weaken it), and rounding ``s / N`` once errs by at most
    ``max(u |s / N|, eta)``, ``eta`` half the smallest subnormal (nothing for
    ``N = 1``).  So ``|y - S/N| <= g A / N + max(u (|S| + g A) / N, eta)``.
    Non-finite elements: as for the sum (an order could overflow the sum).
    """
    sums, mags = exact_sums(case)
    fmt, n = format_of(case.dtype), case.n
    g, u = fmt.gamma(n - 1), fmt.unit_roundoff
    eta = Fraction(fmt.min_subnormal) / 2
    overflow_factor, limit = 1 + fmt.gamma(max(n - 2, 0)), fmt.overflow_threshold
    skipped, bad, allowed = 0, [], []
    for e, (s, a, y) in enumerate(zip(sums, mags, actual, strict=True)):
        room = g * a / n + (0 if n == 1 else max(u * (abs(s) + g * a) / n, eta))
        allowed.append(room)
        if not math.isfinite(y):
            if n >= 2 and overflow_factor * a >= limit:
                skipped += 1
            else:
                bad.append(e)
        elif abs(Fraction(y) - s / n) > room:
            bad.append(e)
    if not bad:
        return BoundCheck(None, skipped)
    e = bad[0]
    index, chunk = locate(case, e, layout)
    want = _float(sums[e] / n)
    bound = f"gamma_{n - 1} * sum|x_i| / N + one rounding of the quotient = {_float(allowed[e]):.6g}"
    detail = (
        f"|actual - exact average| must be <= {bound} (exact average {want!r}); no summation order can "
        "overflow here"
        if not math.isfinite(actual[e])
        else f"|actual - exact average| = {_float(abs(Fraction(actual[e]) - sums[e] / n)):.6g} > {bound}"
    )
    return BoundCheck(ValueMismatch(index, chunk, want, actual[e], detail, len(bad)), skipped)


def _subset_extremes(mags: list[Fraction]) -> tuple[Fraction, Fraction]:
    """The smallest and largest product of two or more of ``mags`` (all positive; at least two)."""
    up = sorted(mags)
    low = up[0] * up[1]
    for m in up[2:]:
        if m >= 1:
            break
        low *= m
    down = up[::-1]
    high = down[0] * down[1]
    for m in down[2:]:
        if m <= 1:
            break
        high *= m
    return low, high


def _negative_product(xs: list[float]) -> bool:
    """The sign of any product of ``xs``: the exclusive or of their signs (IEEE 754), zeros included."""
    return sum(math.copysign(1.0, x) < 0 for x in xs) % 2 == 1


def _prod_element(xs: list[float], y: float, fmt: FloatFormat, g: Fraction) -> tuple[str, str]:
    """One element of :func:`check_prod_bound`: ``("ok" | "overflow" | "underflow" | "bad", why)``."""
    g_inner = fmt.gamma(max(len(xs) - 2, 0))
    product = math.prod((Fraction(x) for x in xs), start=Fraction(1))
    nonzero = [abs(Fraction(x)) for x in xs if x != 0]
    can_underflow = can_overflow = False
    if len(nonzero) >= 2:
        low, high = _subset_extremes(nonzero)
        can_underflow = low * (1 - g_inner) < Fraction(fmt.smallest_normal)
        can_overflow = high * (1 + g_inner) >= fmt.overflow_threshold
    negative = _negative_product(xs)
    finite = math.isfinite(y)
    distance = abs(Fraction(y) - product) if finite else Fraction(0)
    sign = "-" if negative else "+"
    rules = [
        (math.isnan(y) and product == 0 and can_overflow, "overflow", ""),
        (math.isnan(y), "bad", "NaN where no order can multiply an infinity by zero"),
        (
            (math.copysign(1.0, y) < 0) != negative,
            "bad",
            f"the sign of a product is the exclusive or of the signs: {sign} here",
        ),
        (product == 0 and y == 0, "ok", ""),
        (product == 0, "bad", "an input is zero, so every order gives a zero (or NaN after an overflow)"),
        (not finite and can_overflow, "overflow", ""),
        (not finite, "bad", "infinite, and no order can overflow here"),
        (can_underflow, "underflow", ""),
        (
            distance > g * abs(product),
            "bad",
            f"|actual - exact| = {_float(distance):.6g} > gamma_{len(xs) - 1} * |P| = "
            f"{_float(g * abs(product)):.6g}",
        ),
    ]
    return next(((verdict, why) for applies, verdict, why in rules if applies), ("ok", ""))


def check_prod_bound(case: Case, actual: list[float], layout: Layout = "even") -> BoundCheck:
    """The ``bound`` oracle for ``prod``: ``|y - P| <= gamma_{N-1} |P|``, ``P`` the exact product.

    Valid for any order when no multiplication underflows or overflows
    (Higham, Lemma 3.1): each of the ``N - 1`` products is rounded once, with
    relative error at most ``u``, where it is normal.  A product's operands
    are computed products of disjoint sets of inputs, so its exact value lies
    within ``(1 -+ gamma_{N-2})`` of the product ``P_S`` of one subset ``S``
    of two or more inputs; with ``L`` and ``H`` the smallest and largest such
    ``|P_S|`` over the non-zero inputs, no order underflows when
    ``L (1 - gamma_{N-2})`` is at least the smallest normal, and none overflows
    when ``H (1 + gamma_{N-2})`` is below the overflow threshold.  The sign of
    a product is the exclusive or of the signs (IEEE 754), zeros included, so
    it is checked on every element that is not NaN.  Per element:

    * a zero input: ``P = 0``; the result must be a zero (``0 * x`` is zero
      for every finite ``x``), or NaN (``inf * 0``) where the other inputs
      could overflow (counted, ``overflow_skipped``);
    * a non-finite result: accepted only where some order could overflow (counted);
    * where some order could underflow the bound does not hold: any value of
      the right sign is accepted, and counted (``underflow_skipped``);
    * else the bound.
    """
    fmt = format_of(case.dtype)
    g = fmt.gamma(case.n - 1)
    verdicts = [_prod_element(xs, y, fmt, g) for xs, y in zip(columns(case), actual, strict=True)]
    over = sum(v == "overflow" for v, _ in verdicts)
    under = sum(v == "underflow" for v, _ in verdicts)
    bad = [e for e, (v, _) in enumerate(verdicts) if v == "bad"]
    if not bad:
        return BoundCheck(None, over, under)
    e = bad[0]
    index, chunk = locate(case, e, layout)
    xs = columns(case)[e]
    product = math.prod((Fraction(x) for x in xs), start=Fraction(1))
    want = math.copysign(_float(product), -1.0 if _negative_product(xs) else 1.0)
    return BoundCheck(ValueMismatch(index, chunk, want, actual[e], verdicts[e][1], len(bad)), over, under)


def _first_bitwise(
    case: Case, expected: torch.Tensor, actual: torch.Tensor, what: str, layout: Layout
) -> ValueMismatch | None:
    diff = (bits(expected) != bits(actual)).reshape(-1).nonzero()
    if diff.numel() == 0:
        return None
    e = int(diff[0])
    index, chunk = locate(case, e, layout)
    want = float(expected.reshape(-1)[e])
    got = float(actual.reshape(-1)[e])
    return ValueMismatch(index, chunk, want, got, f"not bitwise equal to {what}", int(diff.numel()))


def as_float_list(result: torch.Tensor) -> list[float]:
    return [float(v) for v in result.detach().to(torch.float64).reshape(-1).tolist()]


class SavedOrder(NamedTuple):
    """The trees of a saved ``ring-ref reveal --json`` and the inputs they were revealed on."""

    n: int
    m: int
    dtype: torch.dtype
    trees: list[Tree]
    layout: Layout
    """The chunks of the ring the file names (or, naming none, the layout its ``N`` and ``M`` allow)."""


@dataclass(frozen=True)
class ExactOrder:
    """What ``exact`` compares with (clause ``difftest-exact-orders``): the spec's ring unless told otherwise.

    ``expected(case)`` is the result the order gives; ``option`` is how the
    command line names it (for the replay line); ``cases``, when set, is the
    strategy ``exact`` draws its inputs from instead of the usual one (an
    order saved for one ``N``, ``M`` and dtype covers only those); ``ops``,
    the ops ``expected`` computes (for the op the case carries, ``case.reduction``);
    ``source``, where the order came from (the report's ``exact_against``):
    ``spec``, ``schedule``, ``order`` (a saved reveal) or ``auto`` (``revealed``
    says where and how).  ``ring`` (a schedule's order) or ``saved`` (an order
    file's) gives the summation tree of every element (:meth:`trees`), from
    which the order probes are designed (clause ``difftest-order-probes``), and
    the chunk layout (:attr:`layout`).
    """

    name: str
    expected: Callable[[Case], torch.Tensor]
    option: str = ""
    cases: st.SearchStrategy[Case] | None = None
    ops: tuple[Op, ...] = ("sum",)
    source: str = "spec"
    ring: Schedule | None = None
    saved: SavedOrder | None = None
    revealed: str = ""
    preset: str | None = None
    """The preset named (``--schedule NAME``), whose order below ``N`` elements is its library's
    (:data:`~ring_ref.schedule.BELOW_N`, clause ``schedule-below-n``); ``None``: ``ring`` at every size."""

    @property
    def layout(self) -> Layout:
        """How the order cuts a buffer into chunks (its ring's, or its file's): the search draws ``M`` not
        divisible by ``N`` when the layout takes any ``M`` (``blocks``, ``gloo``), and reports label an
        element's chunk by it."""
        if self.ring is not None:
            return self.ring.layout
        return self.saved.layout if self.saved is not None else "even"

    @property
    def inputs(self) -> tuple[int, int, str] | None:
        """An order file's ``(N, M, dtype name)``, the only inputs ``exact`` draws with it."""
        return None if self.saved is None else (self.saved.n, self.saved.m, dtype_name(self.saved.dtype))

    def to_json(self) -> dict[str, object]:
        """The report's ``exact_against`` object (``spec/difftest_report.schema.json``)."""
        n, m, dtype = self.inputs if self.inputs is not None else (None, None, None)
        return {
            "source": self.source,
            "order": self.name,
            "option": self.option,
            "inputs": None if n is None else {"n": n, "m": m, "dtype": dtype},
            "revealed": self.revealed or None,
        }

    def trees(self, n: int, m: int, dtype: torch.dtype) -> list[Tree] | None:
        """The tree of each of the ``m`` elements (rows) at ``n`` workers in ``dtype`` (``None``: not known).

        >>> SPEC_ORDER.trees(3, 3, torch.float32)
        [((0, 1), 2), ((1, 2), 0), ((0, 2), 1)]
        """
        if self.ring is not None:
            ring = self.ring if self.preset is None else preset_schedule(self.preset, n, m)
            return ring_trees(ring, n, m, dtype_name(dtype))
        if self.saved is not None and self.saved[:3] == (n, m, dtype):
            return self.saved.trees
        return None

    def probe_sizes(self, n: int) -> tuple[int, ...]:
        """The ``M`` the order probes use at ``n`` workers: ``2N`` (every chunk non-empty), for a layout that
        takes any ``M`` ``2N - 1`` too, and where the trees depend on the layout the sizes that tell it
        from every other layout (:func:`ring_ref._order.layout_sizes`: ``2N + 1``, and where two layouts
        cut chunks differently); for a preset whose library runs another order below ``N`` elements,
        ``N - 1`` (clause ``schedule-below-n``); an order file's own ``M`` at its ``N``.

        >>> from dataclasses import replace
        >>> from ring_ref.schedule import GLOO, OPENMPI_RING
        >>> SPEC_ORDER.probe_sizes(4), replace(SPEC_ORDER, ring=GLOO).probe_sizes(4)
        ((8, 12), (8, 7, 9, 12))
        >>> replace(SPEC_ORDER, ring=OPENMPI_RING, preset="openmpi-ring").probe_sizes(4)
        (8, 7, 9, 3)
        """
        if self.ring is not None:
            sizes = (2 * n,) if self.ring.layout == "even" else (2 * n, 2 * n - 1)
            told = layout_sizes(self.ring.layout, n) if layout_matters(self.ring, n) else ()
            below = (n - 1,) if self.preset in BELOW_N and n > 1 else ()  # its library's order there
            return tuple(dict.fromkeys((*sizes, *told, *below)))
        if self.saved is not None and self.saved.n == n:
            return (self.saved.m,)
        return ()


SPEC_ORDER = ExactOrder(
    "the ring order (fold-order)",
    lambda case: ring_all_reduce(case.tensor(), op=case.reduction),
    ops=OPS,
    ring=SPEC,
)


def reduce_scatter_reference(
    worker_tensors: torch.Tensor, *, op: Op = "sum", schedule: str | Schedule | None = None
) -> torch.Tensor:
    """The reference reduce-scatter: ``(N, M, ...) -> (N, M/N, ...)``, row ``r`` rank ``r``'s shard.

    By the theorem of clause ``difftest-collectives``, shard ``r`` is chunk ``r``
    of the all-reduce on the ring that finishes chunk ``r`` at rank ``r``
    (:func:`ring_ref.schedule.reduce_scatter_ring`: for the spec, chunk ``c``
    folds ``c + 1, c + 2, ..., c``).  The one place the tester computes it: the
    fast engine's :func:`ring_ref.ring_reduce_scatter`.

    >>> x = torch.tensor([[1.0, 2.0], [10.0, 20.0]])
    >>> reduce_scatter_reference(x).tolist()
    [[11.0], [22.0]]
    """
    return ring_reduce_scatter(worker_tensors, schedule=schedule, op=op, engine="fast")


def gather_oracle(case: Case, result: torch.Tensor) -> ValueMismatch | None:
    """The all-gather oracle, every mode's: rank ``r``'s shard in slot ``r``, every bit copied."""
    expected = exact_tensor(case.values, case.dtype).reshape(result.shape)
    diff = (bits(expected) != bits(result)).reshape(-1).nonzero()
    if diff.numel() == 0:
        return None
    e = int(diff[0])
    index = tuple(int(v) for v in torch.unravel_index(torch.tensor(e), result.shape))
    want, got = bits(expected).reshape(-1)[e], bits(result).reshape(-1)[e]
    width = 2 * case.dtype.itemsize
    hexed = [f"0x{int(v) & ((1 << (4 * width)) - 1):0{width}x}" for v in (want, got)]
    slot = e // (len(case.values) // case.n)
    return ValueMismatch(
        index,
        slot,
        float(expected.reshape(-1)[e]),
        float(result.reshape(-1)[e]),
        f"bits {hexed[1]} where rank {slot}'s shard holds {hexed[0]} (an all-gather copies every bit)",
        int(diff.numel()),
    )


def exact_oracle(case: Case, result: torch.Tensor, order: ExactOrder = SPEC_ORDER) -> ValueMismatch | None:
    """``exact``: the result's bits are ``order``'s (by default the ring's, clause ``fold-order``)."""
    return _first_bitwise(case, order.expected(case), result, order.name, order.layout)


def all_negative_zeros(xs: Sequence[float]) -> bool:
    """Whether every value is ``-0.0``: then every order of IEEE additions gives ``-0.0``, a fold that
    starts from the sum's identity ``+0.0`` gives ``+0.0``, and the two are accepted outside ``exact``
    (clause ``difftest-oracles``).  Any other zero sum is ``+0.0`` in every order (round to nearest).

    >>> all_negative_zeros([-0.0, -0.0]), all_negative_zeros([-0.0, 0.0])
    (True, False)
    """
    return all(x == 0 and math.copysign(1.0, x) < 0 for x in xs)


def _zero_sum_signs(case: Case, expected: list[float], result: torch.Tensor) -> torch.Tensor:
    """``expected`` (the exact sums, zeros ``+0.0``) with the sign rule for zero sums: where every worker
    holds ``-0.0``, the result's own zero, else the ring's ``-0.0``."""
    got = result.detach().reshape(-1)
    for e, xs in enumerate(columns(case)):
        if all_negative_zeros(xs):
            expected[e] = float(got[e]) if bool(got[e] == 0) else -0.0
    return torch.tensor(expected, dtype=torch.float64).to(case.dtype).reshape(result.shape)


def order_free_oracle(case: Case, result: torch.Tensor, layout: Layout = "even") -> ValueMismatch | None:
    """``order-free``: where every partial sum is exact, the result is the exact sum, bit for bit
    (a zero sum of ``-0.0`` values: either zero, :func:`all_negative_zeros`)."""
    sums, _ = exact_sums(case)
    exact = [float(v) for v in torch.tensor([float(s) for s in sums], dtype=torch.float64).to(case.dtype)]
    if any(Fraction(v) != s for v, s in zip(exact, sums, strict=True)):
        raise AssertionError("order-free generator produced a sum that rounds; this is a ring_ref bug")
    return _first_bitwise(case, _zero_sum_signs(case, exact, result), result, "the exact sum", layout)


def _avg_order_free(case: Case, result: torch.Tensor, layout: Layout) -> ValueMismatch | None:
    """``avg`` on order-free inputs: every order's sum is the exact ``S``; the result is ``S / N`` rounded."""
    sums, _ = exact_sums(case)
    fmt = format_of(case.dtype)
    for s in sums:
        if Fraction(round_to(fmt, s)) != s:
            raise AssertionError("order-free generator produced a sum that rounds; this is a ring_ref bug")
    quotients = [round_to(fmt, s / case.n) for s in sums]
    expected = _zero_sum_signs(case, quotients, result)
    return _first_bitwise(case, expected, result, "the exact sum divided by N, rounded once", layout)


def _power_of_two_exponent(x: float) -> int | None:
    """``k`` when ``|x| = 2**k``, else ``None``."""
    mantissa, exponent = math.frexp(abs(x))
    return exponent - 1 if mantissa == 0.5 else None


def _prod_order_free(case: Case, result: torch.Tensor, layout: Layout) -> ValueMismatch | None:
    """``prod`` on powers of two and zeros whose every partial product is exact: the exact product, its
    sign the exclusive or of the signs."""
    fmt = format_of(case.dtype)
    lowest = fmt.emin - fmt.precision + 1
    want = []
    for xs in columns(case):
        exponents = [_power_of_two_exponent(x) for x in xs if x != 0]
        if any(k is None for k in exponents) or (
            sum(k for k in exponents if k is not None and k > 0) > fmt.emax
            or sum(k for k in exponents if k is not None and k < 0) < lowest
        ):
            raise AssertionError(
                "order-free generator produced a product that rounds; this is a ring_ref bug"
            )
        magnitude = 0.0 if len(exponents) < len(xs) else 2.0 ** sum(k for k in exponents if k is not None)
        want.append(-magnitude if _negative_product(xs) else magnitude)
    expected = torch.tensor(want, dtype=torch.float64).to(case.dtype).reshape(result.shape)
    return _first_bitwise(case, expected, result, "the exact product", layout)


def _extreme(xs: list[float], op: Op) -> float:
    return max(xs) if op == "max" else min(xs)


def extreme_oracle(case: Case, result: torch.Tensor, layout: Layout = "even") -> ValueMismatch | None:
    """``max``, ``min`` (order-free and bound): each element is, bit for bit, one of its inputs that equals
    the extreme; every fold order keeps one of those (which one, for zeros of both signs, depends on it)."""
    actual = as_float_list(result)
    bad = []
    for e, (xs, y) in enumerate(zip(columns(case), actual, strict=True)):
        best = _extreme(xs, case.reduction)
        if not any(x == y and math.copysign(1.0, x) == math.copysign(1.0, y) for x in xs if x == best):
            bad.append(e)
    if not bad:
        return None
    e = bad[0]
    index, chunk = locate(case, e, layout)
    xs = columns(case)[e]
    best = _extreme(xs, case.reduction)
    which = "maximum" if case.reduction == "max" else "minimum"
    holders = sorted({repr(x) for x in xs if x == best})
    if actual[e] == best:
        detail = (
            f"a zero of a sign no worker holds with the {which} there (the {which} is {' or '.join(holders)})"
        )
    else:
        detail = f"not the {which} of the workers' values there ({' or '.join(holders)})"
    return ValueMismatch(index, chunk, best, actual[e], detail, len(bad))


class Checked(NamedTuple):
    """A mode's verdict on one result: the first mismatch (or ``None``) and the elements accepted where
    the oracle's hypotheses could not be guaranteed (an order could overflow; for ``prod``, underflow)."""

    mismatch: ValueMismatch | None
    overflow_skipped: int = 0
    underflow_skipped: int = 0


def check_values(mode: Mode, case: Case, result: torch.Tensor, order: ExactOrder = SPEC_ORDER) -> Checked:
    """The mode's oracle for the case's op on a well-formed result (see the module docstring); a
    reduce-scatter's result as the all-reduce its shards make (:func:`ring_ref.difftest._call.results`),
    an all-gather's by :func:`gather_oracle` in every mode.

    ``order`` is what ``exact`` checks against (clause ``difftest-exact-orders``); its layout labels
    every mismatch's chunk, whatever the mode.
    """
    op, layout = case.reduction, order.layout
    if mode == "exact" or case.collective.gathers:
        copy = case.collective.gathers
        return Checked(gather_oracle(case, result) if copy else exact_oracle(case, result, order))
    if op in ("max", "min"):
        return Checked(extreme_oracle(case, result, layout))
    if mode == "order-free":
        if op == "avg":
            return Checked(_avg_order_free(case, result, layout))
        if op == "prod":
            return Checked(_prod_order_free(case, result, layout))
        return Checked(order_free_oracle(case, result, layout))
    bound = {"avg": check_avg_bound, "prod": check_prod_bound}.get(op, check_bound)
    checked = bound(case, as_float_list(result), layout)
    return Checked(checked.mismatch, checked.overflow_skipped, checked.underflow_skipped)


def zeros_as_the_oracle_wants(
    mode: Mode, case: Case, result: torch.Tensor, order: ExactOrder = SPEC_ORDER
) -> torch.Tensor | None:
    """``result`` with each zero given the sign the mode's oracle wants there, where it wants a zero.

    ``None`` for ``sum`` and ``avg`` outside ``exact`` (their oracles have no
    zero of their own to offer).  When this passes the oracle and ``result``
    does not, the result is wrong only in the sign of zeros (``signed-zero``).
    """
    op = case.reduction
    flat = result.detach().reshape(-1).clone()
    zero = flat == 0
    if mode == "exact":
        expected = order.expected(case).reshape(-1)
        return torch.where(zero & (expected == 0), expected, flat).reshape(result.shape)
    if op in ("sum", "avg"):
        return None
    for e, xs in enumerate(columns(case)):
        if not bool(zero[e]):
            continue
        if op == "prod":
            if 0.0 in xs:
                flat[e] = -0.0 if _negative_product(xs) else 0.0
        elif _extreme(xs, op) == 0:
            flat[e] = next(x for x in xs if x == 0)
    return flat.reshape(result.shape)
