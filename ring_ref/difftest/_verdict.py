"""The verdict on one call: does its outcome pass a mode's oracle, and which structural faults it has.

:func:`passes` is what the search asks of every result (clause ``difftest-oracles``): no structural
fault (:func:`structural`: no answer, an exception, shape, dtype, device, mutation, aliasing), every
rank's values within the mode's oracle for the expected order, and, for a group, every rank with the
same bits (:func:`first_disagreement`).  :func:`difference` says whether two answers to the same case
differ (``nondeterministic``).  Naming *why* a result fails is the diagnosis'
(:mod:`ring_ref.difftest._diagnosis`).
"""

from __future__ import annotations

from typing import cast

import torch

from ring_ref._dtypes import bits
from ring_ref._hints import shape_hint
from ring_ref.difftest._call import Answer, Outcome, TensorView, aliases, input_problem, kind_hint
from ring_ref.difftest._call import results as results_of
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._oracles import SPEC_ORDER, ExactOrder, ValueMismatch, check_values, locate
from ring_ref.difftest._vocabulary import Mode
from ring_ref.schedule import Layout

__all__ = ["difference", "first_disagreement", "passes", "structural"]


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
        where = answer.raised_at.words() if answer.raised_at is not None else ""
        return [("raised", f"raised {answer.raised} (on a valid input){where}{hint}{kind_hint(answer)}")]
    found: list[tuple[str, str]] = []
    want_shape = case.result_shape(answer.rank)
    result = answer.result
    if result is None:
        found.append(
            ("wrong-shape", f"returned {answer.type_name}, not a torch.Tensor of shape {want_shape}")
        )
    else:
        if result.shape != want_shape:
            per_rank = answer.rank is not None
            hint = shape_hint(
                result.shape, want_shape, n=case.n, per_rank=per_rank, collective=case.collective
            )
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


def passes(outcome: Outcome, mode: Mode, order: ExactOrder = SPEC_ORDER) -> tuple[bool, int, int]:
    """Whether one call's outcome passes ``mode``'s checks, and how many elements it accepted where an
    order could overflow (and, for ``prod``, underflow).

    For a group: every rank's result passes the oracle and all have the same bits.  ``order``: what
    ``exact`` checks against (and whose layout labels chunks).
    """
    if structural(outcome):
        return False, 0, 0
    results = list(results_of(outcome).values())
    if any(r is None for r in results):
        return False, 0, 0
    overflow = underflow = 0
    for result in results:
        mismatch, over, under = check_values(mode, outcome.case, cast(torch.Tensor, result), order)
        if mismatch is not None:
            return False, 0, 0
        overflow, underflow = max(overflow, over), max(underflow, under)
    agree = first_disagreement(outcome.case, cast(list[torch.Tensor], results), order.layout) is None
    return agree, overflow, underflow


def first_disagreement(
    case: Case, results: list[torch.Tensor], layout: Layout, reference: int = 0
) -> tuple[list[int], ValueMismatch] | None:
    """The ranks whose bits differ from rank ``reference``'s, and the first such element of the first one."""
    ref = bits(results[reference])
    differ = [r for r, t in enumerate(results) if not torch.equal(bits(t), ref)]
    if not differ:
        return None
    other = results[differ[0]]
    diff = (bits(other) != ref).reshape(-1).nonzero()
    e = int(diff[0])
    index, chunk = locate(case, e, layout)
    want, got = float(results[reference].reshape(-1)[e]), float(other.reshape(-1)[e])
    detail = f"rank {differ[0]} has {got!r} where rank {reference} has {want!r}"
    return differ, ValueMismatch(index, chunk, want, got, detail, int(diff.numel()))


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
