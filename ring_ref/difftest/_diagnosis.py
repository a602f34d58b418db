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
wrong only in the sign of zeros is ``signed-zero``.
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
from ring_ref._dtypes import FloatFormat, bits, format_of
from ring_ref._order import format_tree
from ring_ref.difftest._call import (
    Answer,
    Outcome,
    TensorView,
    aliases,
    input_problem,
    kind_hint,
    shards,
    well_formed,
)
from ring_ref.difftest._call import results as results_of
from ring_ref.difftest._inputs import Case, exact_tensor, order_free_values, probe_cases
from ring_ref.difftest._launch import InProcess, Launcher
from ring_ref.difftest._oracles import (
    EXACT_ORDER,
    SPEC_ORDER,
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
from ring_ref.difftest._vocabulary import OPS, Mode, Op, OpTarget, Target

if TYPE_CHECKING:
    from ring_ref.difftest._orders import Explained

_COUNTING: Final = ("double-counted", "mean-not-sum", "sum-not-op", "wrong-op", "avg-divided-first")
"""Value codes that the probes establish for every input, not only the counterexample."""

PROBE_VALUES: Final[dict[Op, tuple[float, float]]] = {
    "sum": (0.0, 1.0),
    "avg": (0.0, 1.0),
    "prod": (1.0, 2.0),
    "max": (0.0, 1.0),
    "min": (0.0, -1.0),
}
"""Per op, the value every worker holds in a counting probe, and the mark worker ``j`` holds instead."""

_WORDS: Final[dict[float, str]] = {0.0: "zeros", 1.0: "ones"}

ROUNDS_ONCE: Final = (
    "the target accumulates in higher precision or otherwise does not round after every addition"
)
"""What ``not-ring-order`` says of a target no tree of additions explains that rounds the exact sum."""

__all__ = [
    "PROBE_VALUES",
    "ROUNDS_ONCE",
    "Finding",
    "as_launcher",
    "count_contributions",
    "counts_by_rank",
    "diagnose",
    "difference",
    "gather_findings",
    "op_probe_rows",
    "op_probe_values",
    "passes",
    "plus_zeros_only",
    "position_probe",
    "several_workers",
    "structural",
    "wrong_shard",
]


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


def as_launcher(fn: Target | OpTarget | Launcher) -> Launcher:
    """``fn`` itself when it is a launcher, else ``fn`` called in-process."""
    return fn if isinstance(fn, Launcher) else InProcess(fn)


def structural(outcome: Outcome) -> list[tuple[str, str]]:
    """Codes that need no oracle: no answer, exceptions, shape, dtype, device, mutation, aliasing.

    For a group, each rank's answer is checked, and the ranks with the same
    finding are named together (``rank(s) [0, 2]: ...``).
    """
    if outcome.failure is not None:
        return [(outcome.failure.code, outcome.failure.text)]
    if not outcome.answers:
        return [("crashed", "no answer came back")]
    by_finding: dict[tuple[str, str], list[int | None]] = {}
    for answer in outcome.answers:
        for found in _structural_one(answer, outcome.case):
            by_finding.setdefault(found, []).append(answer.rank)
    merged = [
        (code, text if ranks == [None] else f"rank(s) {ranks}: {text}")
        for (code, text), ranks in by_finding.items()
    ]
    if outcome.note:
        merged = [(code, f"{text}; {outcome.note}" if code == "raised" else text) for code, text in merged]
    return merged


def _structural_one(answer: Answer, case: Case) -> list[tuple[str, str]]:
    """The structural codes of one answer (one rank's, for a group)."""
    if answer.raised:
        hint = ""
        if case.op is not None and answer.raised.startswith("TypeError") and "op" in answer.raised:
            hint = f"; with --op the target is called with op= too (op={case.op!r}): does it take one?"
        return [("raised", f"raised {answer.raised} (on a valid input){hint}{kind_hint(answer)}")]
    found: list[tuple[str, str]] = []
    want_shape = case.result_shape(answer.rank)
    result = answer.result
    if result is None:
        found.append(
            ("wrong-shape", f"returned {answer.type_name}, not a torch.Tensor of shape {want_shape}")
        )
    else:
        if result.shape != want_shape:
            copies = case.collective == "all-reduce" and result.shape == (case.n, *want_shape)
            hint = " (a stack of N copies?)" if copies else ""
            found.append(("wrong-shape", f"result shape {result.shape}, expected {want_shape}{hint}"))
        if result.dtype != str(case.dtype):
            found.append(("dtype-changed", f"result dtype {result.dtype}, input dtype {case.dtype}"))
        if result.device != "cpu":
            found.append(("device-changed", f"result on {result.device}, input on cpu"))
        if not found and result.values is None:  # a result like that always travels with its bits
            found.append(("crashed", "its reply was garbled (a result of the right shape came without bits)"))
    problem = input_problem(answer, case)
    if problem:
        found.append(("input-modified", problem))
    if aliases(answer):
        found.append(("aliases-input", "the result shares storage with the input (a view of it?)"))
    return found


def passes(outcome: Outcome, mode: Mode) -> tuple[bool, int, int]:
    """Whether one call's outcome passes ``mode``'s checks, and how many elements it accepted where an
    order could overflow (and, for ``prod``, underflow).

    For a group: every rank's result passes the oracle and all have the same bits.
    """
    if structural(outcome):
        return False, 0, 0
    results = list(results_of(outcome).values())
    if any(r is None for r in results):
        return False, 0, 0
    overflow = underflow = 0
    for result in results:
        mismatch, over, under = check_values(mode, outcome.case, cast(torch.Tensor, result))
        if mismatch is not None:
            return False, 0, 0
        overflow, underflow = max(overflow, over), max(underflow, under)
    return _first_disagreement(outcome.case, cast(list[torch.Tensor], results)) is None, overflow, underflow


def _first_disagreement(
    case: Case, results: list[torch.Tensor], reference: int = 0
) -> tuple[list[int], ValueMismatch] | None:
    """The ranks whose bits differ from rank ``reference``'s, and the first such element of the first one."""
    ref = bits(results[reference])
    differ = [r for r, t in enumerate(results) if not torch.equal(bits(t), ref)]
    if not differ:
        return None
    other = results[differ[0]]
    diff = (bits(other) != ref).reshape(-1).nonzero()
    e = int(diff[0])
    index, chunk = locate(case, e)
    want, got = float(results[reference].reshape(-1)[e]), float(other.reshape(-1)[e])
    detail = f"rank {differ[0]} has {got!r} where rank {reference} has {want!r}"
    return differ, ValueMismatch(index, chunk, want, got, detail, int(diff.numel()))


def _is_mean(case: Case, actual: list[float]) -> bool:
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


def _off_counts(
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


def _holding(case: Case) -> str:
    """``ones (the rest zeros)``: what worker ``j`` holds in ``case``'s counting probes, and the others."""
    base_value, mark = PROBE_VALUES[case.reduction]
    return f"{_WORDS.get(mark, f'{mark:g}')} (the rest {_WORDS.get(base_value, f'{base_value:g}')})"


def _listing(case: Case, e: int, per: list[float]) -> str:
    """``element (1,) (chunk 1) is worker 0: 1, worker 1: 0``: one element's count per worker."""
    index, chunk = locate(case, e)
    return f"element {index} (chunk {chunk}) is {', '.join(f'worker {j}: {c:g}' for j, c in enumerate(per))}"


def _who(per: list[float]) -> tuple[list[int], list[int]]:
    """The workers one element's counts show lost (0) and counted more than once (2 or more)."""
    return [j for j, c in enumerate(per) if c == 0], [j for j, c in enumerate(per) if c >= 2]


def _count_finding(case: Case, counts: list[list[float]], mismatch: ValueMismatch) -> Finding | None:
    """``double-counted`` (or lost contributions: ``out-of-bound``) from whole-number probe counts.

    ``None`` when :func:`_off_counts` finds no element counted wrongly.
    """
    off = _off_counts(case, counts, mismatch)
    if off is None:
        return None
    e, per = off
    probe = f"with only worker j holding {_holding(case)}, {_listing(case, e, per)}"
    missing, twice = _who(per)
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


def _rank_counts(case: Case, rank: int, counts: list[list[float]] | None, mismatch: ValueMismatch) -> str:
    """What the one-hot probes show for one failing rank of a group, in a few words."""
    if counts is None:
        return f"rank {rank}: no well-formed result on some probe"
    off = _off_counts(case, counts, mismatch)
    if off is not None:
        e, per = off
        missing, twice = _who(per)
        how = [f"worker(s) {twice} counted more than once"] if twice else []
        how += [f"worker(s) {missing} lost"] if missing else []
        return f"rank {rank}: {_listing(case, e, per)} ({', '.join(how)})"
    if _counts_once(counts):
        return f"rank {rank}: every worker counted once in every element"
    return f"rank {rank}: counts that are not whole numbers (a scaling or a rounding, not a counting bug)"


def _describe(m: ValueMismatch) -> str:
    more = f" ({m.count} element(s) differ)" if m.count > 1 else ""
    return (
        f"First differing element {m.index} (chunk {m.chunk}): expected {m.expected!r}, "
        f"actual {m.actual!r}; {m.detail}{more}"
    )


def diagnose(fn: Target | OpTarget | Launcher, outcome: Outcome, mode: Mode) -> Finding | None:
    """Every applicable code for one call's outcome under ``mode`` (``None``: it passes).

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
    findings = [Finding([code], text) for code, text in structural(outcome)]
    launcher, case = as_launcher(fn), outcome.case
    by_rank = results_of(outcome)
    results = list(by_rank.values())
    shard_finding = wrong_shard(launcher, outcome) if not findings else None
    if shard_finding is not None:
        findings.append(shard_finding)
    elif case.collective == "all-gather" and results and all(r is not None for r in results):
        findings.extend(gather_findings(case, by_rank))
    elif results and all(r is not None for r in results):
        values = cast(list[torch.Tensor], results)
        ranks = list(by_rank)
        mismatches = [check_values(mode, case, t)[0] for t in values]
        failing = [k for k, m in enumerate(mismatches) if m is not None]
        passing = [k for k, m in enumerate(mismatches) if m is None]
        disagreement = _first_disagreement(case, values, passing[0] if passing else 0)
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
                    and _lost_workers(case, group_counts().get(ranks[k]), m)
                    and not all(_counts_once(group_counts().get(ranks[p])) for p in passing)
                )
                if counted and len(failing) > 1:
                    found.explanation += _group_counts_words(
                        case, ranks, failing[1:], mismatches, group_counts()
                    )
        if passing and disagreement is not None and not counted:
            found = _disagree_finding(ranks, passing[0], disagreement, failing, mismatches)
            if failing:
                found.explanation += _group_counts_words(case, ranks, failing, mismatches, group_counts())
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
    )


def _lost_workers(case: Case, counts: list[list[float]] | None, mismatch: ValueMismatch) -> bool:
    """Whether whole-number probe counts show a worker lost (the counting form of ``out-of-bound``)."""
    off = None if counts is None else _off_counts(case, counts, mismatch)
    return off is not None and bool(_who(off[1])[0])


def _counts_once(counts: list[list[float]] | None) -> bool:
    """Whether probe counts show every worker counted once in every element (``None``: none came)."""
    return counts is not None and all(c == 1 for row in counts for c in row)


def _group_counts_words(
    case: Case,
    ranks: list[int | None],
    failing: list[int],
    mismatches: list[ValueMismatch | None],
    counts: dict[int | None, list[list[float]]],
) -> str:
    """``; the one-hot probes per failing rank: rank 0: ...; rank 2: ...`` (:func:`_rank_counts`)."""
    words = [
        _rank_counts(case, cast(int, ranks[f]), counts.get(ranks[f]), cast(ValueMismatch, mismatches[f]))
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
    rank: int | None,
    counts_of: Callable[[], list[list[float]] | None],
) -> Finding:
    """Name a value mismatch: double-counted, mean-not-sum, sum-not-op, wrong-op, avg-divided-first,
    signed-zero, not-ring-order or out-of-bound.

    For an op other than ``sum`` the op probe comes first (an ``avg`` that does
    not divide counts every contribution ``N`` times).  Then the counting
    probes: whole-number contribution counts other than 1 are a counting bug
    whatever the counterexample's values (a lost worker on identical rows also
    looks like a mean).  ``mean-not-sum`` needs the result out of bound, within
    rounding of the sum / N, and every probe (where it ran) to give 1 / N as
    well; then the op probe for ``sum``.  Then the equal rows (``avg`` divided
    first), the signs of zeros, and ``not-ring-order`` last.  ``counts_of``
    gives the counting probes' counts (:func:`count_contributions`; for a
    group, run once for every rank).
    """
    op = case.reduction
    within_bound = check_values("bound", case, result).mismatch is None
    found = _other_op(fn, case, result, rank) if op != "sum" else None
    counts = None
    if found is None:
        counts = counts_of()
        counted = None if counts is None else _count_finding(case, counts, m)
        if counted is not None:
            counted.explanation = f"{_describe(m)}. {counted.explanation}"
            return counted
        if op == "sum":
            found = _mean_finding(case, result, counts) if not within_bound else None
            found = found or _other_op(fn, case, result, rank)
        found = found or _op_finding(fn, case, result, mode, rank)
    if found is not None:
        return Finding([found[0]], f"{_describe(m)}. {found[1]}", m)
    counted_once = _counts_once(counts)
    if mode == "exact" and counted_once and within_bound:
        rng = random.Random(len(case.values))
        probe = replace(case, values=order_free_values(case.dtype, case.n, len(case.values), rng, op))
        probe_result = well_formed(fn.call(probe), rank)
        if probe_result is not None and check_values("order-free", probe, probe_result).mismatch is None:
            what = "sum in a different summation order" if op == "sum" else f"{op} in a different order"
            revealing, expected = _revealed_order(fn, case, m, rank) if op == "sum" else (None, "")
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
                precision = "float64" if case.dtype == torch.float64 else "float32"
                revealed = (
                    f"; revealed on {precision} inputs of that shape (ring-ref reveal), {revealing.text}"
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
    return Finding(
        ["out-of-bound"], f"{_describe(m)}. Wrong values, not explained by a more specific code", m
    )


def _mean_finding(
    case: Case, result: torch.Tensor, counts: list[list[float]] | None
) -> tuple[str, str] | None:
    """``mean-not-sum`` for a ``sum`` out of bound: within rounding of the sum / N, every probe 1 / N."""
    probes = probe_cases(case)
    probes_mean = counts is None or all(_is_mean(p, row) for p, row in zip(probes, counts, strict=True))
    if probes_mean and _is_mean(case, as_float_list(result)):
        return "mean-not-sum", f"The result is the sum divided by N = {case.n} (the mean), not the sum"
    return None


def _op_finding(
    fn: Launcher, case: Case, result: torch.Tensor, mode: Mode, rank: int | None
) -> tuple[str, str] | None:
    """``(code, explanation)`` from the op's own probes: ``avg`` divided first, the signs of zeros.

    ``signed-zero`` needs the result right once its zeros have the signs the
    oracle wants, and the target right on the position probe (values that
    differ from element to element, no zeros), so that a result merely moved
    to the wrong elements is not taken for one with the wrong zeros.
    """
    op = case.reduction
    divided = _divided_first(fn, case, result, rank) if op == "avg" else ""
    if divided:
        return "avg-divided-first", divided
    if op in ("sum", "avg") and mode == "exact" and plus_zeros_only(case, result):
        return "signed-zero", _signed_zero_words(mode, op, tie=True)
    if op in ("prod", "max", "min"):
        fixed = zeros_as_the_oracle_wants(mode, case, result)
        if fixed is not None and check_values(mode, case, fixed).mismatch is None:
            probe = position_probe(several_workers(case))
            got = well_formed(fn.call(probe), rank)
            if got is not None and check_values(mode, probe, got).mismatch is None:
                tie = check_values("bound", case, result).mismatch is None
                return "signed-zero", _signed_zero_words(mode, op, tie=tie)
    return None


def plus_zeros_only(case: Case, result: torch.Tensor) -> bool:
    """Whether a ``sum`` or ``avg`` result differs from the ring's (``exact``) only by ``+0.0`` where the
    ring has ``-0.0``: where every worker holds ``-0.0``, a fold that starts from ``+0.0``."""
    values, ring = result.reshape(-1), EXACT_ORDER.get().expected(case).reshape(-1)
    if bool(((values == 0) & values.signbit() & ~ring.signbit()).any()):
        return False
    fixed = zeros_as_the_oracle_wants("exact", case, result)
    return fixed is not None and check_values("exact", case, fixed).mismatch is None


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


def _op_on_probe(fn: Launcher, case: Case, rank: int | None, flipped: bool) -> Op | None:
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


def _other_op(fn: Launcher, case: Case, result: torch.Tensor, rank: int | None) -> tuple[str, str] | None:
    """From the op probes, ``("sum-not-op" | "wrong-op", explanation)`` when the target computed another op.

    Both probes (2, 3, 2, ... and 3, 2, 3, ...) must show the same other op,
    so that a target which loses a worker is not taken for one computing
    ``min`` (on 2, 3 it keeps 2) or ``max`` (on 3, 2 it keeps 3), and the
    counterexample's result must pass that op's bound oracle (``sum + 1`` is
    the product on both probes for ``N = 2``, and on no other input).
    """
    wide = several_workers(case)
    other = _op_on_probe(fn, wide, rank, flipped=False)
    if other is None or _op_on_probe(fn, wide, rank, flipped=True) != other:
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


def _shape_words(case: Case, probed: Case) -> str:
    """`` at N = 2, M = 4``: where the probes ran, when that is not the counterexample's shape."""
    return "" if probed.n == case.n else f" at N = {probed.n}, M = {probed.m}"


@functools.lru_cache(maxsize=256)
def _scaled_first(
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


def _divided_first(fn: Launcher, case: Case, result: torch.Tensor, rank: int | None) -> str:
    """Why the ``avg`` result is a sum of contributions each scaled by ``1/N`` first (``""``: it is not).

    Either the result is bit for bit the ring's sum of the rounded quotients
    ``x_i / N``, or of the rounded products ``x_i * fl(1/N)`` (NCCL's
    floating-point average, clause ``op-avg``); or, in any order, on a probe
    where only workers 0 and 1 hold contributions ``a`` and ``b``
    (:func:`_scaled_first`) every element is what scaling them first gives
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
    per_worker = len(case.values) // n
    for premultiply, words in ((False, divided_words), (True, premultiplied_words)):
        pair = _scaled_first(fmt, n, premultiply)
        if pair is None:
            continue
        a, b, scaled, right = pair
        rows = [float(a), float(b)] + [0.0] * (n - 2)
        probe = replace(case, values=tuple(v for v in rows for _ in range(per_worker)))
        got = well_formed(fn.call(probe), rank)
        if got is not None and set(as_float_list(got)) == {scaled}:
            once = " or ".join(repr(v) for v in sorted(right))
            return (
                f"With only workers 0 and 1 holding {a} and {b} (one addition, the same in every order) "
                f"the target gives {scaled!r} everywhere: the contributions {words}; an average divided "
                f"once gives {once} (clause op-avg)"
            )
    return ""


def _revealed_order(
    fn: Launcher, case: Case, m: ValueMismatch, rank: int | None
) -> tuple[Explained | None, str]:
    """What reveal finds for the element (``None``: it cannot run), and ``the spec's ring folds 0,1,2``:
    the expected order's tree of it (``""`` where the order has no trees).

    Clause ``difftest-exact-orders``; the probes are float32 (float64 for a
    float64 case) of the counterexample's shape.
    """
    from ring_ref.difftest._orders import explain_element

    def call(x: torch.Tensor) -> torch.Tensor:
        values = tuple(x.to(torch.float64).reshape(-1).tolist())
        got = well_formed(fn.call(replace(case, dtype=x.dtype, layout="contiguous", values=values)), rank)
        if got is None:
            raise RuntimeError("the target gave no well-formed answer to a probe")
        return got

    found = explain_element(call, case, flat_of(case, m.index))
    order = EXACT_ORDER.get()
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


def _view_difference(what: str, a: TensorView | None, b: TensorView | None) -> str:
    if a is None or b is None:
        return "" if a is b else f"{what}: a tensor once, not the other time"
    if (a.shape, a.dtype, a.device) != (b.shape, b.dtype, b.device):
        once, other = f"{a.shape} {a.dtype} on {a.device}", f"{b.shape} {b.dtype} on {b.device}"
        return f"{what}: {once} the first time, {other} the second"
    va, vb = a.values, b.values
    if va is None or vb is None or torch.equal(bits(va), bits(vb)):
        return ""
    where = tuple(int(v) for v in (bits(va) != bits(vb)).nonzero()[0])
    return f"{what} element {where} was {va[where].item()!r} the first time, {vb[where].item()!r} the second"


def difference(first: Outcome, second: Outcome) -> str:
    """How two answers to the same case differ (``""``: the same bits, or the same exception)."""
    if len(first.answers) != len(second.answers):
        return f"{len(first.answers)} answer(s) the first time, {len(second.answers)} the second"
    for a, b in zip(first.answers, second.answers, strict=True):
        where = "" if a.rank is None else f"rank {a.rank}: "
        if a.raised != b.raised:
            return f"{where}the first call {_ending(a.raised)}, the second {_ending(b.raised)}"
        changed = _view_difference("result", a.result, b.result) or _view_difference(
            "the input after the call,", a.argument, b.argument
        )
        if changed:
            return where + changed
    return ""


def _ending(raised: str) -> str:
    return f"raised {raised}" if raised else "returned"


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
    if case.collective != "reduce-scatter" or case.n < 2:
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
