"""Diagnosis: name what went wrong with codes from :data:`~ring_ref.difftest.CODES`.

Structural codes come first (no answer: ``timed-out``, ``crashed``; then
exceptions, shape, dtype, device, mutation, aliasing); for wrong values,
one-hot probes (only worker ``j`` holds ones) count each worker's
contributions per element, which tells double counting and lost workers from
a mean and from a correct sum in another order.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Final, cast

import torch

from ring_ref._dtypes import bits, format_of
from ring_ref.difftest._call import (
    Answer,
    Outcome,
    TensorView,
    aliases,
    input_problem,
    result_tensor,
    well_formed,
)
from ring_ref.difftest._inputs import Case, order_free_values, probe_cases
from ring_ref.difftest._launch import InProcess, Launcher
from ring_ref.difftest._oracles import (
    EXACT_ORDER,
    SPEC_ORDER,
    ValueMismatch,
    as_float_list,
    check_bound,
    check_values,
    exact_sums,
    flat_of,
    locate,
)
from ring_ref.difftest._vocabulary import Mode, Target

_COUNTING: Final = ("double-counted", "mean-not-sum")
"""Value codes that the one-hot probes establish for every input, not only the counterexample."""

__all__ = ["Finding", "as_launcher", "count_contributions", "diagnose", "difference", "passes", "structural"]


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


def as_launcher(fn: Target | Launcher) -> Launcher:
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
        return [("raised", f"raised {answer.raised} (on a valid input)")]
    found: list[tuple[str, str]] = []
    want_shape = (case.m, *case.trailing)
    result = answer.result
    if result is None:
        found.append(
            ("wrong-shape", f"returned {answer.type_name}, not a torch.Tensor of shape {want_shape}")
        )
    else:
        if result.shape != want_shape:
            hint = " (a stack of N copies?)" if result.shape == (case.n, *want_shape) else ""
            found.append(("wrong-shape", f"result shape {result.shape}, expected {want_shape}{hint}"))
        if result.dtype != str(case.dtype):
            found.append(("dtype-changed", f"result dtype {result.dtype}, input dtype {case.dtype}"))
        if result.device != "cpu":
            found.append(("device-changed", f"result on {result.device}, input on cpu"))
    problem = input_problem(answer, case)
    if problem:
        found.append(("input-modified", problem))
    if aliases(answer):
        found.append(("aliases-input", "the result shares storage with the input (a view of it?)"))
    return found


def passes(outcome: Outcome, mode: Mode) -> tuple[bool, int]:
    """Whether one call's outcome passes ``mode``'s checks, and how many overflowing elements it skipped.

    For a group: every rank's result passes the oracle and all have the same bits.
    """
    if structural(outcome):
        return False, 0
    results = [result_tensor(a, outcome.case) for a in outcome.answers]
    if any(r is None for r in results):
        return False, 0
    skipped = 0
    for result in results:
        mismatch, skips = check_values(mode, outcome.case, cast(torch.Tensor, result))
        if mismatch is not None:
            return False, 0
        skipped = max(skipped, skips)
    return _first_disagreement(outcome.case, cast(list[torch.Tensor], results)) is None, skipped


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


def count_contributions(
    fn: Target | Launcher, probes: Sequence[Case], rank: int | None = None
) -> list[list[float]] | None:
    """``counts[j][e]`` = the target's element ``e`` on ``probes[j]`` (only worker ``j`` holds ones).

    Each count is measured from the target's result on all zeros (called
    first): a correct all-reduce gives 0 there and 1 everywhere here; ``k``
    means worker ``j``'s contribution to element ``e`` was counted ``k``
    times, and a target that adds a constant is not taken for one that counts
    twice.  ``None`` when a probe call does not return a well-formed result
    (the remaining probes are not run, so a target that hangs costs at most
    one more time limit).  For a per-rank target the probes run on the whole
    group and ``rank``'s result is read.
    """
    launcher = as_launcher(fn)
    if not probes:
        return []
    zero = well_formed(launcher.call(replace(probes[0], values=(0.0,) * len(probes[0].values))), rank)
    if zero is None:
        return None
    base = as_float_list(zero)
    counts = []
    for probe in probes:
        result = well_formed(launcher.call(probe), rank)
        if result is None:
            return None
        counts.append([c - b for c, b in zip(as_float_list(result), base, strict=True)])
    return counts


def _count_finding(case: Case, counts: list[list[float]], mismatch: ValueMismatch) -> Finding | None:
    """``double-counted`` (or lost contributions: ``out-of-bound``) from whole-number probe counts.

    ``None`` when every count is 1, or when some count is not a whole number
    (then the counts are not contribution counts: a mean, a scaling, rounding).
    """
    per_element = [list(col) for col in zip(*counts, strict=True)]
    if not all(c == round(c) and c >= 0 for col in per_element for c in col):
        return None
    off = [e for e, col in enumerate(per_element) if any(c != 1 for c in col)]
    if not off:
        return None
    doubled = [e for e in off if any(c >= 2 for c in per_element[e])]
    pool = doubled or off
    first_flat = flat_of(case, mismatch.index)
    e = first_flat if first_flat in pool else pool[0]
    index, chunk = locate(case, e)
    per = per_element[e]
    listing = ", ".join(f"worker {j}: {c:g}" for j, c in enumerate(per))
    probe = f"with only worker j holding ones (the rest zeros), element {index} (chunk {chunk}) is {listing}"
    missing = [j for j, c in enumerate(per) if c == 0]
    lost = f", worker(s) {missing} lost" if missing else ""
    if doubled:
        twice = [j for j, c in enumerate(per) if c >= 2]
        per_worker = len(case.values) // case.n
        weighted = sum(
            (Fraction(c) * Fraction(case.values[j * per_worker + e]) for j, c in enumerate(per)), Fraction(0)
        )
        check = (
            f"; summing the counterexample with these counts gives {float(weighted)!r} there"
            if e == first_flat
            else ""
        )
        return Finding(
            ["double-counted"],
            f"Contributions counted more than once (e.g. all-gather adding instead of copying): {probe}, "
            f"so worker(s) {twice} counted more than once{lost}{check}",
            mismatch,
        )
    return Finding(["out-of-bound"], f"Contributions missing: {probe}, so worker(s) {missing} lost", mismatch)


def _describe(m: ValueMismatch) -> str:
    more = f" ({m.count} element(s) differ)" if m.count > 1 else ""
    return (
        f"First differing element {m.index} (chunk {m.chunk}): expected {m.expected!r}, "
        f"actual {m.actual!r}; {m.detail}{more}"
    )


def diagnose(fn: Target | Launcher, outcome: Outcome, mode: Mode) -> Finding | None:
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
    results = [result_tensor(a, case) for a in outcome.answers]
    if all(r is not None for r in results):
        values = cast(list[torch.Tensor], results)
        ranks = [a.rank for a in outcome.answers]
        mismatches = [check_values(mode, case, t)[0] for t in values]
        failing = [k for k, m in enumerate(mismatches) if m is not None]
        passing = [k for k, m in enumerate(mismatches) if m is None]
        disagreement = _first_disagreement(case, values, passing[0] if passing else 0)
        found = None
        if failing:
            k = failing[0]
            found = _classify_values(
                launcher, case, values[k], mode, cast(ValueMismatch, mismatches[k]), rank=ranks[k]
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
        if passing and disagreement is not None and (found is None or found.codes[0] not in _COUNTING):
            found = _disagree_finding(ranks, passing[0], disagreement, failing, mismatches)
        if found is not None:
            findings.append(found)
    if not findings:
        return None
    codes = [c for f in findings for c in f.codes]
    return Finding(
        list(dict.fromkeys(codes)),
        "; ".join(f"{'/'.join(f.codes)}: {f.explanation}" for f in findings),
        next((f.mismatch for f in findings if f.mismatch is not None), None),
        ranks=next((f.ranks for f in findings if f.ranks), []),
    )


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
    fn: Launcher, case: Case, result: torch.Tensor, mode: Mode, m: ValueMismatch, *, rank: int | None
) -> Finding:
    """Name a value mismatch: double-counted, mean-not-sum, not-ring-order or out-of-bound.

    The one-hot probes come first: whole-number contribution counts other
    than 1 are a counting bug whatever the counterexample's values (a lost
    worker on identical rows also looks like a mean).  ``mean-not-sum`` needs
    the result out of bound, within rounding of the sum / N, and every probe
    (where it ran) to give 1 / N as well.
    """
    actual = as_float_list(result)
    within_bound = check_bound(case, actual).mismatch is None
    probes = probe_cases(case)
    counts = count_contributions(fn, probes, rank)
    if counts is not None:
        counted = _count_finding(case, counts, m)
        if counted is not None:
            counted.explanation = f"{_describe(m)}. {counted.explanation}"
            return counted
    probes_mean = counts is None or all(_is_mean(p, row) for p, row in zip(probes, counts, strict=True))
    if not within_bound and probes_mean and _is_mean(case, actual):
        return Finding(
            ["mean-not-sum"],
            f"{_describe(m)}. The result is the sum divided by N = {case.n} (the mean), not the sum",
            m,
        )
    counted_once = counts is not None and all(c == 1 for row in counts for c in row)
    if mode == "exact" and counted_once and within_bound:
        rng = random.Random(len(case.values))
        probe = replace(case, values=order_free_values(case.dtype, case.n, len(case.values), rng))
        probe_result = well_formed(fn.call(probe), rank)
        if probe_result is not None and check_values("order-free", probe, probe_result)[0] is None:
            return Finding(
                ["not-ring-order"],
                f"{_describe(m)}. A correct sum in a different summation order: every contribution is "
                "counted once, the result is within the forward-error bound of the exact sum and exact on "
                "order-free inputs, but not bitwise the ring's fold order (clause fold-order); only "
                f"--mode exact requires that order{_revealed_order(fn, case, m, rank)}",
                m,
            )
    return Finding(
        ["out-of-bound"], f"{_describe(m)}. Wrong values, not explained by a more specific code", m
    )


def _revealed_order(fn: Launcher, case: Case, m: ValueMismatch, rank: int | None) -> str:
    """``; ... the target sums that element as fold 2,1,0``: reveal on the counterexample's shape.

    Clause ``difftest-exact-orders``; the probes are float32 (float64 for a
    float64 case) of the counterexample's shape.  Empty when reveal cannot run.
    """
    from ring_ref._orders import explain_element
    from ring_ref.schedule import SPEC

    def call(x: torch.Tensor) -> torch.Tensor:
        values = tuple(x.to(torch.float64).reshape(-1).tolist())
        got = well_formed(fn.call(replace(case, dtype=x.dtype, layout="contiguous", values=values)), rank)
        if got is None:
            raise RuntimeError("the target gave no well-formed answer to a probe")
        return got

    found = explain_element(call, case, flat_of(case, m.index))
    if not found:
        return ""
    spec = ""
    if EXACT_ORDER.get() is SPEC_ORDER:
        spec = f", where the spec's ring folds {','.join(map(str, SPEC.fold_order(m.chunk, case.n)))}"
    precision = "float64" if case.dtype == torch.float64 else "float32"
    return f"; revealed on {precision} inputs of that shape (ring-ref reveal), {found}{spec}"


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
