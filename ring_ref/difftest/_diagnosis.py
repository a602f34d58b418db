"""Diagnosis: name what went wrong with codes from :data:`~ring_ref.difftest.CODES`.

Structural codes come first (no answer: ``timed-out``, ``crashed``; then
exceptions, shape, dtype, device, mutation, aliasing); for wrong values,
one-hot probes (only worker ``j`` holds a mark) count each worker's
contributions per element, which tells double counting and lost workers from
a mean and from a correct sum in another order.  For the other ops
(clause ``difftest-ops``) the probes' values are the op's (``prod``: 2 among
ones; ``min``: -1 among zeros), an *op probe* (workers holding 2, 3, 2, 3, ...,
where every op gives a different exact value) names the op a target computed
instead (``sum-not-op``, ``wrong-op``), rows all equal to one value tell an
average of contributions divided first (``avg-divided-first``), and a result
wrong only in the sign of zeros is ``signed-zero``.  Wrong values that are all
values of a narrower dtype, within that dtype's bound of the inputs rounded to
it, are ``narrowed-dtype``: computed there and widened back.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Final, cast

import torch

from ring_ref._dispatch import ring_all_reduce
from ring_ref._dtypes import FloatFormat, bits, dtype_name, format_of
from ring_ref._order import format_tree
from ring_ref.difftest._call import Outcome, RaisedAt, shards, well_formed
from ring_ref.difftest._call import results as results_of
from ring_ref.difftest._diagnosis_probes import (
    PROBE_VALUES,
    counts_by_rank,
    counts_once,
    is_mean,
    lost_workers,
    off_counts,
    op_on_probe,
    op_probe_values,
    position_probe,
    scaled_first,
    several_workers,
    times_reciprocal,
    who,
)
from ring_ref.difftest._inputs import Case, exact_tensor, order_free_values, probe_cases
from ring_ref.difftest._launch import Launcher, as_launcher
from ring_ref.difftest._oracles import (
    SPEC_ORDER,
    ExactOrder,
    ValueMismatch,
    as_float_list,
    check_values,
    exact_sums,
    flat_of,
    gather_oracle,
    locate,
    round_to,
    zeros_as_the_oracle_wants,
)
from ring_ref.difftest._verdict import first_disagreement, structural
from ring_ref.difftest._vocabulary import Mode, Op, OpTarget, Target
from ring_ref.schedule import Layout

if TYPE_CHECKING:
    from ring_ref.difftest._orders import Explained

_COUNTING: Final = (
    "double-counted",
    "mean-not-sum",
    "sum-not-op",
    "wrong-op",
    "avg-divided-first",
    "avg-times-reciprocal",
)
"""Value codes that the probes establish for every input, not only the counterexample."""

_WORDS: Final[dict[float, str]] = {0.0: "zeros", 1.0: "ones"}

ROUNDS_ONCE: Final = (
    "the target accumulates in higher precision or otherwise does not round after every addition"
)
"""What ``not-ring-order`` says of a target no tree of additions explains that rounds the exact sum."""

__all__ = ["ROUNDS_ONCE", "Finding", "diagnose", "gather_findings", "plus_zeros_only", "wrong_shard"]


@dataclass
class Finding:
    """Diagnosis codes for one counterexample, with a human explanation (and a stack, if one was taken).

    ``mismatch`` is the element shown; for a group, of ``ranks[0]``.
    """

    codes: list[str]
    explanation: str
    mismatch: ValueMismatch | None = None
    stack: str = ""
    ranks: list[int] = field(default_factory=list)
    """For a group: the ranks that failed (or disagree, or did not answer)."""
    raised_at: RaisedAt | None = None
    """``raised``: where the (first raising rank's) target raised, in its own code."""


def _holding(case: Case) -> str:
    """``ones (the rest zeros)``: what worker ``j`` holds in ``case``'s counting probes, and the others."""
    base_value, mark = PROBE_VALUES[case.reduction]
    return f"{_WORDS.get(mark, f'{mark:g}')} (the rest {_WORDS.get(base_value, f'{base_value:g}')})"


def _listing(case: Case, e: int, per: list[float], layout: Layout) -> str:
    """``element (1,) (chunk 1) is worker 0: 1, worker 1: 0``: one element's count per worker."""
    index, chunk = locate(case, e, layout)
    return f"element {index} (chunk {chunk}) is {', '.join(f'worker {j}: {c:g}' for j, c in enumerate(per))}"


def _count_finding(
    case: Case, counts: list[list[float]], mismatch: ValueMismatch, layout: Layout
) -> Finding | None:
    """``double-counted`` (or lost contributions: ``out-of-bound``) from whole-number probe counts.

    ``None`` when :func:`off_counts` finds no element counted wrongly.
    """
    off = off_counts(case, counts, mismatch)
    if off is None:
        return None
    e, per = off
    probe = f"with only worker j holding {_holding(case)}, {_listing(case, e, per, layout)}"
    missing, twice = who(per)
    lost = f", worker(s) {missing} lost" if missing else ""
    if twice:
        per_worker = len(case.values) // case.n
        weighted = sum(
            (Fraction(c) * Fraction(case.values[j * per_worker + e]) for j, c in enumerate(per)), Fraction(0)
        )
        check = (
            f"; summing the counterexample with these counts gives {float(weighted)!r} there"
            if e == flat_of(case, mismatch.index) and case.reduction == "sum"
            else ""
        )
        combining = "multiplying" if case.reduction == "prod" else "adding"
        return Finding(
            ["double-counted"],
            f"Contributions counted more than once (e.g. all-gather {combining} instead of copying): "
            f"{probe}, so worker(s) {twice} counted more than once{lost}{check}",
            mismatch,
        )
    return Finding(["out-of-bound"], f"Contributions missing: {probe}, so worker(s) {missing} lost", mismatch)


def _rank_counts(
    case: Case, rank: int, counts: list[list[float]] | None, mismatch: ValueMismatch, layout: Layout
) -> str:
    """What the one-hot probes show for one failing rank of a group, in a few words."""
    if counts is None:
        return f"rank {rank}: no well-formed result on some probe"
    off = off_counts(case, counts, mismatch)
    if off is not None:
        e, per = off
        missing, twice = who(per)
        how = [f"worker(s) {twice} counted more than once"] if twice else []
        how += [f"worker(s) {missing} lost"] if missing else []
        return f"rank {rank}: {_listing(case, e, per, layout)} ({', '.join(how)})"
    if counts_once(counts):
        return f"rank {rank}: every worker counted once in every element"
    return f"rank {rank}: counts that are not whole numbers (a scaling or a rounding, not a counting bug)"


def _describe(m: ValueMismatch) -> str:
    more = f" ({m.count} element(s) differ)" if m.count > 1 else ""
    return (
        f"First differing element {m.index} (chunk {m.chunk}): expected {m.expected!r}, "
        f"actual {m.actual!r}; {m.detail}{more}"
    )


def diagnose(
    fn: Target | OpTarget | Launcher, outcome: Outcome, mode: Mode, order: ExactOrder = SPEC_ORDER
) -> Finding | None:
    """Every applicable code for one call's outcome under ``mode``, ``exact`` against ``order`` (``None``: it
    passes).

    ``fn`` runs the diagnosis probes: a target (called in-process) or the
    launcher that produced ``outcome``.  For a group, the first failing rank's
    values are classified with that rank's results on the probes; when the
    ranks' bits differ while some rank passes the oracle, the code is
    ``ranks-disagree`` (they did not compute one all-reduce), unless the
    probes show the failing rank counting contributions wrongly
    (``double-counted``, ``mean-not-sum``): then the right ranks were right
    only by the luck of this input's zeros.
    """
    if outcome.failure is not None:
        failure = outcome.failure
        return Finding([failure.code], failure.text, stack=failure.stack, ranks=list(failure.ranks))
    where = next((a.raised_at for a in outcome.answers if a.raised and a.raised_at is not None), None)
    findings = [Finding([code], text) for code, text in structural(outcome)]
    launcher, case = as_launcher(fn), outcome.case
    by_rank = results_of(outcome)
    results = list(by_rank.values())
    shard_finding = wrong_shard(launcher, outcome) if not findings else None
    if shard_finding is not None:
        findings.append(shard_finding)
    elif case.collective.gathers and results and all(r is not None for r in results):
        findings.extend(gather_findings(case, by_rank))
    elif results and all(r is not None for r in results):
        values = cast(list[torch.Tensor], results)
        ranks = list(by_rank)
        mismatches = [check_values(mode, case, t, order)[0] for t in values]
        failing = [k for k, m in enumerate(mismatches) if m is not None]
        passing = [k for k, m in enumerate(mismatches) if m is None]
        disagreement = first_disagreement(case, values, order.layout, passing[0] if passing else 0)
        group_counts = functools.cache(functools.partial(counts_by_rank, launcher, case))
        found, counted = None, False
        if failing:
            k = failing[0]
            m = cast(ValueMismatch, mismatches[k])
            found = _classify_values(
                launcher,
                case,
                values[k],
                mode,
                m,
                order=order,
                rank=ranks[k],
                counts_of=lambda: group_counts().get(ranks[k]),
            )
            if ranks[k] is not None:
                found.ranks = [cast(int, ranks[f]) for f in failing]
                right = (
                    f"; rank(s) {[ranks[p] for p in passing]} happen to be right on this input"
                    if passing
                    else ""
                )
                found.explanation = f"rank(s) {found.ranks} fail{right}; rank {ranks[k]}: {found.explanation}"
                if disagreement is not None:
                    found.explanation += f" (the ranks' results also differ: {disagreement[1].detail})"
                # a counting bug the probes show holds for every input, whichever ranks this one made right;
                # a lost worker too, unless the right ranks count every worker once (then they disagree)
                counted = found.codes[0] in _COUNTING or (
                    found.codes[0] == "out-of-bound"
                    and lost_workers(case, group_counts().get(ranks[k]), m)
                    and not all(counts_once(group_counts().get(ranks[p])) for p in passing)
                )
                if counted and len(failing) > 1:
                    found.explanation += _group_counts_words(
                        case, ranks, failing[1:], mismatches, group_counts(), layout=order.layout
                    )
        if passing and disagreement is not None and not counted:
            found = _disagree_finding(ranks, passing[0], disagreement, failing, mismatches)
            if failing:
                found.explanation += _group_counts_words(
                    case, ranks, failing, mismatches, group_counts(), layout=order.layout
                )
        if found is not None:
            findings.append(found)
    if not findings:
        return None
    codes = [c for f in findings for c in f.codes]
    return Finding(
        list(dict.fromkeys(codes)),
        "; ".join(f"{'/'.join(f.codes)}: {f.explanation}" for f in findings),
        next((f.mismatch for f in findings if f.mismatch is not None), None),
        stack=outcome.stack,
        ranks=next((f.ranks for f in findings if f.ranks), []),
        raised_at=where,
    )


def _group_counts_words(
    case: Case,
    ranks: list[int | None],
    failing: list[int],
    mismatches: list[ValueMismatch | None],
    counts: dict[int | None, list[list[float]]],
    *,
    layout: Layout,
) -> str:
    """``; the one-hot probes per failing rank: rank 0: ...; rank 2: ...`` (:func:`_rank_counts`)."""
    words = [
        _rank_counts(
            case, cast(int, ranks[f]), counts.get(ranks[f]), cast(ValueMismatch, mismatches[f]), layout
        )
        for f in failing
    ]
    listing = "; ".join(words)
    return f"; the one-hot probes (only worker j holding {_holding(case)}) per failing rank: {listing}"


def _disagree_finding(
    ranks: list[int | None],
    right: int,
    disagreement: tuple[list[int], ValueMismatch],
    failing: list[int],
    mismatches: list[ValueMismatch | None],
) -> Finding:
    """``ranks-disagree``: the ranks whose bits differ from a rank that passes the oracle, and where."""
    differ, m = disagreement
    names = [cast(int, ranks[k]) for k in differ]
    wrong = f"; rank(s) {[ranks[k] for k in failing]} also fail the oracle" if failing else ""
    first_wrong = mismatches[failing[0]] if failing else None
    oracle = f" ({_describe(first_wrong)})" if first_wrong is not None else ""
    return Finding(
        ["ranks-disagree"],
        f"rank(s) {names} ended with different bits than rank {ranks[right]}, whose result passes: first "
        f"differing element {m.index} (chunk {m.chunk}): {m.detail}{wrong}{oracle}; the ranks did not "
        "compute one all-reduce",
        ValueMismatch(m.index, m.chunk, m.expected, m.actual, m.detail, m.count),
        ranks=names,
    )


def _classify_values(
    fn: Launcher,
    case: Case,
    result: torch.Tensor,
    mode: Mode,
    m: ValueMismatch,
    *,
    order: ExactOrder,
    rank: int | None,
    counts_of: Callable[[], list[list[float]] | None],
) -> Finding:
    """Name a value mismatch: double-counted, mean-not-sum, sum-not-op, wrong-op, avg-divided-first,
    signed-zero, not-ring-order, narrowed-dtype or out-of-bound.

    For an op other than ``sum`` the op probe comes first (an ``avg`` that does
    not divide counts every contribution ``N`` times).  Then the counting
    probes: whole-number contribution counts other than 1 are a counting bug
    whatever the counterexample's values (a lost worker on identical rows also
    looks like a mean).  ``mean-not-sum`` needs the result out of bound, within
    rounding of the sum / N, and every probe (where it ran) to give 1 / N as
    well; then the op probe for ``sum``.  Then the equal rows (``avg`` divided
    first), the signs of zeros, ``not-ring-order``; last, a result computed in a narrower dtype
    (``narrowed-dtype``, :func:`_narrowed`).  ``counts_of``
    gives the counting probes' counts (:func:`count_contributions`; for a
    group, run once for every rank).
    """
    op = case.reduction
    within_bound = check_values("bound", case, result, order).mismatch is None
    found = _other_op(fn, case, result, rank) if op != "sum" else None
    counts = None
    if found is None:
        counts = counts_of()
        counted = None if counts is None else _count_finding(case, counts, m, order.layout)
        if counted is not None:
            counted.explanation = f"{_describe(m)}. {counted.explanation}"
            return counted
        if op == "sum":
            found = _mean_finding(case, result, counts) if not within_bound else None
            found = found or _other_op(fn, case, result, rank)
        found = found or _op_finding(fn, case, result, mode, rank, order=order)
    if found is not None:
        return Finding([found[0]], f"{_describe(m)}. {found[1]}", m)
    counted_once = counts_once(counts)
    if mode == "exact" and counted_once and within_bound:
        rng = random.Random(len(case.values))
        probe = replace(case, values=order_free_values(case.dtype, case.n, len(case.values), rng, op))
        probe_result = well_formed(fn.call(probe), rank)
        if (
            probe_result is not None
            and check_values("order-free", probe, probe_result, order).mismatch is None
        ):
            what = "sum in a different summation order" if op == "sum" else f"{op} in a different order"
            revealing, expected = _revealed_order(fn, case, m, order, rank) if op == "sum" else (None, "")
            if revealing is not None and revealing.tree is None and _rounds_once(case, result):
                where = f" ({expected} at that element)" if expected else ""
                return Finding(
                    ["not-ring-order"],
                    f"{_describe(m)}. A correct sum that rounds once: every contribution is counted once and "
                    "every element is the exact sum correctly rounded, but no tree of additions in the dtype "
                    f"gives the target's answers on reveal's swamping probes: {ROUNDS_ONCE} (a wider "
                    "accumulator, a fused or compensated sum), so it has no summation order at all, the "
                    "ring's included (clause fold-order); only --mode exact requires the ring's order"
                    f"{where}",
                    m,
                )
            revealed = ""
            if revealing is not None:
                revealed = (
                    f"; revealed on {dtype_name(case.dtype)} inputs of that shape (ring-ref reveal), "
                    f"{revealing.text}"
                )
                revealed += f", where {expected}" if expected else ""
            return Finding(
                ["not-ring-order"],
                f"{_describe(m)}. A correct {what}: every contribution is "
                "counted once, the result is within the forward-error bound of the exact "
                f"{_EXACT_WORD[op]} and exact on order-free inputs, but not bitwise the ring's fold order "
                f"(clause fold-order); only --mode exact requires that order{revealed}",
                m,
            )
    narrowed = None if within_bound else _narrowed(case, result, order)
    if narrowed is not None:
        return Finding(["narrowed-dtype"], f"{_describe(m)}. {narrowed}", m)
    return Finding(
        ["out-of-bound"], f"{_describe(m)}. Wrong values, not explained by a more specific code", m
    )


_NARROWER: Final[dict[torch.dtype, tuple[torch.dtype, ...]]] = {
    torch.float64: (torch.float32, torch.bfloat16, torch.float16),
    torch.float32: (torch.bfloat16, torch.float16),
}
"""The dtypes of fewer significand bits than each dtype, widest first: where a narrowed result may have been
computed (float16 and bfloat16 are not narrower than each other: one has the bits, the other the range)."""


def _narrowed(case: Case, result: torch.Tensor, order: ExactOrder) -> str | None:
    """``narrowed-dtype``'s words, or ``None``, for a result outside the case's ``bound``: some input is not
    a value of a narrower dtype, every element of ``result`` is one, and the result passes that dtype's
    ``bound`` on the inputs rounded to it (the target rounded its inputs, computed there, and widened the
    result back); the widest such dtype is named.  Inputs that are all values of it leave no trace of
    the narrowing that an error of another kind could not leave as well, so they name nothing; nor do
    inputs that are not its values only by lying below its normal range (a subnormal flushed to zero, as
    XLA's CPU collectives do, is not a narrowed dtype)."""
    inputs = exact_tensor(case.values, case.dtype)
    for narrow in _NARROWER.get(case.dtype, ()):
        normal = inputs[inputs.abs() >= torch.finfo(narrow).tiny]
        if not (_values_of(narrow, result) and not _values_of(narrow, normal)):
            continue
        rounded = replace(case, dtype=narrow, values=tuple(inputs.to(narrow).tolist()))
        if check_values("bound", rounded, result.to(narrow), order).mismatch is None:
            wide, name = dtype_name(case.dtype), dtype_name(narrow)
            return (
                f"Every element is a {name} value, within {name}'s forward-error bound of the "
                f"{case.reduction} of the inputs rounded to {name}: the target computed in {name} and "
                f"widened the result back to {wide} (a conversion that narrows silently, as "
                "mlx.core.array makes float32 of a float64 numpy array)"
            )
    return None


def _values_of(narrow: torch.dtype, values: torch.Tensor) -> bool:
    """Whether every element of ``values`` is a value of ``narrow`` (NaN for NaN)."""
    back = values.to(narrow).to(values.dtype)
    return bool(((back == values) | (back.isnan() & values.isnan())).all())


def _mean_finding(
    case: Case, result: torch.Tensor, counts: list[list[float]] | None
) -> tuple[str, str] | None:
    """``mean-not-sum`` for a ``sum`` out of bound: within rounding of the sum / N, every probe 1 / N."""
    probes = probe_cases(case)
    probes_mean = counts is None or all(is_mean(p, row) for p, row in zip(probes, counts, strict=True))
    if probes_mean and is_mean(case, as_float_list(result)):
        return "mean-not-sum", f"The result is the sum divided by N = {case.n} (the mean), not the sum"
    return None


def _op_finding(
    fn: Launcher, case: Case, result: torch.Tensor, mode: Mode, rank: int | None, *, order: ExactOrder
) -> tuple[str, str] | None:
    """``(code, explanation)`` from the op's own probes: ``avg`` divided first, the signs of zeros.

    ``signed-zero`` needs the result right once its zeros have the signs the
    oracle wants, and the target right on the position probe (values that
    differ from element to element, no zeros), so that a result merely moved
    to the wrong elements is not taken for one with the wrong zeros.
    """
    op = case.reduction
    if op == "avg" and (times := _times_reciprocal(fn, case, rank)):
        return "avg-times-reciprocal", times
    divided = _divided_first(fn, case, result, rank) if op == "avg" else ""
    if divided:
        return "avg-divided-first", divided
    if op in ("sum", "avg") and mode == "exact" and plus_zeros_only(case, result, order):
        return "signed-zero", _signed_zero_words(mode, op, tie=True)
    if op in ("prod", "max", "min"):
        fixed = zeros_as_the_oracle_wants(mode, case, result, order)
        if fixed is not None and check_values(mode, case, fixed, order).mismatch is None:
            probe = position_probe(several_workers(case))
            got = well_formed(fn.call(probe), rank)
            if got is not None and check_values(mode, probe, got, order).mismatch is None:
                tie = check_values("bound", case, result, order).mismatch is None
                return "signed-zero", _signed_zero_words(mode, op, tie=tie)
    return None


def plus_zeros_only(case: Case, result: torch.Tensor, order: ExactOrder = SPEC_ORDER) -> bool:
    """Whether a ``sum`` or ``avg`` result differs from ``order``'s (``exact``) only by ``+0.0`` where the
    order has ``-0.0``: where every worker holds ``-0.0``, a fold that starts from ``+0.0``."""
    values, ring = result.reshape(-1), order.expected(case).reshape(-1)
    if bool(((values == 0) & values.signbit() & ~ring.signbit()).any()):
        return False
    fixed = zeros_as_the_oracle_wants("exact", case, result, order)
    return fixed is not None and check_values("exact", case, fixed, order).mismatch is None


_EXACT_WORD: Final[dict[str, str]] = {
    "sum": "sum",
    "avg": "average",
    "prod": "product",
    "max": "maximum",
    "min": "minimum",
}


def _signed_zero_words(mode: Mode, op: Op, *, tie: bool) -> str:
    """The ``signed-zero`` explanation for ``op`` under ``mode``; ``tie``: the result's zeros are those
    of some fold order (where -0 and +0 tie), which only ``exact`` refuses."""
    if op == "prod":
        return (
            "Every element has the right value, but a zero has the wrong sign: the sign of a product is "
            "the exclusive or of the signs in every order (IEEE 754), zeros included (a product "
            "computed from magnitudes, or a zero written as +0?)"
        )
    if op in ("sum", "avg"):
        return (
            f"Every element has the ring's value, but the sign of a zero differs: where every worker holds "
            "-0.0, every order of IEEE 754 additions, the ring's included, gives -0.0, and a fold that "
            "starts from the identity +0.0 (XLA's psum, torch.sum, numpy.sum) gives +0.0: a correct "
            f"{op} by value, which order-free and bound accept; only --mode exact requires the ring's zeros"
        )
    if mode == "exact" and tie:
        return (
            f"Every element has the ring's value, but the sign of a zero differs: where -0 and +0 tie for "
            f"the {_EXACT_WORD[op]}, the ring keeps the first in its fold order (clause op-{op}), the "
            "target another (another fold order, or another tie rule such as numpy's second argument "
            "or IEEE 754-2019's -0 < +0): a correct "
            f"{op} by value; only --mode exact requires the ring's zeros"
        )
    mirror = "min" if op == "max" else "max"
    return (
        f"Every element has the {_EXACT_WORD[op]}'s value, but a zero has a sign that no worker holding "
        f"the {_EXACT_WORD[op]} there has, so no fold order gives it (an op computed as -{mirror}(-x), "
        "or a zero written as +0?)"
    )


def _other_op(fn: Launcher, case: Case, result: torch.Tensor, rank: int | None) -> tuple[str, str] | None:
    """From the op probes, ``("sum-not-op" | "wrong-op", explanation)`` when the target computed another op.

    Both probes (2, 3, 2, ... and 3, 2, 3, ...) must show the same other op,
    so that a target which loses a worker is not taken for one computing
    ``min`` (on 2, 3 it keeps 2) or ``max`` (on 3, 2 it keeps 3), and the
    counterexample's result must pass that op's bound oracle (``sum + 1`` is
    the product on both probes for ``N = 2``, and on no other input).
    """
    wide = several_workers(case)
    other = op_on_probe(fn, wide, rank, flipped=False)
    if other is None or op_on_probe(fn, wide, rank, flipped=True) != other:
        return None
    if check_values("bound", replace(case, op=other), result).mismatch is not None:
        return None
    asked, values = case.reduction, op_probe_values(wide.n, case.dtype)
    want = values.get(asked)
    expected = f", where {asked} gives {want!r}" if want is not None else ""
    return ("sum-not-op" if other == "sum" else "wrong-op"), (
        f"On the op probes{_shape_words(case, wide)} (worker j holds 2 + j % 2: 2, 3, 2, ..., and "
        f"3 - j % 2, where every op gives another value) every element is the {_EXACT_WORD[other]} "
        f"({values[other]!r} on the first{expected}): the target computed {other} when asked for {asked}"
    )


def _shape_words(case: Case, probed: Case) -> str:
    """`` at N = 2, M = 4``: where the probes ran, when that is not the counterexample's shape."""
    return "" if probed.n == case.n else f" at N = {probed.n}, M = {probed.m}"


def _on_two_workers(fn: Launcher, case: Case, a: int, b: int, rank: int | None) -> set[float] | None:
    """The values the target gives when only workers 0 and 1 hold ``a`` and ``b`` (``None``: no result)."""
    per_worker = len(case.values) // case.n
    rows = [float(a), float(b)] + [0.0] * (case.n - 2)
    got = well_formed(fn.call(replace(case, values=tuple(v for v in rows for _ in range(per_worker)))), rank)
    return None if got is None else set(as_float_list(got))


def _times_reciprocal(fn: Launcher, case: Case, rank: int | None) -> str:
    """Why the ``avg`` result is the sum multiplied by ``fl(1/N)`` (``""``: it is not).

    On a probe where only workers 0 and 1 hold ``a`` and ``b`` (:func:`times_reciprocal`: one
    addition, the same in every order) every element is ``(a + b) * fl(1/N)`` rounded, which no
    average divided once and no sum of contributions scaled first gives: XLA's ``pmean``.
    """
    fmt = format_of(case.dtype)
    pair = times_reciprocal(fmt, case.n)
    if pair is None:
        return ""
    a, b, times = pair
    if _on_two_workers(fn, case, a, b, rank) != {times}:
        return ""
    reciprocal = float(round_to(fmt, Fraction(1, case.n)))
    once = float(round_to(fmt, Fraction(a + b, case.n)))
    return (
        f"With only workers 0 and 1 holding {a} and {b} (one addition, the same in every order) the "
        f"target gives {times!r} everywhere: the sum multiplied by 1/N rounded ({reciprocal!r}) after "
        f"the sum, as XLA's pmean does; an average divided once gives {once!r} (clause op-avg)"
    )


def _divided_first(fn: Launcher, case: Case, result: torch.Tensor, rank: int | None) -> str:
    """Why the ``avg`` result is a sum of contributions each scaled by ``1/N`` first (``""``: it is not).

    Either the result is bit for bit the ring's sum of the rounded quotients
    ``x_i / N``, or of the rounded products ``x_i * fl(1/N)`` (NCCL's
    floating-point average, clause ``op-avg``); or, in any order, on a probe
    where only workers 0 and 1 hold contributions ``a`` and ``b``
    (:func:`scaled_first`) every element is what scaling them first gives
    and no average divided once can give.
    """
    n, fmt = case.n, format_of(case.dtype)
    if n < 2:
        return ""
    reciprocal = Fraction(round_to(fmt, Fraction(1, n)))
    divided_words = f"each divided by N first (x_i / {n} rounded, then summed)"
    premultiplied_words = (
        f"each multiplied by 1/N rounded first (x_i * {float(reciprocal)!r} rounded, then summed, "
        "as NCCL's ncclAvg premultiplies)"
    )
    ways: dict[str, Callable[[float], Fraction]] = {
        divided_words: lambda x: Fraction(x) / n,
        premultiplied_words: lambda x: Fraction(x) * reciprocal,
    }
    for words, scale in ways.items():
        contributions = tuple(round_to(fmt, scale(x), math.copysign(1.0, x) < 0) for x in case.values)
        if torch.equal(bits(ring_all_reduce(replace(case, values=contributions).tensor())), bits(result)):
            return (
                f"The result is bit for bit the ring's sum of the contributions {words}, not the ring's "
                "sum divided once (clause op-avg)"
            )
    for premultiply, words in ((False, divided_words), (True, premultiplied_words)):
        pair = scaled_first(fmt, n, premultiply)
        if pair is None:
            continue
        a, b, scaled, right = pair
        if _on_two_workers(fn, case, a, b, rank) == {scaled}:
            once = " or ".join(repr(v) for v in sorted(right))
            return (
                f"With only workers 0 and 1 holding {a} and {b} (one addition, the same in every order) "
                f"the target gives {scaled!r} everywhere: the contributions {words}; an average divided "
                f"once gives {once} (clause op-avg)"
            )
    return ""


def _revealed_order(
    fn: Launcher, case: Case, m: ValueMismatch, order: ExactOrder, rank: int | None
) -> tuple[Explained | None, str]:
    """What reveal finds for the element (``None``: it cannot run), and ``the spec's ring folds 0,1,2``:
    the expected ``order``'s tree of it (``""`` where the order has no trees).

    Clause ``difftest-exact-orders``; the probes are of the counterexample's shape and dtype.
    """
    from ring_ref.difftest._orders import explain_element

    def call(x: torch.Tensor) -> torch.Tensor:
        values = tuple(x.to(torch.float64).reshape(-1).tolist())
        got = well_formed(fn.call(replace(case, dtype=x.dtype, layout="contiguous", values=values)), rank)
        if got is None:
            raise RuntimeError("the target gave no well-formed answer to a probe")
        return got

    found = explain_element(call, case, flat_of(case, m.index))
    trees = order.trees(case.n, case.m, case.dtype)
    if found is None or trees is None:
        return found, ""
    shown = format_tree(trees[m.index[0]])
    who = "the spec's ring" if order is SPEC_ORDER else order.name
    return found, (f"{who} folds {shown[5:]}" if shown.startswith("fold ") else f"{who} sums it as {shown}")


def _rounds_once(case: Case, result: torch.Tensor) -> bool:
    """Whether every element of ``result`` is the exact sum of ``case`` correctly rounded to its dtype."""
    fmt = format_of(case.dtype)
    sums, _ = exact_sums(case)
    return all(y == round_to(fmt, s) for s, y in zip(sums, as_float_list(result), strict=True))


def wrong_shard(fn: Launcher, outcome: Outcome) -> Finding | None:
    """``wrong-shard``: on the shard probe a reduce-scatter's rank ``r`` holds chunk ``c != r``.

    The shard probe keeps the counterexample's shape, dtype, layout and op;
    every worker holds the op's base value (:data:`PROBE_VALUES`) but worker 0,
    which holds ``mark * (e + 1)`` at element ``e``: every element's reduction
    is exact in every order and differs from every other's, so each rank's
    shard names the chunk it is, whatever the target's order.  ``None`` for
    another collective, ``N = 1``, or when every rank holds its own chunk.
    """
    case = outcome.case
    if not case.collective.scatters or case.n < 2:
        return None
    base_value, mark = PROBE_VALUES[case.reduction]
    per_worker = len(case.values) // case.n
    probe = replace(
        case,
        values=tuple(mark * (e + 1) for e in range(per_worker))
        + (base_value,) * (len(case.values) - per_worker),
    )
    got = shards(fn.call(probe))
    if got is None:
        return None
    expected = ring_all_reduce(probe.tensor(), "fast", op=case.reduction).reshape(case.n, -1)
    held = {
        r: next((c for c in range(case.n) if torch.equal(bits(shard.reshape(-1)), bits(expected[c]))), None)
        for r, shard in enumerate(got)
    }
    wrong = {r: c for r, c in held.items() if c is not None and c != r}
    if not wrong:
        return None
    listing = ", ".join(f"rank {r} holds chunk {c}" for r, c in wrong.items())
    return Finding(
        ["wrong-shard"],
        f"On the shard probe (worker 0 holds {mark:g} * (e + 1) at element e, the rest {base_value:g}: every "
        f"element a different value, the same in every order) {listing}: a reduce-scatter leaves chunk r at "
        "rank r (reduce_scatter_tensor, MPI_Reduce_scatter_block, NCCL; clause difftest-collectives)",
        ranks=sorted(wrong),
    )


def _kind_of(value: float, fmt: FloatFormat) -> str:
    """What a copied value is, in a few words (the values a copy most easily changes)."""
    if math.isnan(value):
        return "a NaN (its sign and payload must be copied too)"
    if value == 0:
        return f"a {'negative' if math.copysign(1.0, value) < 0 else 'positive'} zero"
    if math.isinf(value):
        return "an infinity"
    return "a subnormal (flushed to zero?)" if abs(value) < fmt.smallest_normal else "a normal value"


def gather_findings(case: Case, by_rank: dict[int | None, torch.Tensor | None]) -> list[Finding]:
    """``gather-misplaced`` (a slot holding another rank's shard, bit for bit) and ``gather-changed-bits``
    (a slot holding bits no rank sent) for each rank's well-formed all-gather result."""
    sent = bits(exact_tensor(case.values, case.dtype)).reshape(case.n, -1)
    misplaced: dict[str, list[int | None]] = {}
    changed: dict[str, list[int | None]] = {}
    first: ValueMismatch | None = None
    for rank, result in by_rank.items():
        if result is None:
            continue
        rows = bits(result).reshape(case.n, -1)
        moved = {}
        for slot in range(case.n):
            if not torch.equal(rows[slot], sent[slot]):
                moved[slot] = next((t for t in range(case.n) if torch.equal(rows[slot], sent[t])), None)
        if not moved:
            continue
        placed = [f"slot {s} holds rank {t}'s shard" for s, t in moved.items() if t is not None]
        if placed:
            misplaced.setdefault(", ".join(placed), []).append(rank)
        if any(t is None for t in moved.values()):
            only_changed = sent.clone()  # the slots that hold bits no rank sent, the others right
            for slot in (s for s, t in moved.items() if t is None):
                only_changed[slot] = rows[slot]
            m = cast(ValueMismatch, gather_oracle(case, only_changed.view(case.dtype).reshape(result.shape)))
            first = first or m
            was = _kind_of(m.expected, format_of(case.dtype))
            changed.setdefault(f"element {m.index} (slot {m.chunk}) should be {was}: {m.detail}", []).append(
                rank
            )
    found = [
        Finding(
            ["gather-misplaced"],
            f"{_whose(ranks)}{text}: an all-gather puts rank r's shard in slot r",
            ranks=[r for r in ranks if r is not None],
        )
        for text, ranks in misplaced.items()
    ]
    found += [
        Finding(
            ["gather-changed-bits"],
            f"{_whose(ranks)}{text}",
            first,
            ranks=[r for r in ranks if r is not None],
        )
        for text, ranks in changed.items()
    ]
    return found


def _whose(ranks: list[int | None]) -> str:
    return "" if ranks == [None] else f"rank(s) {ranks}: "
