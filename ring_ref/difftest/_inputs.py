"""Inputs: the generated cases, their memory layouts, order-free values and one-hot probes.

A :class:`Case` holds exact values (Python floats already representable in its
dtype) and the op asked for, so it can be rebuilt, shown in a report and
replayed.  :func:`cases` is the Hypothesis strategy for one mode and op;
:func:`one_worker_cases` are the ``N = 1`` cases always run first, and
:func:`uneven_cases` the ones of ``M`` not divisible by ``N`` when the layout takes any ``M``;
:func:`every_n_cases` the value probes and pseudo-random cases every ``N`` gets in every mode;
:func:`probe_cases` are the diagnosis' one-hot inputs.

What is drawn depends on the op (clause ``difftest-ops``): ``sum`` and ``avg``
as described in :func:`cases`; ``prod`` powers of two whose every partial
product is exact (order-free) or values near one whose every partial product
stays in the normal range (exact, bound); ``max`` and ``min`` many ties,
zeros of both signs among them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, cast

import torch
from hypothesis import strategies as st

from ring_ref._dtypes import dtype_name, format_of
from ring_ref.difftest._vocabulary import DTYPES, Collective, Mode, Op

__all__ = [
    "LAYOUTS",
    "MAX_NUMEL",
    "ORDER_FREE_EXPONENTS",
    "TIES",
    "Case",
    "cases",
    "every_n_cases",
    "exact_tensor",
    "gather_values",
    "lay_out",
    "near_one_log_bound",
    "one_worker_cases",
    "order_free_k_bound",
    "order_free_values",
    "probe_cases",
    "prod_exponent_bound",
    "uneven_cases",
]

LAYOUTS: Final = ("contiguous", "transposed", "strided", "sliced")
MAX_NUMEL: Final = 256


@dataclass(frozen=True)
class Case:
    """One generated input: shape, dtype, memory layout and the values (exact, as Python floats)."""

    n: int
    m: int
    trailing: tuple[int, ...]
    dtype: torch.dtype
    layout: str
    values: tuple[float, ...]
    op: Op | None = None
    """The op asked for (``--op``); ``None`` when none was given: the target is called without ``op=``
    and must sum."""
    collective: Collective = Collective.ALL_REDUCE
    """What the target computes (``--collective``, its name read as the value): the values are its input
    either way, ``(N, M, ...)``; for ``all-gather`` ``M`` is the shard's rows ``S``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "collective", Collective(self.collective))

    def result_shape(self, rank: int | None = None) -> tuple[int, ...]:
        """The shape of a correct result, stacked (``rank`` ``None``) or of one rank.

        >>> c = Case(2, 4, (3,), torch.float32, "contiguous", (0.0,) * 24, collective="reduce-scatter")
        >>> c.result_shape(), c.result_shape(1), replace(c, collective="all-gather").result_shape(0)
        ((2, 2, 3), (2, 3), (8, 3))
        """
        return self.collective.result_shape(self.n, self.m, self.trailing, rank)

    def output_tensor(self, rank: int) -> torch.Tensor:
        """A fresh output buffer for ``rank``'s ``TARGET(output, input)`` (reduce-scatter, all-gather),
        filled with NaN, so that an element the target never writes cannot pass."""
        return torch.full(self.result_shape(rank), math.nan, dtype=self.dtype)

    @property
    def reduction(self) -> Op:
        """The op the result is checked for: :attr:`op`, or ``"sum"`` when none was given."""
        return self.op or "sum"

    @property
    def shape(self) -> tuple[int, ...]:
        """``(N, M, *trailing)``."""
        return (self.n, self.m, *self.trailing)

    def tensor(self) -> torch.Tensor:
        """A fresh tensor holding the values in the case's layout (``strided``, ``sliced``: non-contiguous).

        >>> Case(2, 2, (), torch.float32, "sliced", (1.0, 2.0, 3.0, 4.0)).tensor().is_contiguous()
        False
        """
        return lay_out(exact_tensor(self.values, self.dtype).reshape(self.shape), self.layout)

    def rank_tensor(self, rank: int) -> torch.Tensor:
        """A fresh contiguous ``(M, ...)`` tensor holding worker ``rank``'s values (a per-rank input).

        >>> Case(2, 2, (), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0)).rank_tensor(1).tolist()
        [3.0, 4.0]
        """
        per_rank = len(self.values) // self.n
        row = self.values[rank * per_rank : (rank + 1) * per_rank]
        return exact_tensor(row, self.dtype).reshape(self.m, *self.trailing)

    def to_json(self) -> dict[str, Any]:
        """The input as JSON: shape, dtype, layout, op and the nested values."""
        nested = _json_nested(torch.tensor(self.values, dtype=torch.float64).reshape(self.shape).tolist())
        return {
            "n": self.n,
            "m": self.m,
            "shape": list(self.shape),
            "dtype": dtype_name(self.dtype),
            "layout": self.layout,
            "op": self.reduction,
            "input": nested,
        }


def exact_tensor(values: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of ``dtype`` holding ``values`` (each representable in it) bit for bit, quiet NaNs'
    payloads included (a bfloat16 NaN from the top half of float32's bits: converting drops its payload).

    >>> nan = torch.tensor([0x7FC5], dtype=torch.int16).view(torch.bfloat16).item()
    >>> hex(int(exact_tensor([nan, -0.0], torch.bfloat16).view(torch.int16)[0]))
    '0x7fc5'
    """
    wide = torch.tensor(list(values), dtype=torch.float64)
    if dtype != torch.bfloat16:
        return wide.to(dtype)
    high = torch.bitwise_right_shift(wide.to(torch.float32).view(torch.int32), 16)
    return torch.where(torch.isnan(wide), high.to(torch.int16).view(torch.bfloat16), wide.to(dtype))


def _json_nested(value: Any) -> Any:
    """Nested lists of floats with each non-finite one as the string ``"inf"``, ``"-inf"`` or ``"nan"``."""
    if isinstance(value, list):
        return [_json_nested(v) for v in value]
    return value if math.isfinite(value) else str(value)


def lay_out(dense: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as ``dense`` in a ``contiguous``, ``transposed``, ``strided`` or ``sliced`` tensor."""
    if layout == "transposed":
        return dense.transpose(0, 1).contiguous().transpose(0, 1)
    if layout == "strided":
        wide = torch.zeros((*dense.shape[:-1], 2 * dense.shape[-1]), dtype=dense.dtype)
        wide[..., ::2] = dense
        return wide[..., ::2]
    if layout == "sliced":
        padded = torch.zeros((*dense.shape[:-1], dense.shape[-1] + 1), dtype=dense.dtype)
        padded[..., 1:] = dense
        return padded[..., 1:]
    return dense.clone()


def _in_dtype(raw: Sequence[float], dtype: torch.dtype) -> tuple[float, ...]:
    """Round ``raw`` to ``dtype`` (overflow clamped to the largest finite value); exact floats back."""
    t = torch.tensor(list(raw), dtype=torch.float64).to(dtype)
    big = format_of(dtype).max_finite
    t = torch.where(torch.isinf(t), torch.sign(t) * big, t).to(dtype)
    return tuple(float(v) for v in t.to(torch.float64).tolist())


ORDER_FREE_EXPONENTS: Final = (-8, 4)
"""The shared exponent ``e`` of order-free inputs is drawn from this range (inclusive)."""


def order_free_k_bound(dtype: torch.dtype, n: int) -> int:
    """The largest ``|k|`` of order-free inputs ``k * 2**e`` for ``n`` workers: ``floor(2**p / n)``.

    Any partial sum of ``n`` such values, in any order, is ``K * 2**e`` with
    ``|K| <= 2**p``, which the dtype represents exactly (for ``e`` in
    :data:`ORDER_FREE_EXPONENTS`: ``2**(p + 4)`` stays below float16's maximum
    and ``2**-8`` above its subnormal spacing).

    >>> order_free_k_bound(torch.float16, 16), order_free_k_bound(torch.bfloat16, 3)
    (128, 85)
    """
    return (1 << format_of(dtype).precision) // n


def prod_exponent_bound(dtype: torch.dtype, n: int) -> int:
    """The largest ``|k|`` of order-free ``prod`` inputs ``+-2**k``: ``min(emax, p - 1 - emin) // n``.

    Any partial product of ``n`` such values, in any order, is ``+-2**K`` with
    ``|K| <= n |k|``, between the smallest subnormal ``2**(emin - p + 1)`` and
    ``2**emax``: exactly representable, so every multiplication is exact (and
    the sign of a product, zeros included, is the exclusive or of the signs).

    >>> prod_exponent_bound(torch.float16, 2), prod_exponent_bound(torch.float16, 16)
    (7, 0)
    """
    fmt = format_of(dtype)
    return min(fmt.emax, fmt.precision - 1 - fmt.emin) // n


def near_one_log_bound(dtype: torch.dtype, n: int) -> float:
    """``T``: ``prod`` inputs of magnitude ``2**t``, ``|t| <= T``, keep every partial product normal.

    ``T = (min(emax, -emin) - 1) / n``: a product of at most ``n`` of them lies
    within ``2**(emin + 1)`` and ``2**(emax - 1)``, a factor of 2 inside the
    normal range, which absorbs the values' own rounding and the ``N - 2``
    roundings before the last multiplication (at most ``(1 + u)**n (1 + gamma_{n-2})``,
    below 1.7 for every dtype up to ``n = 64``), so no order underflows or overflows.

    >>> near_one_log_bound(torch.float16, 2), near_one_log_bound(torch.float32, 16)
    (6.5, 7.8125)
    """
    fmt = format_of(dtype)
    return (min(fmt.emax, -fmt.emin) - 1) / n


TIES: Final = (0.0, -0.0, 1.0, -1.0, 2.0, -2.0)
"""The values ``max`` and ``min`` inputs are drawn from besides random ones: ties, zeros of both signs."""


def _signed(negative: bool, magnitude: float) -> float:
    return -magnitude if negative else magnitude


def _pow2(rng: random.Random, k_max: int) -> float:
    """``+-2**k`` with ``|k| <= k_max``, or (one time in eight) a zero of either sign."""
    if rng.random() < 0.125:
        return rng.choice((0.0, -0.0))
    return _signed(rng.random() < 0.5, 2.0 ** rng.randint(-k_max, k_max))


def order_free_values(
    dtype: torch.dtype, n: int, count: int, rng: random.Random, op: Op = "sum"
) -> tuple[float, ...]:
    """``count`` order-free values for ``op`` over ``n`` workers in ``dtype``.

    ``sum`` and ``avg``: ``k * 2**e`` whose every partial sum is exact;
    ``prod``: ``+-2**k`` or zeros whose every partial product is exact
    (:func:`prod_exponent_bound`); ``max``, ``min``: :data:`TIES`.

    >>> vals = order_free_values(torch.bfloat16, 16, 4, random.Random(0))
    >>> all(abs(v) * 16 <= 2**8 * 2**4 for v in vals)
    True
    >>> set(order_free_values(torch.float16, 16, 8, random.Random(0), "prod")) <= {1.0, -1.0, 0.0}
    True
    """
    if op == "prod":
        k_max = prod_exponent_bound(dtype, n)
        return tuple(_pow2(rng, k_max) for _ in range(count))
    if op in ("max", "min"):
        return tuple(rng.choice(TIES) for _ in range(count))
    bound = order_free_k_bound(dtype, n)
    scale = 2.0 ** rng.randint(*ORDER_FREE_EXPONENTS)
    return tuple(rng.randint(-bound, bound) * scale for _ in range(count))


def _near_one(dtype: torch.dtype, n: int, count: int, rng: random.Random) -> tuple[float, ...]:
    """Values ``+-2**t``, ``|t| <= T`` (:func:`near_one_log_bound`), rounded to ``dtype``; a few zeros."""
    t_max = near_one_log_bound(dtype, n)
    raw = [
        rng.choice((0.0, -0.0))
        if rng.random() < 0.0625
        else _signed(rng.random() < 0.5, 2.0 ** rng.uniform(-t_max, t_max))
        for _ in range(count)
    ]
    return _in_dtype(raw, dtype)


def _random_floats(dtype: torch.dtype, fill: str, count: int, rng: random.Random) -> tuple[float, ...]:
    """Random finite values of ``dtype``: ``normal`` (moderate) or ``wide`` (any finite bit pattern)."""
    if fill == "normal":
        raw = [rng.gauss(0.0, 1.0) * 2.0 ** rng.randint(-6, 6) for _ in range(count)]
        return _in_dtype(raw, dtype)
    fmt = format_of(dtype)
    width = fmt.bits
    patterns = torch.tensor([rng.getrandbits(width) - 2 ** (width - 1) for _ in range(count)])
    wide = patterns.to(fmt.int_dtype).view(dtype)
    wide = torch.where(torch.isfinite(wide), wide, torch.zeros((), dtype=dtype))
    return tuple(float(v) for v in wide.to(torch.float64).tolist())


@st.composite
def cases(
    draw: st.DrawFn,
    mode: Mode,
    dtypes: Sequence[torch.dtype] = tuple(DTYPES.values()),
    max_workers: int = 16,
    layouts: Sequence[str] = LAYOUTS,
    *,
    op: Op | None = None,
    any_m: bool = False,
    collective: Collective = Collective.ALL_REDUCE,
    min_workers: int = 1,
) -> Case:
    """A valid ring input for ``mode``: ``M`` a multiple of ``N``, at most :data:`MAX_NUMEL` elements.

    ``layouts``: the memory layouts to draw from (per-rank targets get
    contiguous tensors only, one per rank).  ``any_m``: the expected order's
    chunk layout takes any ``M`` (``blocks``, ``gloo``), so half the draws
    have any ``M`` from 1 to ``3 N`` (``M < N``, some chunks empty, and ``M``
    not divisible by ``N`` among them).

    The values are a *fill* (zeros, or a pseudo-random stream from a drawn
    seed) with up to eight drawn elements written over it.  That keeps the
    number of Hypothesis choices small whatever the size, so shrinking is
    fast and ends at a readable input: few workers, mostly zeros.

    ``op`` (``None``: none given, a sum) picks the values: ``sum``, ``avg``:
    order-free ``k * 2**e`` or random ones (moderate, any finite bit pattern,
    then scaled down by a drawn headroom); ``prod``: order-free ``+-2**k`` and
    zeros, else values near one (:func:`near_one_log_bound`); ``max``,
    ``min``: :data:`TIES` and zeros of random sign (order-free), also random
    ones (exact, bound).  Every case carries ``op``.  ``N`` is drawn from
    ``min_workers`` to ``max_workers`` (a job's ranks: its world size only).

    ``collective``: every case carries it; ``all-gather`` draws shards of any
    ``M`` rows holding any bits (:func:`gather_values`), whatever the mode.
    """
    reduction: Op = op or "sum"
    dtype = draw(st.sampled_from(tuple(dtypes)))
    n = draw(st.integers(min_workers, max_workers))
    if collective.gathers:
        return draw(_gather_cases(dtype, n, layouts))
    if any_m and draw(st.booleans()):
        m = draw(st.integers(1, max(1, min(3 * n, MAX_NUMEL // n))))
    else:
        m = n * draw(st.integers(1, max(1, min(3, MAX_NUMEL // (n * n)))))
    trailing: tuple[int, ...] = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    if n * m * math.prod(trailing) > MAX_NUMEL:
        trailing = ()
    count = n * m * math.prod(trailing)
    layout = draw(st.sampled_from(tuple(layouts)))
    order_free = mode == "order-free"
    rng = random.Random()
    values, element = _draw_fill(
        draw, reduction, order_free=order_free, dtype=dtype, n=n, count=count, rng=rng
    )
    for index, value in draw(st.lists(st.tuples(st.integers(0, count - 1), element), max_size=8)):
        values[index] = value
    if not order_free and reduction != "prod":
        headroom = draw(st.sampled_from((0, n.bit_length() + 1)))
        values = list(_in_dtype([v * 2.0**-headroom for v in values], dtype))
    elif not order_free:
        values = list(_in_dtype(values, dtype))
    return Case(n, m, trailing, dtype, layout, tuple(values), op, collective)


def _special_values(dtype: torch.dtype) -> tuple[float, ...]:
    """The values a copy most easily changes: zeros of both signs, infinities, the extreme subnormals,
    quiet NaNs of both signs with the smallest and the largest payload."""
    fmt = format_of(dtype)
    mantissa = (1 << (fmt.precision - 1)) - 1
    exponent = ((1 << (fmt.bits - 1)) - 1) ^ mantissa
    quiet, sign = 1 << (fmt.precision - 2), 1 << (fmt.bits - 1)
    patterns = (exponent | quiet | 1, exponent | mantissa, sign | exponent | quiet | 3)
    nans = [_float_of_bits(dtype, p) for p in patterns]
    tiny = fmt.min_subnormal
    top = fmt.smallest_normal - tiny
    return (0.0, -0.0, math.inf, -math.inf, tiny, -tiny, top, -top, *nans)


def _float_of_bits(dtype: torch.dtype, pattern: int) -> float:
    """The value of ``dtype`` whose bits are ``pattern`` (a Python float: a NaN keeps its payload)."""
    fmt = format_of(dtype)
    signed = pattern - (1 << fmt.bits) if pattern >= 1 << (fmt.bits - 1) else pattern
    return float(torch.tensor([signed], dtype=torch.int64).to(fmt.int_dtype).view(dtype).to(torch.float64))


def gather_values(dtype: torch.dtype, count: int, rng: random.Random) -> tuple[float, ...]:
    """``count`` values for an all-gather, whose result must copy every bit: half any bit pattern of
    ``dtype`` (NaNs with their payloads, infinities, subnormals among them), half special values
    (zeros of both signs, infinities, subnormals, NaNs of both signs and several payloads).

    >>> values = gather_values(torch.float16, 64, random.Random(0))
    >>> any(math.isnan(v) for v in values), any(math.copysign(1.0, v) < 0 and v == 0 for v in values)
    (True, True)
    """
    fmt = format_of(dtype)
    specials = _special_values(dtype)
    return tuple(
        rng.choice(specials) if rng.random() < 0.5 else _float_of_bits(dtype, rng.getrandbits(fmt.bits))
        for _ in range(count)
    )


@st.composite
def _gather_cases(draw: st.DrawFn, dtype: torch.dtype, n: int, layouts: Sequence[str]) -> Case:
    """An all-gather case: ``N`` shards of ``M`` rows (any ``M``) holding any bits, a few special."""
    m = draw(st.integers(1, max(1, min(3, MAX_NUMEL // (n * n)))))
    trailing: tuple[int, ...] = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    if n * n * m * math.prod(trailing) > MAX_NUMEL:
        trailing = ()
    count = n * m * math.prod(trailing)
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    values = list(gather_values(dtype, count, rng) if draw(st.booleans()) else [0.0] * count)
    specials = st.sampled_from(_special_values(dtype))
    for index, value in draw(st.lists(st.tuples(st.integers(0, count - 1), specials), max_size=8)):
        values[index] = value
    layout = draw(st.sampled_from(tuple(layouts)))
    return Case(n, m, trailing, dtype, layout, tuple(values), collective=Collective.ALL_GATHER)


def _draw_fill(
    draw: st.DrawFn, op: Op, *, order_free: bool, dtype: torch.dtype, n: int, count: int, rng: random.Random
) -> tuple[list[float], st.SearchStrategy[float]]:
    """The fill (``count`` values) and the strategy for the elements drawn over it, per op and mode."""
    fills: tuple[str, ...]
    if op in ("max", "min"):
        fills = ("zeros", "ties") if order_free else ("zeros", "ties", "normal", "wide")
    elif op == "prod":
        fills = ("zeros", "random")
    else:
        fills = ("zeros", "random") if order_free else ("zeros", "normal", "wide")
    fill = draw(st.sampled_from(fills))
    rng.seed(draw(st.integers(0, 2**32 - 1)))
    # Hypothesis draws float16, float32 or float64; bfloat16 values are float32 ones, rounded.
    width = cast(Literal[16, 32, 64], 16 if dtype == torch.float16 else max(32, format_of(dtype).bits))
    floats = st.floats(allow_nan=False, allow_infinity=False, width=width)
    if op in ("max", "min"):
        zeros = [rng.choice((0.0, -0.0)) for _ in range(count)]
        if fill == "zeros":
            values = zeros
        elif fill == "ties":
            values = [rng.choice(TIES) for _ in range(count)]
        else:
            values = list(_random_floats(dtype, fill, count, rng))
        return values, (st.sampled_from(TIES) if order_free else st.one_of(st.sampled_from(TIES), floats))
    if op == "prod":
        if order_free:
            k_max = prod_exponent_bound(dtype, n)
            values = [0.0] * count if fill == "zeros" else [_pow2(rng, k_max) for _ in range(count)]
            powers = st.tuples(st.booleans(), st.integers(-k_max, k_max)).map(
                lambda t: _signed(t[0], 2.0 ** t[1])
            )
            return values, st.one_of(powers, st.sampled_from((0.0, -0.0)))
        t_max = near_one_log_bound(dtype, n)
        values = [0.0] * count if fill == "zeros" else list(_near_one(dtype, n, count, rng))
        near = st.tuples(st.booleans(), st.floats(-t_max, t_max)).map(lambda t: _signed(t[0], 2.0 ** t[1]))
        return values, st.one_of(near, st.sampled_from((0.0, -0.0)))
    # zeros of one sign: all -0.0 is where a fold from +0.0 and the ring's differ (clause difftest-oracles)
    zeros = [rng.choice((0.0, -0.0))] * count
    if order_free:
        bound = order_free_k_bound(dtype, n)
        scale = 2.0 ** draw(st.integers(*ORDER_FREE_EXPONENTS))
        values = zeros if fill == "zeros" else [rng.randint(-bound, bound) * scale for _ in range(count)]
        return values, st.one_of(st.integers(-bound, bound).map(lambda k: k * scale), st.just(-0.0))
    values = zeros if fill == "zeros" else list(_random_floats(dtype, fill, count, rng))
    return values, floats


def one_worker_cases(
    mode: Mode,
    dtypes: Sequence[torch.dtype],
    *,
    per_rank: bool = False,
    op: Op | None = None,
    collective: Collective = Collective.ALL_REDUCE,
) -> list[Case]:
    """Explicit ``N = 1`` cases, always run first: per dtype one contiguous and one non-contiguous input.

    The non-contiguous one alternates between the ``sliced`` and ``strided``
    layouts, with a trailing dimension so that torch does not call it
    contiguous; ``per_rank``: contiguous, as a rank's tensor always is.
    ``prod`` gets powers of two, ``max`` and ``min`` zeros of both signs too.

    >>> [(c.n, c.layout, c.tensor().is_contiguous()) for c in one_worker_cases("bound", [torch.float16])]
    [(1, 'contiguous', True), (1, 'sliced', False)]
    """
    if op == "prod":
        values: tuple[float, ...] = (2.0, -0.5, 0.25, -0.0)
    elif op in ("max", "min"):
        values = (-0.0, 1.5, 0.0, -3.0)
    else:
        values = (3.0, -1.5, 0.25, 2.0) if mode == "order-free" else (1.5, -3.0e-3, 0.1, 7.0)
    out = []
    for k, dtype in enumerate(dtypes):
        # all-gather: a NaN with a payload, -0, a subnormal, an infinity (every value exact in the dtype)
        exact = (
            tuple(_special_values(dtype)[i] for i in (8, 1, 4, 3))
            if collective.gathers
            else _in_dtype(values, dtype)
        )
        out.append(Case(1, 2, (), dtype, "contiguous", exact[:2], op, collective))
        layout = "contiguous" if per_rank else ("sliced", "strided")[k % 2]
        out.append(Case(1, 2, (2,), dtype, layout, exact, op, collective))
    return out


UNEVEN_SHAPES: Final = ((2, 3), (3, 4), (4, 2))
"""``(N, M)`` of the explicit cases run first when the layout takes any ``M``: ``M mod N = 1``, and
``M < N`` (empty chunks)."""


def uneven_cases(
    mode: Mode,
    dtypes: Sequence[torch.dtype],
    max_workers: int,
    *,
    per_rank: bool = False,
    op: Op | None = None,
    min_workers: int = 1,
) -> list[Case]:
    """Explicit cases of ``M`` not divisible by ``N`` (:data:`UNEVEN_SHAPES`, ``N`` from ``min_workers``
    to ``max_workers``), run first when the expected order's layout takes any ``M``: a ring that
    mishandles the remainder fails on them whatever the seed.  The values are
    :func:`one_worker_cases`', repeated.

    >>> [(c.n, c.m, c.layout) for c in uneven_cases("exact", [torch.float32], 3)]
    [(2, 3, 'sliced'), (3, 4, 'transposed')]
    """
    values = one_worker_cases(mode, dtypes[:1], op=op)[1].values
    out = []
    for k, (n, m) in enumerate(UNEVEN_SHAPES):
        if min_workers <= n <= max_workers:
            dtype = dtypes[k % len(dtypes)]
            layout = "contiguous" if per_rank else ("sliced", "transposed")[k % 2]
            repeated = _in_dtype([values[i % len(values)] for i in range(n * m)], dtype)
            out.append(Case(n, m, (), dtype, layout, repeated, op))
    return out


def _position_values(op: Op, n: int, m: int, precision: int, one_hot: int | None) -> list[float]:
    """Worker-major values that tell every element apart: worker ``w``'s element ``i`` holds
    ``1 + i + w M`` (``1 + i mod P`` where those sums would not be exact in ``precision`` bits), or, with
    ``one_hot``, ``1 + i`` in that worker alone and zeros elsewhere; ``prod``: powers of two near one
    (``2^((i + w) mod 3 - 1)``; with ``one_hot``, ones elsewhere), whose every partial product is exact."""
    if op == "prod":
        rows = [
            [2.0 ** ((i + w) % 3 - 1) if one_hot in (None, w) else 1.0 for i in range(m)] for w in range(n)
        ]
        return [v for row in rows for v in row]
    distinct = one_hot is None and n * n * m <= 1 << precision
    period = max(1, min(m, (1 << precision) // n))  # where not distinct: N (1 + i mod period) is exact
    return [
        (1.0 + (i + w * m if distinct else i % period)) if one_hot in (None, w) else 0.0
        for w in range(n)
        for i in range(m)
    ]


def every_n_cases(
    mode: Mode,
    dtypes: Sequence[torch.dtype],
    workers: range,
    *,
    seed: int,
    per_rank: bool = False,
    op: Op | None = None,
    collective: Collective = Collective.ALL_REDUCE,
    drawn: bool = True,
) -> list[Case]:
    """Per ``N`` of ``workers``, three cases run first in every mode, whatever the seed (clause
    ``difftest-every-n``): a *position probe* (every element of every worker told apart), a *one-hot
    probe* (the last worker alone), both of ``M = N`` in the dtype of most precision, whose every
    partial sum (product) is exact; and (``drawn``) a pseudo-random case of the mode's own values from
    ``seed``.

    A value bug at one ``N`` (a wrong chunk, a lost worker) fails all of them in every mode that can
    see it, where the search might draw that ``N`` only with zeros.

    >>> [(c.n, c.m) for c in every_n_cases("bound", [torch.float32], range(2, 4), seed=0)]
    [(2, 2), (2, 2), (2, 2), (3, 3), (3, 3), (3, 3)]
    >>> every_n_cases("order-free", [torch.float16], range(2, 3), seed=0)[0].values
    (1.0, 2.0, 3.0, 4.0)
    """
    reduction: Op = op or "sum"
    widest = max(dtypes, key=lambda d: format_of(d).precision)
    layouts = ("contiguous",) if per_rank else LAYOUTS
    out = []
    for n in workers:
        m = 2 if collective.gathers else n
        dtype = dtypes[n % len(dtypes)]
        rng = random.Random(seed * 1_000_003 + n)
        count = n * m
        values: tuple[float, ...]
        if collective.gathers:
            values = gather_values(dtype, count, rng)
        elif mode == "order-free":
            values = order_free_values(dtype, n, count, rng, reduction)
        elif reduction == "prod":
            values = _near_one(dtype, n, count, rng)
        else:
            scale = 2.0 ** -(n.bit_length() + 1)
            values = _in_dtype([v * scale for v in _random_floats(dtype, "normal", count, rng)], dtype)
        precision = format_of(widest).precision
        for one_hot in (None, n - 1):
            probe = _in_dtype(_position_values(reduction, n, m, precision, one_hot), widest)
            out.append(Case(n, m, (), widest, "contiguous", probe, op, collective))
        if drawn:
            out.append(Case(n, m, (), dtype, layouts[n % len(layouts)], values, op, collective))
    return out


def probe_cases(case: Case, base: float = 0.0, mark: float = 1.0) -> list[Case]:
    """Per worker ``j``, a probe: the case's shape, dtype, layout and op; ``mark`` in worker ``j``, else
    ``base`` (by default ones in worker ``j``, zeros elsewhere: one-hot)."""
    per_worker = len(case.values) // case.n
    return [
        replace(
            case, values=tuple(mark if i == j else base for i in range(case.n) for _ in range(per_worker))
        )
        for j in range(case.n)
    ]
