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
from dataclasses import dataclass, replace
from fractions import Fraction

import torch

from ring_ref._dtypes import bits, format_of
from ring_ref.difftest._call import Outcome, TensorView, aliases, input_problem, well_formed
from ring_ref.difftest._inputs import Case, order_free_values, probe_cases
from ring_ref.difftest._launch import InProcess, Launcher
from ring_ref.difftest._oracles import (
    ValueMismatch,
    as_float_list,
    check_bound,
    check_values,
    exact_sums,
    flat_of,
    locate,
)
from ring_ref.difftest._vocabulary import Mode, Target

__all__ = ["Finding", "as_launcher", "count_contributions", "diagnose", "difference", "structural"]


@dataclass
class Finding:
    """Diagnosis codes for one counterexample, with a human explanation (and a stack, if one was taken)."""

    codes: list[str]
    explanation: str
    mismatch: ValueMismatch | None = None
    stack: str = ""


def as_launcher(fn: Target | Launcher) -> Launcher:
    """``fn`` itself when it is a launcher, else ``fn`` called in-process."""
    return fn if isinstance(fn, Launcher) else InProcess(fn)


def structural(outcome: Outcome) -> list[tuple[str, str]]:
    """Codes that need no oracle: no answer, exceptions, shape, dtype, device, mutation, aliasing."""
    case, answer = outcome.case, outcome.answer
    if outcome.failure is not None:
        return [(outcome.failure.code, outcome.failure.text)]
    if answer is None:
        return [("crashed", "no answer came back")]
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


def count_contributions(fn: Target | Launcher, probes: Sequence[Case]) -> list[list[float]] | None:
    """``counts[j][e]`` = the target's element ``e`` on ``probes[j]`` (only worker ``j`` holds ones).

    A correct all-reduce gives 1 everywhere; ``k`` means worker ``j``'s
    contribution to element ``e`` was counted ``k`` times.  ``None`` when a
    probe call does not return a well-formed result (the remaining probes are
    not run, so a target that hangs costs at most one more time limit).
    """
    launcher = as_launcher(fn)
    counts = []
    for probe in probes:
        result = well_formed(launcher.call(probe))
        if result is None:
            return None
        counts.append(as_float_list(result))
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
    launcher that produced ``outcome``.
    """
    if outcome.failure is not None:
        return Finding([outcome.failure.code], outcome.failure.text, stack=outcome.failure.stack)
    found = structural(outcome)
    result = well_formed(outcome)
    mismatch = check_values(mode, outcome.case, result)[0] if result is not None else None
    findings = [Finding([code], text) for code, text in found]
    if result is not None and mismatch is not None:
        findings.append(_classify_values(as_launcher(fn), outcome.case, result, mode, mismatch))
    if not findings:
        return None
    codes = [c for f in findings for c in f.codes]
    return Finding(
        list(dict.fromkeys(codes)),
        "; ".join(f"{'/'.join(f.codes)}: {f.explanation}" for f in findings),
        next((f.mismatch for f in findings if f.mismatch is not None), None),
    )


def _classify_values(fn: Launcher, case: Case, result: torch.Tensor, mode: Mode, m: ValueMismatch) -> Finding:
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
    counts = count_contributions(fn, probes)
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
        probe_result = well_formed(fn.call(probe))
        if probe_result is not None and check_values("order-free", probe, probe_result)[0] is None:
            return Finding(
                ["not-ring-order"],
                f"{_describe(m)}. A correct sum in a different summation order: every contribution is "
                "counted once, the result is within the forward-error bound of the exact sum and exact on "
                "order-free inputs, but not bitwise the ring's fold order (clause fold-order); only "
                "--mode exact requires that order",
                m,
            )
    return Finding(
        ["out-of-bound"], f"{_describe(m)}. Wrong values, not explained by a more specific code", m
    )


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
    a, b = first.answer, second.answer
    if a is None or b is None:
        return ""
    if a.raised != b.raised:
        return f"the first call {_ending(a.raised)}, the second {_ending(b.raised)}"
    return _view_difference("result", a.result, b.result) or _view_difference(
        "the input after the call,", a.argument, b.argument
    )


def _ending(raised: str) -> str:
    return f"raised {raised}" if raised else "returned"
