"""Diagnosis: each planted bug gets its code and an explanation naming the element, chunk and values."""

from __future__ import annotations

import json
import linecache
import math
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._dtypes import format_of
from ring_ref._reveal import RevealError, reveal
from ring_ref.difftest import CODES, DTYPES, Case, difftest
from ring_ref.difftest._call import Answer, Failure, Outcome, RaisedAt, call_target, decode, observe
from ring_ref.difftest._diagnosis import _divided_first, diagnose, plus_zeros_only
from ring_ref.difftest._diagnosis_probes import (
    count_contributions,
    op_probe_rows,
    op_probe_values,
    position_probe,
    times_reciprocal,
)
from ring_ref.difftest._inputs import (
    LAYOUTS,
)
from ring_ref.difftest._launch import Launcher, OutputLog, as_launcher
from ring_ref.difftest._oracles import SPEC_ORDER, ExactOrder
from ring_ref.difftest._orders import per_rank_target, schedule_order
from ring_ref.difftest._verdict import difference, passes, structural
from ring_ref.difftest._vocabulary import RANKS, Mode, Op
from ring_ref.testing import assert_matches_reference
from tests.common import planted_impls, planted_orders, planted_rank_impls
from tests.common.oracles import exact_sum, ring_fold, same_bits, spec_slot
from tests.common.paths import ROOT
from tests.common.planted_impls import Impl, run_all

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
GUIDE = (ROOT / "docs" / "guide" / "difftest.md").read_text(encoding="utf-8")
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())


@pytest.mark.clause("difftest-diagnoses", "sum-not-mean", "ag-copy-not-add", "input-unchanged")
@pytest.mark.clause("no-aliasing", "preserve-dtype-device", "output-shape", "n1-no-rounds")
@pytest.mark.clause("difftest-narrowed-dtype")
@pytest.mark.parametrize("bug", list(planted_impls.EXPECTED), ids=lambda f: f.__name__)
def test_planted_bug_gets_its_code_in_every_mode(bug: Impl) -> None:
    report = run_all(bug)
    expected = planted_impls.EXPECTED[bug]
    assert report.verdict == "fail"
    for mode, result in report.modes.items():
        assert result.verdict == "fail", (mode, report.render())
        assert result.finding is not None and result.counterexample is not None
        assert set(result.finding.codes) == expected, (mode, result.finding.explanation)
    assert set(report.diagnoses) == expected
    rendered = report.render()
    assert "counterexample: N = " in rendered
    assert f"--seed {report.seed}" in rendered


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("bug", "words"),
    [
        (planted_impls.gather_adds, "worker(s) [0] counted more than once"),
        (planted_impls.drops_last_worker, "worker(s) [1] lost"),
        (planted_impls.mean_instead_of_sum, "divided by N = 2"),
    ],
    ids=lambda v: getattr(v, "__name__", "words"),
)
def test_value_bugs_shrink_to_two_workers_and_name_element_chunk_and_values(bug: Impl, words: str) -> None:
    result = difftest(bug, modes=("order-free",), examples=30, seed=5).modes["order-free"]
    assert result.counterexample is not None and result.finding is not None
    cex = result.counterexample
    assert (cex.n, cex.m, cex.trailing) == (2, 2, ())
    assert words in result.finding.explanation
    m = result.finding.mismatch
    assert m is not None
    # The named element really holds those values: recompute both independently.
    x = cex.tensor()
    want = float(exact_sum(x)[m.index[0]])
    got = float(bug(cex.tensor())[m.index])
    assert (m.expected, m.actual, m.chunk) == (want, got, m.index[0] // (cex.m // cex.n))
    assert want != got
    assert f"First differing element {m.index} (chunk {m.chunk})" in result.finding.explanation


@pytest.mark.clause("difftest-diagnoses", "fold-order")
def test_torch_sum_fails_only_exact_with_not_ring_order() -> None:
    report = run_all(planted_impls.torch_sum, examples=40)
    verdicts = {mode: r.verdict for mode, r in report.modes.items()}
    assert verdicts == {"exact": "fail", "order-free": "pass", "bound": "pass"}
    assert report.diagnoses == ["not-ring-order"]
    assert report.only_ring_order
    assert "passes order-free and bound" in report.summary()
    exact = report.modes["exact"]
    assert exact.counterexample is not None and exact.finding is not None
    x = exact.counterexample.tensor()
    assert not same_bits(torch.sum(x, 0), ring_fold(x))  # the counterexample really separates the orders


def _lose_second_worker(x: torch.Tensor) -> torch.Tensor:
    return x[0].clone() if x.shape[0] == 2 else ring_all_reduce(x)


def _count_first_worker_thrice(x: torch.Tensor) -> torch.Tensor:
    return 3 * x[0] if x.shape[0] == 2 else ring_all_reduce(x)


def _halve(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x) / x.shape[0]


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("bug", "code", "words"),
    [
        # Identical rows: x[0] is also exactly the mean; the one-hot probes show worker 1 lost.
        (_lose_second_worker, "out-of-bound", "worker(s) [1] lost"),
        (_halve, "mean-not-sum", "divided by N = 2"),
        # An element with one worker counted three times and the other lost is double-counted.
        (
            _count_first_worker_thrice,
            "double-counted",
            "worker(s) [0] counted more than once, worker(s) [1] lost",
        ),
    ],
    ids=["lost", "mean", "thrice-and-lost"],
)
def test_codes_on_inputs_where_a_lost_worker_looks_like_a_mean(bug: Impl, code: str, words: str) -> None:
    case = Case(2, 2, (), torch.float32, "contiguous", (3.0, 0.0, 3.0, 0.0))
    for mode in ("exact", "order-free", "bound"):
        finding = diagnose(bug, call_target(bug, case), mode)
        assert finding is not None and finding.codes == [code], (mode, finding)
        assert words in finding.explanation


@pytest.mark.clause("difftest-diagnoses")
def test_assert_matches_reference_message_carries_diagnosis_and_counterexample() -> None:
    with pytest.raises(AssertionError) as info:
        assert_matches_reference(planted_impls.gather_adds, mode="order-free", examples=20, seed=9)
    message = str(info.value)
    assert "double-counted" in message and "counterexample: N = 2" in message and "input = " in message
    assert "--seed 9" in message
    assert assert_matches_reference(planted_impls.in_place_ring, mode="exact", examples=10).verdict == "pass"
    with pytest.raises(ValueError, match="mode must be one of"):
        assert_matches_reference(ring_all_reduce, mode="bitwise")


@pytest.mark.clause("difftest-diagnoses")
def test_the_guide_documents_every_code_and_the_schema() -> None:
    # docs/guide/difftest.md: its table of diagnosis codes, and the JSON report's schema.
    codes = GUIDE[GUIDE.index("## Diagnosis codes") :].split("\n## ")[0]
    for code in CODES:
        assert f"| `{code}` |" in codes, code
    assert "spec/difftest_report.schema.json" in GUIDE
    # The schema's vocabularies are the module's.
    assert SCHEMA["$defs"]["code"]["enum"] == list(CODES)
    assert SCHEMA["properties"]["ranks"]["oneOf"][0]["enum"] == list(RANKS)
    assert SCHEMA["$defs"]["counterexample"]["properties"]["dtype"]["enum"] == list(DTYPES)
    assert SCHEMA["$defs"]["counterexample"]["properties"]["layout"]["enum"] == list(LAYOUTS)


def _adds_one(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x) + 1


@pytest.mark.clause("difftest-diagnoses")
def test_a_target_that_adds_a_constant_is_not_taken_for_double_counting() -> None:
    # On a one-hot probe, sum + 1 is 2 = "counted twice"; measured from its result on zeros it is 1.
    case = Case(2, 2, (), torch.float32, "contiguous", (3.0, 0.0, 3.0, 0.0))
    for mode in ("exact", "order-free", "bound"):
        finding = diagnose(_adds_one, call_target(_adds_one, case), mode)
        assert finding is not None and finding.codes == ["out-of-bound"], (mode, finding)


# --- a target of the other kind (issue #29 item 8) -----------------------------------------------------


class _OneOutcome(Launcher):
    """A launcher whose every call gives the same per-rank answers, built by hand."""

    isolated, kind, per_rank = True, "fake ranks", True

    def __init__(self, answers: tuple[Answer, ...]) -> None:
        self.answers = answers

    def start(self) -> None:
        """Nothing to start."""

    def call(self, case: Case) -> Outcome:
        """The same answers for every case."""
        return Outcome(case, self.answers)

    def close(self) -> None:
        """Nothing to stop."""


@pytest.mark.clause("difftest-diagnoses")
def test_a_per_rank_target_called_stacked_gets_the_ranks_hint() -> None:
    """``dist.all_reduce`` with no process group, called on ``worker_tensors``: add --ranks."""
    report = difftest(planted_rank_impls.plain_ring, modes="bound", examples=2, seed=1, isolate=False)
    finding = report.modes["bound"].finding
    assert finding is not None and finding.codes == ["raised"]
    assert "this looks like a per-rank target: add --ranks gloo" in finding.explanation
    assert "--ranks mpi (ranks='mpi') for TARGET(comm, array)" in finding.explanation


@pytest.mark.clause("difftest-diagnoses")
def test_a_stacked_target_called_per_rank_gets_the_drop_ranks_hint_and_others_get_none() -> None:
    case = Case(2, 2, (), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0))
    index = Answer("NoneType", raised="IndexError: tuple index out of range", rank=1)
    [(code, text)] = structural(Outcome(case, (index,)))
    assert code == "raised" and text.startswith("rank(s) [1]: raised IndexError: tuple index out of range")
    assert text.endswith(
        "this looks like a stacked target (worker_tensors of shape (N, M, ...)): drop --ranks (ranks=None)"
    )
    for answer in (
        Answer("NoneType", raised="RuntimeError: boom", rank=0),  # no sign of the other kind
        Answer("NoneType", raised="IndexError: tuple index out of range"),  # stacked and called stacked
        Answer("NoneType", raised="ValueError: Default process group has not been initialized", rank=0),
    ):
        assert "this looks like" not in structural(Outcome(case, (answer,)))[0][1]


@pytest.mark.clause("difftest-diagnoses")
def test_reveal_over_ranks_shows_the_target_s_own_exception() -> None:
    raised = Answer("NoneType", raised="IndexError: tuple index out of range", rank=0)
    fine = Answer("NoneType", raised="KeyError: 'x'", rank=1)
    call = per_rank_target(_OneOutcome((raised, fine)))
    with pytest.raises(RevealError) as info:
        reveal(call, 2, 2, "float32")
    message = str(info.value)
    assert message.startswith("rank(s) [0, 1] gave no well-formed (2,) torch.float32 result: ")
    assert "rank 0 raised IndexError: tuple index out of range; this looks like a stacked target" in message
    assert "rank 1 raised KeyError: 'x'" in message and message.count("drop --ranks") == 1


# ==========================================================================================================
# The diagnosis (``ring_ref.difftest._diagnosis``) on outcomes of small targets called in this process.
#
# Each test calls the target on a hand-written :class:`Case` and checks the
# codes and the words of the explanation the guide's table of diagnoses (``docs/guide/difftest.md``)
# promises (section *Differential testing*, clause ``difftest-diagnoses``):
# structural codes first, then value codes from the one-hot counting probes,
# the op probes, the average's divided-first probes, the signs of zeros and
# the ring's fold order; per-rank outcomes through a fake launcher that calls
# a function once per rank; and how two answers to one case differ.  Expected
# values are worked out by hand (small whole numbers, exact in every order) or
# by ``tests/common/oracles.py``.
# ==========================================================================================================


MODES: tuple[Mode, ...] = ("exact", "order-free", "bound")
VALUE_CODES = {
    "double-counted",
    "mean-not-sum",
    "not-ring-order",
    "out-of-bound",
    "sum-not-op",
    "wrong-op",
    "avg-divided-first",
    "signed-zero",
    "narrowed-dtype",
}

# N = 2 workers of M = 2: worker 0 holds 1, 2 and worker 1 holds 3, 4, so the sum is 4, 6 in every order.
PAIR = Case(2, 2, (), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0))


def case(
    values: tuple[float, ...], op: Op | None = None, n: int = 2, dtype: torch.dtype = torch.float32
) -> Case:
    return Case(n, len(values) // n, (), dtype, "contiguous", values, op)


def find(
    fn: Callable[..., torch.Tensor], c: Case, mode: Mode, order: ExactOrder = SPEC_ORDER
) -> tuple[list[str], str]:
    finding = diagnose(fn, call_target(fn, c), mode, order)
    assert finding is not None, (mode, c)
    prefix = f"{finding.codes[0]}: "
    assert finding.explanation.startswith(prefix), finding.explanation
    if finding.codes[-1] in VALUE_CODES:  # a wrong value: the finding shows the element
        m = finding.mismatch
        assert m is not None and finding.explanation.startswith(f"{prefix}First differing element {m.index} ")
    return finding.codes, finding.explanation.removeprefix(prefix)


class PerRank(Launcher):
    """A fake per-rank launcher: ``fn(case, rank)`` is rank ``rank``'s result, observed as a rank's answer."""

    isolated = False
    kind = "fake-ranks"
    per_rank = True

    def __init__(self, fn: Callable[[Case, int], Any]) -> None:
        self.fn = fn
        self.output = OutputLog()
        self.calls = 0

    def start(self) -> None:
        """Nothing to start."""

    def close(self) -> None:
        """Nothing to stop."""

    def call(self, case: Case) -> Outcome:
        self.calls += 1
        answers = []
        for r in range(case.n):

            def one(x: torch.Tensor, r: int = r, **_: object) -> Any:
                return self.fn(case, r)

            answers.append(decode(*observe(one, case, r)))
        return Outcome(case, tuple(answers))


def each_rank(*results: torch.Tensor) -> PerRank:
    """Rank ``r`` returns ``results[r]`` whatever the case."""
    return PerRank(lambda c, r: results[r].clone())


def sums(c: Case) -> torch.Tensor:
    """The exact sum of a case whose partial sums are exact (small whole numbers)."""
    return c.tensor().to(torch.float64).sum(0).to(c.dtype)


# --- structural ----------------------------------------------------------------------------------------


@pytest.mark.clause("difftest-diagnoses")
def test_a_call_that_did_not_answer_is_its_failure_with_stack_and_ranks() -> None:
    failure = Failure("timed-out", "no answer within 1 s (--timeout)", "File x, line 3", (1, 2))
    outcome = Outcome(PAIR, failure=failure)
    assert structural(outcome) == [("timed-out", "no answer within 1 s (--timeout)")]
    finding = diagnose(planted_impls.torch_sum, outcome, "bound")
    assert finding is not None
    assert (finding.codes, finding.explanation) == (["timed-out"], "no answer within 1 s (--timeout)")
    assert (finding.stack, finding.ranks) == ("File x, line 3", [1, 2])
    assert passes(outcome, "bound") == (False, 0, 0)


@pytest.mark.clause("difftest-diagnoses")
def test_no_answer_at_all_is_a_crash() -> None:
    assert structural(Outcome(PAIR)) == [("crashed", "no answer came back")]
    finding = diagnose(planted_impls.torch_sum, Outcome(PAIR), "exact")
    assert finding is not None and finding.codes == ["crashed"]


def _at(fn: Callable[..., object]) -> str:
    """`` at FILE:LINE: SOURCE``: where a function that raises on its first line raised, as the report
    names it (clause ``difftest-raised-at``), from Python's own code object."""
    file, line = fn.__code__.co_filename, fn.__code__.co_firstlineno + 1
    return f" at {file}:{line}: {linecache.getline(file, line).strip()}"


def _raises_value_error(x: torch.Tensor) -> torch.Tensor:
    raise ValueError("a ring needs at least two workers")


@pytest.mark.clause("difftest-diagnoses")
def test_an_exception_is_raised_on_a_valid_input_and_the_launchers_note_follows_it() -> None:
    outcome = call_target(_raises_value_error, PAIR)
    at = _at(_raises_value_error)
    said = f"raised ValueError: a ring needs at least two workers (on a valid input){at}"
    assert structural(outcome) == [("raised", said)]
    noted = replace(outcome, note="rank 1 was stopped")
    assert structural(noted) == [("raised", f"{said}; rank 1 was stopped")]
    finding = diagnose(_raises_value_error, noted, "exact")
    assert finding is not None
    assert (finding.codes, finding.explanation) == (["raised"], f"raised: {said}; rank 1 was stopped")
    assert finding.mismatch is None and finding.ranks == []


@pytest.mark.clause("difftest-diagnoses", "difftest-raised-at")
def test_a_group_raised_where_its_first_rank_with_a_place_raised_and_keeps_the_stack() -> None:
    at = RaisedAt("/u/t.py", 12, "return xs[9]")
    answers = (
        Answer("IndexError", raised="IndexError: list index out of range", rank=0),  # no place of its own
        Answer("IndexError", raised="IndexError: list index out of range", rank=1, raised_at=at),
        Answer(
            "IndexError",
            raised="IndexError: list index out of range",
            rank=2,
            raised_at=RaisedAt("/u/t.py", 3),
        ),
    )
    outcome = Outcome(case((1.0, 2.0, 3.0), n=3), answers, stack="rank 1:\n  File /u/t.py, line 12")
    finding = diagnose(planted_impls.torch_sum, outcome, "bound")
    assert finding is not None and finding.codes == ["raised"]
    assert finding.raised_at == at
    assert finding.stack == "rank 1:\n  File /u/t.py, line 12"
    nowhere = diagnose(planted_impls.torch_sum, replace(outcome, answers=answers[:1]), "bound")
    assert nowhere is not None and nowhere.codes == ["raised"] and nowhere.raised_at is None


@pytest.mark.clause("difftest-diagnoses")
def test_the_note_is_added_to_raised_only() -> None:
    outcome = replace(
        call_target(planted_impls.computes_in_float32, case((1.0, 2.0), n=1, dtype=torch.float64))
    )
    noted = replace(outcome, note="rank 1 was stopped")
    assert structural(noted) == [("dtype-changed", "result dtype torch.float32, input dtype torch.float64")]


def _takes_no_op(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x)


def _type_error_with_op(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    raise TypeError("bad op here")


def _type_error_without(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    raise TypeError("nothing to see")


def _value_error_with_op(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    raise ValueError("bad op here")


HINT = "with --op the target is called with op= too (op='max'): does it take one?"


@pytest.mark.clause("difftest-diagnoses")
def test_a_target_that_takes_no_op_gets_the_hint_with_op_only() -> None:
    [(code, text)] = structural(call_target(_takes_no_op, replace(PAIR, op="max")))
    assert code == "raised" and text.startswith("raised TypeError: ")
    assert text.endswith(f"(on a valid input); {HINT}")
    assert structural(call_target(_type_error_with_op, replace(PAIR, op="max"))) == [
        ("raised", f"raised TypeError: bad op here (on a valid input){_at(_type_error_with_op)}; {HINT}")
    ]
    for fn, c in [
        (_type_error_with_op, PAIR),  # no --op: the target was called without op=
        (_type_error_without, replace(PAIR, op="max")),  # a TypeError about something else
        (_value_error_with_op, replace(PAIR, op="max")),  # not a TypeError
    ]:
        [(code, text)] = structural(call_target(fn, c))
        assert code == "raised" and text.endswith(f"(on a valid input){_at(fn)}"), text


def _returns_a_list(x: torch.Tensor) -> list[float]:
    return [4.0, 6.0]


def _one_row_too_many(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(3, dtype=x.dtype)


def _float64_on_meta(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x).to("meta", torch.float64)


@pytest.mark.clause("difftest-diagnoses")
def test_shape_dtype_and_device_are_named_as_the_readme_shows() -> None:
    assert structural(call_target(_returns_a_list, PAIR)) == [
        ("wrong-shape", "returned list, not a torch.Tensor of shape (2,)")
    ]
    assert structural(call_target(planted_impls.stack_of_copies, PAIR)) == [
        ("wrong-shape", "result shape (2, 2), expected (2,) (a stack of N copies?)")
    ]
    assert structural(call_target(_one_row_too_many, PAIR)) == [
        ("wrong-shape", "result shape (3,), expected (2,)")
    ]
    assert structural(call_target(_float64_on_meta, PAIR)) == [
        ("dtype-changed", "result dtype torch.float64, input dtype torch.float32"),
        ("device-changed", "result on meta, input on cpu"),
    ]
    assert passes(call_target(_float64_on_meta, PAIR), "bound") == (False, 0, 0)


def _modifies_and_doubles(x: torch.Tensor) -> torch.Tensor:
    x.mul_(2)
    return x.sum(0)


@pytest.mark.clause("difftest-diagnoses")
def test_input_modified_and_aliasing_then_the_value_code_in_one_finding() -> None:
    one = case((1.0, 2.0), n=1)
    assert structural(call_target(planted_impls.returns_view_of_input, one)) == [
        ("aliases-input", "the result shares storage with the input (a view of it?)")
    ]
    outcome = call_target(_modifies_and_doubles, PAIR)
    [(code, text)] = structural(outcome)
    assert code == "input-modified" and text.startswith("the input was modified: element (0, 0) was 1.0")
    finding = diagnose(_modifies_and_doubles, outcome, "order-free")
    assert finding is not None
    assert finding.codes == ["input-modified", "double-counted"]
    first, second = finding.explanation.split("; double-counted: ", 1)
    assert first.startswith("input-modified: the input was modified")
    assert second.startswith("First differing element (0,) (chunk 0): expected 4.0, actual 8.0")
    assert finding.mismatch is not None and finding.mismatch.actual == 8.0


@pytest.mark.clause("difftest-diagnoses")
def test_a_correct_target_passes_with_nothing_to_say() -> None:
    for mode in MODES:
        outcome = call_target(ring_all_reduce, PAIR)
        assert structural(outcome) == []
        assert passes(outcome, mode) == (True, 0, 0)
        assert diagnose(ring_all_reduce, outcome, mode) is None


# --- passes: overflow and underflow counts --------------------------------------------------------------


@pytest.mark.clause("difftest-diagnoses")
def test_passes_counts_the_elements_accepted_where_an_order_could_overflow_or_underflow() -> None:
    big = case((60000.0, 1.0, 60000.0, 1.0), dtype=torch.float16)  # 120000 overflows float16; 2 does not
    assert passes(call_target(ring_all_reduce, big), "bound") == (True, 1, 0)
    tiny = 2.0**-100  # the product of two is 2**-200, below float32's normal range
    prod = case((tiny, 1.0, tiny, 1.0), op="prod")
    assert passes(call_target(planted_impls.op_ring, prod), "bound") == (True, 0, 1)
    assert passes(call_target(planted_impls.drops_last_worker, big), "bound") == (False, 0, 0)


@pytest.mark.clause("difftest-diagnoses")
def test_a_group_passes_only_when_every_rank_passes_with_the_same_bits() -> None:
    right = sums(PAIR)
    assert passes(PerRank(lambda c, r: right.clone()).call(PAIR), "bound") == (True, 0, 0)
    # Rank 1 folds 1 + 3 in another way: within the bound, not rank 0's bits.
    eps = 2.0**-24
    c = Case(3, 3, (), torch.float32, "contiguous", (1.0, 1.0, 1.0, eps, eps, eps, eps, eps, eps))
    ring, other = ring_all_reduce(c.tensor()), torch.sum(c.tensor(), 0)
    group = PerRank(lambda c, r: (ring if r == 0 else other).clone()).call(c)
    assert passes(group, "bound") == (False, 0, 0)
    assert passes(PerRank(lambda c, r: ring.clone()).call(c), "bound") == (True, 0, 0)
    # Overflow counts are the most any rank accepted, also when the ranks then disagree: 60000 - 60000
    # may overflow in some order (the oracle cannot rule it out), so inf is accepted there, and so is 0.
    cancel = case((60000.0, 1.0, -60000.0, 1.0), dtype=torch.float16)
    inf, zero = torch.tensor([torch.inf, 2.0]).half(), torch.tensor([0.0, 2.0]).half()
    for rank0, rank1 in [(inf, zero), (zero, inf)]:
        assert passes(each_rank(rank0, rank1).call(cancel), "bound") == (False, 1, 0)
    assert passes(PerRank(lambda c, r: inf.clone()).call(cancel), "bound") == (True, 1, 0)


@pytest.mark.clause("difftest-diagnoses")
def test_passes_refuses_a_group_rank_that_raised() -> None:
    def fn(c: Case, r: int) -> torch.Tensor:
        if r:
            raise ValueError(f"rank {r} gave up")
        return sums(c)

    assert passes(PerRank(fn).call(PAIR), "bound") == (False, 0, 0)


# --- count_contributions --------------------------------------------------------------------------------


def _worker0_twice(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Worker 0's contribution counted twice, for the sum (and avg), the product, max and min."""
    n = x.shape[0]
    if op == "prod":
        return x[0] * x[0] * x[1:].prod(0)
    if op == "avg":
        return (x[0] + x.sum(0)) / n
    if op in ("max", "min"):
        return ring_all_reduce(x, op=op)
    return x[0] + x.sum(0)


def _last_lost(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """The last worker's contribution lost (avg still divides by N)."""
    rest = x[:-1]
    if op == "prod":
        return rest.prod(0)
    if op == "max":
        return rest.max(0).values
    if op == "min":
        return rest.min(0).values
    return rest.sum(0) / x.shape[0] if op == "avg" else rest.sum(0)


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize("op", ["sum", "avg", "prod", "max", "min"])
def test_counts_read_from_the_ops_probes(op: Op) -> None:
    c = Case(3, 3, (2,), torch.float32, "contiguous", (0.0,) * 18, op)
    assert count_contributions(as_launcher(planted_impls.op_ring), c) == [[1.0] * 6] * 3
    doubled = 1.0 if op in ("max", "min") else 2.0  # max and min cannot show a double count
    assert count_contributions(as_launcher(_worker0_twice), c) == [[doubled] * 6, [1.0] * 6, [1.0] * 6]
    assert count_contributions(as_launcher(_last_lost), c) == [[1.0] * 6, [1.0] * 6, [0.0] * 6]


def _sum_plus_three(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) + 3


def _not_whole(x: torch.Tensor, op: str = "sum") -> torch.Tensor:
    return 3 * x.sum(0) if op != "prod" else x.prod(0) * 1.5 + (x.prod(0) > 1) * 1.0


def _no_counts(counts: list[list[float]] | None) -> bool:
    return counts is not None and all(math.isnan(v) for row in counts for v in row)


def _over_min(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) / x.sum(0).abs().min()


def _prod_minus_one(x: torch.Tensor, op: str = "prod") -> torch.Tensor:
    return x.prod(0) - 1


def _avg_times_five_quarters(x: torch.Tensor, op: str = "avg") -> torch.Tensor:
    return 1.25 * ring_all_reduce(x, op="avg")


@pytest.mark.clause("difftest-diagnoses")
def test_counts_are_measured_from_the_all_base_result_and_other_values_are_no_count() -> None:
    assert count_contributions(_sum_plus_three, PAIR) == [[1.0, 1.0], [1.0, 1.0]]
    # prod: base 1 gives 1.5, worker j's 2 gives 4 (not a power of two times 1.5): no count.
    assert _no_counts(count_contributions(as_launcher(_not_whole), replace(PAIR, op="prod")))
    # A result that is not finite is no count (0 / 0 on the all-zeros call, then x / 0).
    assert _no_counts(count_contributions(_over_min, PAIR))


def _nonpositive_prod(x: torch.Tensor, op: str = "prod") -> torch.Tensor:
    return -x.prod(0)


@pytest.mark.clause("difftest-diagnoses")
def test_prod_counts_need_positive_results() -> None:
    assert _no_counts(count_contributions(as_launcher(_nonpositive_prod), replace(PAIR, op="prod")))
    assert _no_counts(count_contributions(as_launcher(_prod_minus_one), replace(PAIR, op="prod")))


@pytest.mark.clause("difftest-diagnoses")
def test_avg_counts_round_to_whole_numbers_within_two_roundings() -> None:
    # 1/3 in float16 is 0.333251953125: times 3 is 0.99975..., a count of 1 within two roundings.
    c = Case(3, 3, (), torch.float16, "contiguous", (0.0,) * 9, "avg")
    assert count_contributions(as_launcher(planted_impls.op_ring), c) == [[1.0] * 3] * 3
    # 2/3 rounds to 0.6669921875, times 3 is 2.0009765625: a count of 2.
    assert count_contributions(as_launcher(_worker0_twice), c) == [[2.0] * 3, [1.0] * 3, [1.0] * 3]
    # (1 / 3) * 1.25 is no whole count: it stays as it is.
    off = count_contributions(as_launcher(_avg_times_five_quarters), c)
    assert off is not None
    assert all(v != round(v) and abs(v - 1.25) < 0.01 for row in off for v in row)


class Counting:
    """A target that raises on its ``fail_at``-th call (1-based) and counts its calls."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at, self.calls = fail_at, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("no")
        return x.sum(0)


@pytest.mark.clause("difftest-diagnoses")
def test_no_counts_when_a_probe_gives_no_result_and_no_more_probes_run() -> None:
    c = Case(3, 3, (), torch.float32, "contiguous", (0.0,) * 9)
    for fail_at in (1, 2, 3):
        target = Counting(fail_at)
        assert count_contributions(target, c) is None
        assert target.calls == fail_at
    whole = Counting(99)
    assert count_contributions(whole, c) == [[1.0] * 3] * 3
    assert whole.calls == 4  # the all-zeros call and one probe per worker


@pytest.mark.clause("difftest-diagnoses")
def test_a_per_rank_target_is_counted_on_the_rank_asked() -> None:
    def fn(c: Case, r: int) -> torch.Tensor:
        x = c.tensor()
        return x[0] + x.sum(0) if r == 1 else x.sum(0)

    assert count_contributions(PerRank(fn), PAIR, 0) == [[1.0, 1.0], [1.0, 1.0]]
    assert count_contributions(PerRank(fn), PAIR, 1) == [[2.0, 2.0], [1.0, 1.0]]
    assert count_contributions(PerRank(fn), PAIR) is None  # no stacked answer in a group


# --- double-counted and lost contributions --------------------------------------------------------------


@pytest.mark.clause("difftest-diagnoses")
def test_double_counted_names_the_counts_and_the_sum_they_give() -> None:
    for mode in MODES:
        codes, text = find(_worker0_twice, PAIR, mode)
        assert codes == ["double-counted"]
        assert text.startswith("First differing element (0,) (chunk 0): expected 4.0, actual 5.0; ")
        assert "(2 element(s) differ)" in text
        assert (
            "Contributions counted more than once (e.g. all-gather adding instead of copying): with only "
            "worker j holding ones (the rest zeros), element (0,) (chunk 0) is worker 0: 2, worker 1: 1, "
            "so worker(s) [0] counted more than once; summing the counterexample with these counts gives "
            "5.0 there"
        ) in text


@pytest.mark.clause("difftest-diagnoses")
def test_the_element_shown_is_the_counterexamples_when_it_shows_the_double_count() -> None:
    # Worker 0 holds 0 at element 0: that element is right, element 1 (chunk 1) is the first wrong one.
    c = case((0.0, 2.0, 3.0, 4.0))
    codes, text = find(_worker0_twice, c, "exact")
    assert codes == ["double-counted"]
    assert text.startswith(
        "First differing element (1,) (chunk 1): expected 6.0, actual 8.0; not bitwise equal to the ring "
        "order (fold-order). Contributions counted"
    )
    assert "element (1,) (chunk 1) is worker 0: 2, worker 1: 1" in text
    assert "gives 8.0 there" in text and "element(s) differ" not in text


def _element1_doubles_element0_adds_one(x: torch.Tensor) -> torch.Tensor:
    result = x.sum(0)
    result[0] += 1
    result[1] += x[1, 1]
    return result


@pytest.mark.clause("difftest-diagnoses")
def test_a_double_count_elsewhere_is_shown_where_it_is_without_the_counterexamples_sum() -> None:
    codes, text = find(_element1_doubles_element0_adds_one, PAIR, "bound")
    assert codes == ["double-counted"]
    assert text.startswith("First differing element (0,) (chunk 0): expected 4.0, actual 5.0")
    assert (
        "element (1,) (chunk 1) is worker 0: 1, worker 1: 2, so worker(s) [1] counted more than once" in text
    )
    assert text.endswith("so worker(s) [1] counted more than once")


def _thrice_and_lost(x: torch.Tensor) -> torch.Tensor:
    return 3 * x[0]


@pytest.mark.clause("difftest-diagnoses")
def test_double_counted_and_lost_together() -> None:
    codes, text = find(_thrice_and_lost, PAIR, "bound")
    assert codes == ["double-counted"]
    assert "is worker 0: 3, worker 1: 0, so worker(s) [0] counted more than once, worker(s) [1] lost" in text
    assert "gives 3.0 there" in text


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("op", "holding", "values"),
    [
        ("sum", "ones (the rest zeros)", (1.0, 2.0, 3.0, 4.0)),
        ("max", "ones (the rest zeros)", (1.0, 2.0, 3.0, 4.0)),
        ("min", "-1 (the rest zeros)", (3.0, 4.0, 1.0, 2.0)),
        ("prod", "2 (the rest ones)", (2.0, 4.0, 0.5, 8.0)),
        ("avg", "ones (the rest zeros)", (1.0, 2.0, 3.0, 4.0)),
    ],
)
def test_a_lost_worker_is_out_of_bound_with_the_ops_probe_named(
    op: Op, holding: str, values: tuple[float, ...]
) -> None:
    codes, text = find(planted_impls.drops_last_worker_op, case(values, op), "bound")
    assert codes == ["out-of-bound"]
    assert text.endswith(
        f"Contributions missing: with only worker j holding {holding}, element (0,) (chunk 0) is "
        "worker 0: 1, worker 1: 0, so worker(s) [1] lost"
    )


@pytest.mark.clause("difftest-diagnoses")
def test_prod_double_counting_is_multiplying_without_a_sum() -> None:
    codes, text = find(planted_impls.gather_multiplies, case((2.0, 4.0, 0.5, 8.0), "prod"), "order-free")
    assert codes == ["double-counted"]
    assert (
        "(e.g. all-gather multiplying instead of copying): with only worker j holding 2 (the rest ones)"
        in text
    )
    assert text.endswith("is worker 0: 2, worker 1: 1, so worker(s) [0] counted more than once")


def _minus_last(x: torch.Tensor) -> torch.Tensor:
    return x[0] - x[1]


@pytest.mark.clause("difftest-diagnoses")
def test_negative_or_fractional_counts_are_not_contribution_counts() -> None:
    for fn in (_minus_last, _sum_plus_three):
        codes, text = find(fn, PAIR, "bound")
        assert codes == ["out-of-bound"]
        assert text.endswith("Wrong values, not explained by a more specific code")


# --- mean-not-sum ---------------------------------------------------------------------------------------


@pytest.mark.clause("difftest-diagnoses")
def test_the_mean_is_named_with_n() -> None:
    c = Case(3, 3, (), torch.float32, "contiguous", (3.0, 6.0, 9.0, 3.0, 6.0, 9.0, 3.0, 6.0, 9.0))
    for mode in MODES:
        codes, text = find(planted_impls.mean_instead_of_sum, c, mode)
        assert codes == ["mean-not-sum"]
        assert text.startswith("First differing element (0,) (chunk 0): expected 9.0, actual 3.0")
        assert text.endswith("The result is the sum divided by N = 3 (the mean), not the sum")


def _mean_unless_one_hot(x: torch.Tensor) -> torch.Tensor:
    one_hot = bool(((x == 0) | (x == 1)).all())
    return x.sum(0) if one_hot else x.sum(0) / x.shape[0]


def _mean_and_no_probes(x: torch.Tensor) -> torch.Tensor:
    if bool(((x == 0) | (x == 1)).all()):
        raise RuntimeError("probes refused")
    return x.sum(0) / x.shape[0]


@pytest.mark.clause("difftest-diagnoses")
def test_mean_not_sum_needs_the_probes_to_give_the_mean_where_they_ran() -> None:
    # The one-hot probes count each worker once: the mean on this input alone is no mean-not-sum,
    # nor the average computed instead of the sum.
    codes, _ = find(_mean_unless_one_hot, PAIR, "bound")
    assert codes == ["out-of-bound"]
    codes, text = find(_mean_and_no_probes, PAIR, "bound")
    assert codes == ["mean-not-sum"] and "divided by N = 2" in text


@pytest.mark.clause("difftest-diagnoses")
def test_no_mean_for_one_worker_nor_for_a_result_that_is_no_mean() -> None:
    one = case((5.0, 7.0), n=1)
    codes, _ = find(lambda x: x[0] / 2, one, "bound")
    assert codes == ["out-of-bound"]
    codes, _ = find(lambda x: x.sum(0) / 3, PAIR, "bound")
    assert codes == ["out-of-bound"]
    # one element the mean, the other a third
    codes, _ = find(lambda x: x.sum(0) / torch.tensor([2.0, 3.0]), PAIR, "bound")
    assert codes == ["out-of-bound"]


# --- the op probes: sum-not-op, wrong-op -----------------------------------------------------------------


@pytest.mark.clause("difftest-diagnoses")
def test_op_probe_rows_and_values_are_each_ops_exact_value() -> None:
    assert op_probe_rows(4) == [2.0, 3.0, 2.0, 3.0]
    assert op_probe_rows(3, flipped=True) == [3.0, 2.0, 3.0]
    assert op_probe_values(3, torch.float32, flipped=True) == {
        "sum": 8.0,
        "prod": 18.0,
        "max": 3.0,
        "min": 2.0,
        "avg": float(torch.tensor(8 / 3, dtype=torch.float32)),
    }
    # float16: 2**6 * 3**6 = 46656 is below its largest 65504; 2**7 * 3**6 is not.
    assert op_probe_values(12, torch.float16)["prod"] == 46656.0
    assert "prod" not in op_probe_values(13, torch.float16)
    # bfloat16 holds 3**5 = 243 exactly (8 significand bits), not 3**6 = 729.
    assert op_probe_values(10, torch.bfloat16)["prod"] == 2.0**5 * 3.0**5
    assert "prod" not in op_probe_values(12, torch.bfloat16)
    assert op_probe_values(13, torch.float16)["avg"] == float(torch.tensor(32 / 13, dtype=torch.float16))


@pytest.mark.clause("difftest-diagnoses")
def test_summing_when_asked_for_another_op_is_sum_not_op() -> None:
    ops: list[tuple[Op, str]] = [("max", "where max gives 3.0"), ("avg", "where avg gives 2.5")]
    for op, where in ops:
        for mode in MODES:
            codes, text = find(planted_impls.sums_whatever_the_op, replace(PAIR, op=op), mode)
            assert codes == ["sum-not-op"]
            assert text.endswith(
                "On the op probes (worker j holds 2 + j % 2: 2, 3, 2, ..., and 3 - j % 2, where every op "
                f"gives another value) every element is the sum (5.0 on the first, {where}): the target "
                f"computed sum when asked for {op}"
            )


@pytest.mark.clause("difftest-diagnoses")
def test_another_op_is_wrong_op_named_with_both_ops() -> None:
    codes, text = find(planted_impls.other_extreme, replace(PAIR, op="min"), "bound")
    assert codes == ["wrong-op"]
    assert text.endswith(
        "every element is the maximum (3.0 on the first, where min gives 2.0): the target computed max "
        "when asked for min"
    )
    codes, text = find(lambda x: x.max(0).values, PAIR, "bound")
    assert codes == ["wrong-op"]
    assert text.endswith(
        "every element is the maximum (3.0 on the first, where sum gives 5.0): the target computed max "
        "when asked for sum"
    )
    codes, text = find(lambda x, op: ring_all_reduce(x, op="min"), replace(PAIR, op="prod"), "bound")
    assert codes == ["wrong-op"] and text.endswith("the target computed min when asked for prod")


@pytest.mark.clause("difftest-diagnoses")
def test_without_the_asked_ops_probe_value_the_explanation_names_only_the_other() -> None:
    c = Case(13, 13, (), torch.float16, "contiguous", (1.0,) * 169, "prod")
    codes, text = find(planted_impls.sums_whatever_the_op, c, "bound")
    assert codes == ["sum-not-op"]
    assert text.endswith(
        "every element is the sum (32.0 on the first): the target computed sum when asked for prod"
    )


@pytest.mark.clause("difftest-diagnoses")
def test_a_lost_worker_is_not_taken_for_min_or_max() -> None:
    # On 2, 3 losing worker 1 keeps 2 (the min), on 3, 2 it keeps 3 (the max): no single other op.
    codes, text = find(planted_impls.drops_last_worker_op, replace(PAIR, op="max"), "bound")
    assert codes == ["out-of-bound"] and "worker(s) [1] lost" in text


@pytest.mark.clause("difftest-diagnoses")
def test_another_ops_value_on_the_probes_only_is_not_that_op() -> None:
    # sum + 1 is 6, the product, on both probes for N = 2; on the counterexample it is no product.
    codes, _ = find(lambda x, op: ring_all_reduce(x) + 1, replace(PAIR, op="max"), "bound")
    assert codes == ["out-of-bound"]


@pytest.mark.clause("difftest-diagnoses")
def test_the_average_instead_of_the_sum_on_the_probes_only_is_no_op() -> None:
    # avg is not looked for when the sum was asked: a mean belongs to mean-not-sum.
    codes, _ = find(_mean_unless_one_hot, case((3.0, 5.0, 7.0, 9.0)), "bound")
    assert codes == ["out-of-bound"]


def _zero_as_plus(x: torch.Tensor, op: str) -> torch.Tensor:
    result = ring_all_reduce(x, op=op)
    return torch.where(result == 0, torch.zeros_like(result), result)


@pytest.mark.clause("difftest-diagnoses")
def test_one_worker_has_no_op_probe() -> None:
    # For N = 1 every op gives the worker's value: the op probes tell nothing, the zero's sign does.
    codes, _ = find(_zero_as_plus, case((-0.0, 1.0), "max", n=1), "exact")
    assert codes == ["signed-zero"]


# --- signed zeros ---------------------------------------------------------------------------------------


@pytest.mark.clause("difftest-diagnoses")
def test_position_probe_values() -> None:
    c = Case(2, 12, (), torch.float32, "contiguous", (0.0,) * 24, "prod")
    signs = (1.0,) * 5 + (-1.0,) * 5 + (1.0,) * 2  # negative where e // 5 is odd
    powers = (1.0, 2.0, 4.0, 8.0, 16.0) * 3
    assert position_probe(c).values == tuple(s * p for s, p in zip(signs, powers, strict=False)) + (1.0,) * 12
    c = Case(3, 3, (), torch.float16, "strided", (0.0,) * 9, "max")
    probe = position_probe(c)
    assert probe.values == (1.0, 4.0, 7.0, 2.0, 5.0, 8.0, 3.0, 6.0, 9.0)
    assert (probe.n, probe.m, probe.dtype, probe.layout, probe.op) == (3, 3, torch.float16, "strided", "max")
    big = Case(2, 100, (), torch.float32, "contiguous", (0.0,) * 200, "min")
    assert (position_probe(big).values[84], position_probe(big).values[100 + 84]) == (2.0, 3.0)
    assert max(position_probe(big).values) == 251.0 and min(position_probe(big).values) == 1.0


@pytest.mark.clause("difftest-diagnoses")
def test_a_product_zero_of_the_wrong_sign_is_signed_zero_in_every_mode() -> None:
    c = case((-0.0, 1.0, 1.0, 1.0), "prod")
    for mode in MODES:
        codes, text = find(planted_impls.unsigned_zero_product, c, mode)
        assert codes == ["signed-zero"]
        assert text.endswith(
            ". Every element has the right value, but a zero has the wrong sign: the sign of a product is "
            "the exclusive or of the signs in every order (IEEE 754), zeros included (a product computed "
            "from magnitudes, or a zero written as +0?)"
        )


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(("op", "word"), [("max", "maximum"), ("min", "minimum")])
def test_another_zero_where_minus_and_plus_zero_tie_is_signed_zero_under_exact(op: Op, word: str) -> None:
    c = case((0.0, 0.0, -0.0, -0.0), op)
    codes, text = find(planted_impls.keeps_the_last_zero, c, "exact")
    assert codes == ["signed-zero"]
    assert text.endswith(
        f". Every element has the ring's value, but the sign of a zero differs: where -0 and +0 tie for the "
        f"{word}, the ring keeps the first in its fold order (clause op-{op}), the target another (another "
        "fold order, or another tie rule such as numpy's second argument or IEEE 754-2019's -0 < +0): a "
        f"correct {op} by value; only --mode exact requires the ring's zeros"
    )


@pytest.mark.clause("difftest-diagnoses", "difftest-exact-orders")
@pytest.mark.parametrize(("op", "word"), [("max", "maximum"), ("min", "minimum")])
def test_the_zeros_of_a_tie_are_the_expected_orders(op: Op, word: str) -> None:
    # N = 2, workers 0.0, -0.0 and -0.0, 0.0: the ring (+1, +1) folds chunk 0 from worker 1, chunk 1 from
    # worker 0, so it keeps -0.0 twice where the spec's ring keeps 0.0 twice: the spec's ring is signed-zero
    # against it
    c = case((0.0, -0.0, -0.0, 0.0), op)
    codes, text = find(ring_all_reduce, c, "exact", schedule_order("1,1,even"))
    assert codes == ["signed-zero"], text
    assert text.startswith("First differing element (0,) (chunk 0): expected -0.0, actual 0.0")
    assert text.endswith(
        f"where -0 and +0 tie for the {word}, the ring keeps the first in its fold order (clause op-{op}), "
        "the target another (another fold order, or another tie rule such as numpy's second argument or "
        f"IEEE 754-2019's -0 < +0): a correct {op} by value; only --mode exact requires the ring's zeros"
    )


def _sums_from_plus_zero(x: torch.Tensor, op: str) -> torch.Tensor:
    return x.sum(0) + 0.0


@pytest.mark.clause("difftest-diagnoses")
def test_one_workers_op_probes_run_at_two_workers_and_say_so() -> None:
    # One worker holding -0.0: its max is -0.0; a sum from +0.0 gives +0.0, which the sum's bound accepts
    codes, text = find(_sums_from_plus_zero, case((-0.0,), "max", n=1), "bound")
    assert codes == ["sum-not-op"]
    assert text.endswith(
        ". On the op probes at N = 2, M = 2 (worker j holds 2 + j % 2: 2, 3, 2, ..., and 3 - j % 2, where "
        "every op gives another value) every element is the sum (5.0 on the first, where max gives 3.0): the "
        "target computed sum when asked for max"
    )


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(("op", "word", "mirror"), [("max", "maximum", "min"), ("min", "minimum", "max")])
def test_a_zero_no_worker_holds_is_signed_zero_in_every_mode(op: Op, word: str, mirror: str) -> None:
    c = case((-0.0, 1.0, -0.0, 1.0), op)  # both workers hold -0 at element 0
    for mode in MODES:
        codes, text = find(_zero_as_plus, c, mode)
        assert codes == ["signed-zero"]
        assert text.endswith(
            f". Every element has the {word}'s value, but a zero has a sign that no worker holding the "
            f"{word} there has, so no fold order gives it (an op computed as -{mirror}(-x), or a zero "
            "written as +0?)"
        )


@pytest.mark.clause("difftest-diagnoses")
def test_zeros_merely_moved_are_not_a_sign_problem() -> None:
    # Rotated zeros of both signs look like wrong signs; the position probe shows the result moved.
    c = case((-0.0, 0.0, -0.0, 0.0), "max")
    for mode in MODES:
        codes, _ = find(planted_impls.op_chunks_rotated, c, mode)
        assert codes == ["out-of-bound"], mode


def _plus_zero_avg(x: torch.Tensor, op: str) -> torch.Tensor:
    result = ring_all_reduce(x, op="avg")
    return torch.where(result == 0, torch.zeros_like(result), result)


@pytest.mark.clause("difftest-diagnoses")
def test_an_averages_plus_zero_of_minus_zeros_is_a_fold_from_plus_zero() -> None:
    # every worker holds -0.0 at element 0: the ring's average is -0.0, a fold from +0.0 gives +0.0
    codes, text = find(_plus_zero_avg, case((-0.0, 2.0, -0.0, 4.0), "avg"), "exact")
    assert codes == ["signed-zero"]
    assert text.endswith(f". {FOLD_FROM_PLUS_ZERO.format(op='avg')}")
    # a sum the same, its words the same
    codes, text = find(_zero_as_plus, case((-0.0, 2.0, -0.0, 4.0), "sum"), "exact")
    assert codes == ["signed-zero"]
    assert text.endswith(f". {FOLD_FROM_PLUS_ZERO.format(op='sum')}")


FOLD_FROM_PLUS_ZERO = (
    "Every element has the ring's value, but the sign of a zero differs: where every worker holds -0.0, "
    "every order of IEEE 754 additions, the ring's included, gives -0.0, and a fold that starts from the "
    "identity +0.0 (XLA's psum, torch.sum, numpy.sum) gives +0.0: a correct {op} by value, which order-free "
    "and bound accept; only --mode exact requires the ring's zeros"
)


@pytest.mark.clause("difftest-diagnoses")
def test_plus_zeros_only_is_plus_zero_where_the_order_has_minus_zero_and_nothing_else() -> None:
    c = case((1.0, -0.0, 3.0, 5.0, -1.0, -0.0, 4.0, 5.0))  # the ring: 0.0 (1 + -1), -0.0, 7.0, 10.0
    assert plus_zeros_only(c, torch.tensor([0.0, 0.0, 7.0, 10.0]))
    assert plus_zeros_only(c, torch.tensor([0.0, -0.0, 7.0, 10.0]))  # the ring's own result
    assert not plus_zeros_only(c, torch.tensor([-0.0, 0.0, 7.0, 10.0]))  # -0.0 where the ring has +0.0
    assert not plus_zeros_only(c, torch.tensor([-0.0, -0.0, 7.0, 10.0]))
    assert not plus_zeros_only(c, torch.tensor([0.0, 0.0, 8.0, 10.0]))  # a value wrong too
    # against another order: its zeros and values, not the ring's
    made_up = ExactOrder("a made-up order", lambda _: torch.tensor([-0.0, -0.0, 8.0, 10.0]))
    assert plus_zeros_only(c, torch.tensor([0.0, 0.0, 8.0, 10.0]), made_up)
    assert not plus_zeros_only(c, torch.tensor([0.0, 0.0, 7.0, 10.0]), made_up)


def _zero_as_plus_and_seven_thrice(x: torch.Tensor, op: str) -> torch.Tensor:
    result = _zero_as_plus(x, op)
    return torch.where(result == 7, 3 * result, result)


@pytest.mark.clause("difftest-diagnoses")
def test_signed_zero_needs_the_values_right_once_the_zeros_are_fixed() -> None:
    # Right on every probe (no 7 there); on this input a wrong zero and a wrong 7 (21).
    c = case((-0.0, 7.0, -0.0, 1.0), "max")
    for mode in MODES:
        codes, _ = find(_zero_as_plus_and_seven_thrice, c, mode)
        assert codes == ["out-of-bound"], mode


# --- avg divided first ----------------------------------------------------------------------------------

F16_THIRDS = Case(
    3, 3, (), torch.float16, "contiguous", (0.0, 0.0, 0.0, 0.0, 0.0, 313.0, 0.0, 0.0, 294.0), "avg"
)


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize("fn", [planted_impls.divides_first, planted_impls.premultiplies])
def test_the_ring_sum_of_quotients_bit_for_bit_is_avg_divided_first(fn: Callable[..., torch.Tensor]) -> None:
    for mode in ("exact", "order-free"):
        codes, text = find(fn, F16_THIRDS, mode)
        assert codes == ["avg-divided-first"]
        assert text.startswith("First differing element (2,) (chunk 2): expected 202.375, actual 202.25")
        assert text.endswith(
            "The result is bit for bit the ring's sum of the contributions each divided by N first "
            "(x_i / 3 rounded, then summed), not the ring's sum divided once (clause op-avg)"
        )


# float32, N = 3: 1384399 + -2293284 = -908885, times fl(1/3) rounds to -302961.6875, the exact average
# to -302961.65625, as do the quotients summed (typed in from the counterexample jax gave)
XLA_PMEAN = Case(
    3, 3, (), torch.float32, "contiguous", (0.0, 0.0, 0.0, 1384399.0, 0.0, 0.0, -2293284.0, 0.0, 0.0), "avg"
)


@pytest.mark.clause("difftest-diagnoses", "op-avg")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_sum_times_a_rounded_reciprocal_is_named_not_divided_first(dtype: torch.dtype) -> None:
    """XLA's pmean multiplies the sum by fl(1/N): named so in exact and order-free, on a counterexample
    where it also equals the ring's sum of quotients (the coincidence once read as avg-divided-first)."""
    case = XLA_PMEAN if dtype == torch.float32 else F16_THIRDS
    # the two-worker probe's contributions, and the values the words name, by numpy's own arithmetic
    pair = times_reciprocal(format_of(dtype), 3)
    assert pair is not None
    a, b, times = pair
    same: type[np.floating[Any]] = np.float16 if dtype == torch.float16 else np.float32
    reciprocal = same(1) / same(3)
    assert times == float(same(a + b) * reciprocal)
    once = float(same(a + b) / same(3))
    for mode in ("exact", "order-free"):
        codes, text = find(planted_impls.multiplies_after_the_sum, case, mode)
        assert codes == ["avg-times-reciprocal"], (mode, text)
        assert text.endswith(
            f". With only workers 0 and 1 holding {a} and {b} (one addition, the same in every order) the "
            f"target gives {times!r} everywhere: the sum multiplied by 1/N rounded ({float(reciprocal)!r}) "
            f"after the sum, as XLA's pmean does; an average divided once gives {once!r} (clause op-avg)"
        )
    for fn in (planted_impls.divides_first, planted_impls.premultiplies):
        assert find(fn, F16_THIRDS, "order-free")[0] == ["avg-divided-first"]


def _twice_the_average_of_no_zeros(x: torch.Tensor, op: str) -> torch.Tensor:
    if bool((x == 0).any()):
        raise ValueError("zeros refused")
    return 2 * ring_all_reduce(x, op="avg")


@pytest.mark.clause("difftest-diagnoses", "op-avg")
def test_an_average_that_refuses_the_two_worker_probe_is_not_named_by_it() -> None:
    c = Case(3, 3, (), torch.float32, "contiguous", (3.0, 6.0, 9.0) * 3, "avg")  # every worker holds 3, 6, 9
    for mode in MODES:
        codes, text = find(_twice_the_average_of_no_zeros, c, mode)
        assert codes == ["out-of-bound"], (mode, text)
        assert text.startswith("First differing element (0,) (chunk 0): expected 3.0, actual 6.0")


def _premultiplies_in_torch_order(x: torch.Tensor, op: str) -> torch.Tensor:
    return (x * torch.tensor(1.0 / x.shape[0], dtype=torch.float64).to(x.dtype)).sum(0)


def _divides_in_torch_order(x: torch.Tensor, op: str) -> torch.Tensor:
    return (x / x.shape[0]).sum(0)


@pytest.mark.clause("difftest-diagnoses")
def test_the_premultiplied_sum_in_the_rings_order_is_named_nccls() -> None:
    c = Case(3, 3, (), torch.float16, "contiguous", (0.0,) * 4 + (31.0,) + (0.0,) * 4, "avg")
    codes, text = find(planted_impls.premultiplies, c, "order-free")
    assert codes == ["avg-divided-first"]
    # 31 * 0.333251953125 rounds to 10.328125 in float16, 31 / 3 to 10.3359375.
    assert text.startswith("First differing element (1,) (chunk 1): expected 10.3359375, actual 10.328125")
    assert (
        "the ring's sum of the contributions each multiplied by 1/N rounded first (x_i * 0.333251953125 "
        "rounded, then summed, as NCCL's ncclAvg premultiplies)"
    ) in text


def _pair_and_words(text: str) -> tuple[int, int, float, list[float]]:
    found = re.search(
        r"With only workers 0 and 1 holding (\d+) and (\d+) \(one addition, the same in every order\) the "
        r"target gives ([0-9.e-]+) everywhere: the contributions each .*; an average divided once gives "
        r"([0-9.e -or]+) "
        r"\(clause op-avg\)",
        text,
    )
    assert found is not None, text
    once = [float(v) for v in found.group(4).split(" or ")]
    return int(found.group(1)), int(found.group(2)), float(found.group(3)), once


def f16(v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float16)


@pytest.mark.clause("difftest-diagnoses")
def test_dividing_first_in_another_order_is_told_by_the_two_worker_probe() -> None:
    c = Case(
        3,
        3,
        (),
        torch.float16,
        "contiguous",
        (242.0, 334.0, 195.0, 108.0, 49.0, 250.0, 15.0, 200.0, 222.0),
        "avg",
    )
    codes, text = find(_divides_in_torch_order, c, "exact")
    assert codes == ["avg-divided-first"]
    assert "the contributions each divided by N first (x_i / 3 rounded, then summed)" in text
    a, b, scaled, once = _pair_and_words(text)
    assert float(f16(a / 3) + f16(b / 3)) == scaled
    assert once == [float(f16((a + b) / 3))] and scaled not in once


@pytest.mark.clause("difftest-diagnoses")
def test_premultiplying_in_another_order_is_told_by_the_two_worker_probe() -> None:
    c = Case(
        3,
        3,
        (),
        torch.float16,
        "contiguous",
        (312.0, 391.0, 393.0, 2.0, 357.0, 229.0, 137.0, 370.0, 118.0),
        "avg",
    )
    codes, text = find(_premultiplies_in_torch_order, c, "exact")
    assert codes == ["avg-divided-first"]
    assert "each multiplied by 1/N rounded first (x_i * 0.333251953125 rounded, then summed" in text
    a, b, scaled, once = _pair_and_words(text)
    third = f16(1 / 3)
    assert float(f16(a) * third + f16(b) * third) == scaled
    assert float(f16((a + b) / 3)) in once and scaled not in once
    assert all(v in (float(f16((a + b) / 3)), float(f16(a + b) * third)) for v in once)


@pytest.mark.clause("difftest-diagnoses")
def test_dividing_first_keeps_negative_zeros_negative() -> None:
    # Element 0: every worker holds -0, so each quotient is -0 and so is their sum.
    c = Case(
        3, 3, (), torch.float16, "contiguous", (-0.0, 0.0, 0.0, -0.0, 0.0, 313.0, -0.0, 0.0, 294.0), "avg"
    )
    codes, text = find(planted_impls.divides_first, c, "exact")
    assert codes == ["avg-divided-first"] and "bit for bit" in text


@pytest.mark.clause("difftest-diagnoses")
def test_dividing_by_a_power_of_two_first_is_exact_and_passes() -> None:
    c = Case(4, 4, (), torch.float16, "contiguous", tuple(float(v) for v in range(1, 17)), "avg")
    assert diagnose(planted_impls.divides_first, call_target(planted_impls.divides_first, c), "exact") is None


@pytest.mark.clause("difftest-diagnoses")
def test_an_average_right_on_the_two_worker_probe_is_not_divided_first() -> None:
    # Wrong on this input, but not a sum of quotients, and right when only two workers hold values.
    def fn(x: torch.Tensor, op: str) -> torch.Tensor:
        right = ring_all_reduce(x, op="avg")
        return right + 1 if bool((x == 294).any()) else right

    codes, _ = find(fn, F16_THIRDS, "bound")
    assert codes == ["out-of-bound"]


# --- not-ring-order -------------------------------------------------------------------------------------

EPS = 2.0**-24
ORDERED = Case(3, 3, (), torch.float32, "contiguous", (1.0, 1.0, 1.0, EPS, EPS, EPS, EPS, EPS, EPS))


@pytest.mark.clause("difftest-diagnoses")
def test_a_correct_sum_in_another_order_is_not_ring_order_with_the_revealed_fold() -> None:
    codes, text = find(planted_impls.torch_sum, ORDERED, "exact")
    assert codes == ["not-ring-order"]
    assert text.startswith("First differing element (1,) (chunk 1): expected 1.0000001192092896, actual 1.0")
    assert (
        "A correct sum in a different summation order: every contribution is counted once, the result is "
        "within the forward-error bound of the exact sum and exact on order-free inputs, but not bitwise "
        "the ring's fold order (clause fold-order); only --mode exact requires that order; revealed on "
        "float32 inputs of that shape (ring-ref reveal), the target sums that element as fold 0,1,2"
    ) in text
    spec = ",".join(map(str, spec_slot("all-gather", 1, 0, 1, 3)))
    assert text.endswith(f", where the spec's ring folds {spec}")


@pytest.mark.clause("difftest-diagnoses")
def test_float64_cases_are_revealed_in_float64() -> None:
    e = 2.0**-53
    c = Case(3, 3, (), torch.float64, "contiguous", (1.0, 1.0, 1.0, e, e, e, e, e, e))
    codes, text = find(planted_impls.torch_sum, c, "exact")
    assert codes == ["not-ring-order"]
    assert "revealed on float64 inputs of that shape (ring-ref reveal)" in text


@pytest.mark.clause("difftest-diagnoses")
def test_another_ops_order_is_named_without_a_reveal() -> None:
    codes, text = find(lambda x, op: torch.sum(x, 0) / 3, replace(ORDERED, op="avg"), "exact")
    assert codes == ["not-ring-order"]
    assert "A correct avg in a different order: every contribution is counted once" in text
    assert "the exact average and exact on order-free inputs" in text
    assert text.endswith("(clause fold-order); only --mode exact requires that order")


def _torch_sum_refusing_probes(x: torch.Tensor) -> torch.Tensor:
    if bool(((x == 0) | (x == 1)).all()):
        raise RuntimeError("probes refused")
    return torch.sum(x, 0)


def _torch_sum_off_elsewhere(x: torch.Tensor) -> torch.Tensor:
    """torch's order where the input holds 2**-24, else 1 too much (counts of 1: a constant)."""
    return torch.sum(x, 0) + (0.0 if bool((x == EPS).any()) else 1.0)


def _torch_sum_raising_elsewhere(x: torch.Tensor) -> torch.Tensor:
    if not bool((x == EPS).any()) and not bool(((x == 0) | (x == 1)).all()):
        raise RuntimeError("not today")
    return torch.sum(x, 0)


@pytest.mark.clause("difftest-diagnoses")
def test_not_ring_order_needs_exact_mode_counts_of_one_and_order_free_inputs_right() -> None:
    for fn in (_torch_sum_refusing_probes, _torch_sum_off_elsewhere, _torch_sum_raising_elsewhere):
        codes, text = find(fn, ORDERED, "exact")
        assert codes == ["out-of-bound"], fn
        assert text.endswith("Wrong values, not explained by a more specific code")
    codes, _ = find(planted_impls.torch_sum, ORDERED, "order-free")
    assert codes == ["out-of-bound"]
    # counted once and right on order-free inputs, but out of the bound on this one
    codes, _ = find(lambda x: torch.sum(x, 0) + (x == EPS).any() * 1.0, ORDERED, "exact")
    assert codes == ["out-of-bound"]


# --- groups ---------------------------------------------------------------------------------------------


@pytest.mark.clause("difftest-diagnoses")
def test_ranks_that_differ_from_a_right_rank_disagree() -> None:
    right = sums(PAIR)

    def fn(c: Case, r: int) -> torch.Tensor:
        # rank 1: zeros on PAIR, and on the probes every worker counted once (no counting bug)
        return sums(c) if r == 0 else sums(c) - right

    finding = diagnose(PerRank(fn), PerRank(fn).call(PAIR), "bound")
    assert finding is not None and finding.codes == ["ranks-disagree"] and finding.ranks == [1]
    assert finding.explanation.startswith(
        "ranks-disagree: rank(s) [1] ended with different bits than rank 0, whose result passes: first "
        "differing element (0,) (chunk 0): rank 1 has 0.0 where rank 0 has 4.0; rank(s) [1] also fail the "
        "oracle (First differing element (0,) (chunk 0): expected 4.0, actual 0.0; "
    )
    assert finding.explanation.endswith(
        "(2 element(s) differ)); the ranks did not compute one all-reduce; the one-hot probes (only "
        "worker j holding ones (the rest zeros)) per failing rank: rank 1: every worker counted once in "
        "every element"
    )
    m = finding.mismatch
    assert m is not None and (m.index, m.chunk, m.expected, m.actual, m.count) == ((0,), 0, 4.0, 0.0, 2)
    assert m.detail == "rank 1 has 0.0 where rank 0 has 4.0"


@pytest.mark.clause("difftest-diagnoses")
def test_the_reference_rank_is_the_first_that_passes() -> None:
    def fn(c: Case, r: int) -> torch.Tensor:
        return sums(c) if r == 1 else sums(c) - torch.tensor([0.0, 6.0])

    finding = diagnose(PerRank(fn), PerRank(fn).call(PAIR), "exact")
    assert finding is not None and finding.codes == ["ranks-disagree"] and finding.ranks == [0]
    assert (
        "rank(s) [0] ended with different bits than rank 1, whose result passes: first differing element "
        "(1,) (chunk 1): rank 0 has 0.0 where rank 1 has 6.0" in finding.explanation
    )


@pytest.mark.clause("difftest-diagnoses")
def test_ranks_that_all_pass_but_differ_disagree_without_an_oracle_failure() -> None:
    ring, other = ring_all_reduce(ORDERED.tensor()), torch.sum(ORDERED.tensor(), 0)

    def fn(c: Case, r: int) -> torch.Tensor:
        return (other if r == 2 else ring).clone()

    finding = diagnose(PerRank(fn), PerRank(fn).call(ORDERED), "bound")
    assert finding is not None and finding.codes == ["ranks-disagree"] and finding.ranks == [2]
    assert finding.explanation == (
        "ranks-disagree: rank(s) [2] ended with different bits than rank 0, whose result passes: first "
        "differing element (1,) (chunk 1): rank 2 has 1.0 where rank 0 has 1.0000001192092896; the ranks "
        "did not compute one all-reduce"
    )


@pytest.mark.clause("difftest-diagnoses")
def test_a_rank_that_double_counts_is_double_counted_though_another_is_right_by_luck() -> None:
    # Worker 0 holds 0 at element 0, so rank 1 counting it twice is right there, wrong at element 1.
    def fn(c: Case, r: int) -> torch.Tensor:
        x = c.tensor()
        return x[0] + x.sum(0) if r == 1 else x.sum(0)

    c = case((0.0, 2.0, 3.0, 4.0))
    finding = diagnose(PerRank(fn), PerRank(fn).call(c), "exact")
    assert finding is not None and finding.codes == ["double-counted"] and finding.ranks == [1]
    assert finding.explanation.startswith(
        "double-counted: rank(s) [1] fail; rank(s) [0] happen to be right on this input; rank 1: First "
        "differing element (1,) (chunk 1): expected 6.0, actual 8.0"
    )
    assert "worker 0: 2, worker 1: 1" in finding.explanation
    assert finding.explanation.endswith(
        "(the ranks' results also differ: rank 1 has 8.0 where rank 0 has 6.0)"
    )


@pytest.mark.clause("difftest-diagnoses")
def test_every_rank_failing_alike_names_them_all() -> None:
    def fn(c: Case, r: int) -> torch.Tensor:
        return c.tensor().sum(0) / 2

    c = Case(3, 3, (), torch.float32, "contiguous", (3.0,) * 9)
    finding = diagnose(PerRank(fn), PerRank(fn).call(c), "bound")
    assert finding is not None and finding.codes == ["out-of-bound"] and finding.ranks == [0, 1, 2]
    assert finding.explanation.startswith("out-of-bound: rank(s) [0, 1, 2] fail; rank 0: First differing")
    assert "happen to be right" not in finding.explanation and "also differ" not in finding.explanation


@pytest.mark.clause("difftest-diagnoses")
def test_group_structural_findings_name_the_ranks_and_each_code_once() -> None:
    def fn(c: Case, r: int) -> torch.Tensor:
        raise ValueError("odd" if r % 2 else "even")

    c = Case(3, 3, (), torch.float32, "contiguous", (0.0,) * 9)
    outcome = PerRank(fn).call(c)
    at = _at(fn)
    assert structural(outcome) == [
        ("raised", f"rank(s) [0, 2]: raised ValueError: even (on a valid input){at}"),
        ("raised", f"rank(s) [1]: raised ValueError: odd (on a valid input){at}"),
    ]
    finding = diagnose(PerRank(fn), outcome, "bound")
    assert finding is not None and finding.codes == ["raised"] and finding.mismatch is None
    assert finding.explanation == (
        f"raised: rank(s) [0, 2]: raised ValueError: even (on a valid input){at}; "
        f"raised: rank(s) [1]: raised ValueError: odd (on a valid input){at}"
    )


@pytest.mark.clause("difftest-diagnoses")
def test_a_rank_working_in_place_is_not_aliasing() -> None:
    def fn(c: Case, r: int) -> None:
        return None  # the rank's own tensor is its result: here, its input

    c = case((2.0, 2.0, 2.0, 2.0))
    outcome = PerRank(fn).call(c)
    assert structural(outcome) == []
    finding = diagnose(PerRank(fn), outcome, "bound")
    assert finding is not None and finding.codes == ["out-of-bound"] and finding.ranks == [0, 1]
    assert "rank 0: " in finding.explanation and "so worker(s) [1] lost" in finding.explanation


# --- difference -----------------------------------------------------------------------------------------


def _const(*values: float) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: torch.tensor(values)


@pytest.mark.clause("difftest-diagnoses")
def test_difference_of_two_results() -> None:
    a, b = call_target(_const(1.5, 2.0), PAIR), call_target(_const(2.5, 2.0), PAIR)
    assert difference(a, a) == ""
    assert difference(a, b) == "result element (0,) was 1.5 the first time, 2.5 the second"
    c = call_target(_const(1.5, 3.0), PAIR)
    assert difference(a, c) == "result element (1,) was 2.0 the first time, 3.0 the second"
    other = call_target(_const(1.5, 2.0, 0.0), PAIR)
    assert difference(a, other) == (
        "result: (2,) torch.float32 on cpu the first time, (3,) torch.float32 on cpu the second"
    )
    f64 = call_target(lambda x: torch.tensor([1.5, 2.0], dtype=torch.float64), PAIR)
    assert (
        difference(a, f64)
        == "result: (2,) torch.float32 on cpu the first time, (2,) torch.float64 on cpu the second"
    )
    meta = call_target(lambda x: torch.tensor([1.5, 2.0]).to("meta"), PAIR)
    assert (
        difference(a, meta)
        == "result: (2,) torch.float32 on cpu the first time, (2,) torch.float32 on meta the second"
    )
    assert difference(meta, meta) == ""  # no bits to compare
    listed = call_target(_returns_a_list, PAIR)
    assert difference(a, listed) == "result: a tensor once, not the other time"
    assert difference(listed, a) == "result: a tensor once, not the other time"
    assert difference(listed, listed) == ""


@pytest.mark.clause("difftest-diagnoses")
def test_difference_of_the_input_after_the_call_and_of_exceptions() -> None:
    def bump(x: torch.Tensor) -> torch.Tensor:
        x[1, 1] += 1
        return torch.tensor([4.0, 6.0])

    right = call_target(lambda x: torch.tensor([4.0, 6.0]), PAIR)
    assert difference(right, call_target(bump, PAIR)) == (
        "the input after the call, element (1, 1) was 4.0 the first time, 5.0 the second"
    )
    raised = call_target(_raises_value_error, PAIR)
    assert difference(raised, right) == (
        "the first call raised ValueError: a ring needs at least two workers, the second returned"
    )
    assert difference(right, raised) == (
        "the first call returned, the second raised ValueError: a ring needs at least two workers"
    )
    assert difference(raised, raised) == ""


@pytest.mark.clause("difftest-diagnoses")
def test_difference_of_group_answers_names_the_rank() -> None:
    def good(c: Case, r: int) -> torch.Tensor:
        return torch.tensor([4.0, 6.0])

    def odd(c: Case, r: int) -> torch.Tensor:
        return torch.tensor([4.0, 6.0 + r])

    a, b = PerRank(good).call(PAIR), PerRank(odd).call(PAIR)
    assert difference(a, b) == "rank 1: result element (1,) was 6.0 the first time, 7.0 the second"
    assert difference(a, call_target(ring_all_reduce, PAIR)) == "2 answer(s) the first time, 1 the second"

    def raising(c: Case, r: int) -> torch.Tensor:
        if r == 0:
            raise ValueError("zero")
        return torch.tensor([4.0, 6.0])

    assert (
        difference(PerRank(raising).call(PAIR), a)
        == "rank 0: the first call raised ValueError: zero, the second returned"
    )
    assert difference(Outcome(PAIR, (Answer("Tensor"),)), Outcome(PAIR, (Answer("Tensor"),))) == ""


# --- more edges of the probes ---------------------------------------------------------------------------


def _inf_on_marks(x: torch.Tensor) -> torch.Tensor:
    return x.sum(0) + (torch.inf if bool((x == 1).any()) else 0.0)


def _prod_times_three_on_marks(x: torch.Tensor, op: str = "prod") -> torch.Tensor:
    return x.prod(0) * (3.0 if bool((x == 2).any()) else 1.0)


def _prod_zero_on_marks(x: torch.Tensor, op: str = "prod") -> torch.Tensor:
    return x.prod(0) * (0.0 if bool((x == 2).any()) else 1.0)


@pytest.mark.clause("difftest-diagnoses")
def test_a_non_finite_probe_a_whole_ratio_other_than_a_power_of_two_or_zero_is_no_count() -> None:
    assert _no_counts(count_contributions(_inf_on_marks, PAIR))  # base 0, the probes inf
    prod = replace(PAIR, op="prod")
    assert _no_counts(count_contributions(as_launcher(_prod_times_three_on_marks), prod))  # 6 = 2 * 3
    assert _no_counts(count_contributions(as_launcher(_prod_zero_on_marks), prod))


def _sums_refusing_op_probes(x: torch.Tensor, op: str) -> torch.Tensor:
    if bool(((x == 2) | (x == 3)).all()):
        raise RuntimeError("no 2s and 3s")
    return x.sum(0)


def _sum_with_a_hole_on_op_probes(x: torch.Tensor, op: str) -> torch.Tensor:
    result = x.sum(0)
    if bool(((x == 2) | (x == 3)).all()):
        result[1] = 0
    return result


@pytest.mark.clause("difftest-diagnoses")
def test_the_op_probes_must_answer_and_show_the_other_op_on_every_element() -> None:
    for fn in (_sums_refusing_op_probes, _sum_with_a_hole_on_op_probes):
        codes, text = find(fn, replace(PAIR, op="max"), "bound")
        assert codes == ["out-of-bound"], fn
        assert text.endswith("Wrong values, not explained by a more specific code")


@pytest.mark.clause("difftest-diagnoses")
def test_the_value_named_is_the_first_op_probes() -> None:
    c = Case(3, 3, (), torch.float32, "contiguous", tuple(float(v) for v in range(1, 10)), "max")
    codes, text = find(planted_impls.sums_whatever_the_op, c, "bound")
    assert codes == ["sum-not-op"]
    # 2 + 3 + 2 = 7 (the flipped probe, 3 + 2 + 3, sums to 8)
    assert text.endswith(
        "every element is the sum (7.0 on the first, where max gives 3.0): the target computed sum when "
        "asked for max"
    )
    codes, text = find(lambda x, op: x.prod(0), c, "bound")
    assert codes == ["wrong-op"]
    assert text.endswith(
        "every element is the product (12.0 on the first, where max gives 3.0): the target computed prod "
        "when asked for max"
    )


@pytest.mark.clause("difftest-diagnoses")
def test_dividing_by_two_first_shows_in_subnormals() -> None:
    # Half the smallest float32 subnormal rounds to 0 (ties to even): each quotient is 0, the average not.
    tiny = 2.0**-149
    c = case((tiny, 0.0, tiny, 0.0), "avg")
    codes, text = find(planted_impls.divides_first, c, "exact")
    assert codes == ["avg-divided-first"]
    assert text.startswith(f"First differing element (0,) (chunk 0): expected {tiny!r}, actual 0.0")
    assert "bit for bit the ring's sum of the contributions each divided by N first (x_i / 2 rounded" in text


F16_ORDERED = Case(3, 3, (), torch.float16, "contiguous", (1.0, 1.0, 1.0) + (2.0**-11,) * 6)


def _reverse_fold_refusing_large_values(x: torch.Tensor) -> torch.Tensor:
    if x.abs().max() > 1024:  # reveal's probes swamp with +-2^15 in float16 at N = 3
        raise RuntimeError("values up to 1024 only")
    return planted_orders.reverse_fold(x)


@pytest.mark.clause("difftest-diagnoses")
def test_not_ring_order_without_a_reveal_when_the_target_refuses_its_probes() -> None:
    codes, text = find(planted_orders.reverse_fold, F16_ORDERED, "exact")
    assert codes == ["not-ring-order"]  # revealed in the case's own dtype
    # ((x2 + x1) + x0): its first two operands commute, so reveal writes it fold 1,2,0
    revealed = "revealed on float16 inputs of that shape (ring-ref reveal), the target sums that element as"
    assert f"{revealed} fold 1,2,0" in text
    # torch.sum adds float16 in a wider accumulator: in float16 no tree explains it (in float32 one would)
    codes, text = find(planted_impls.torch_sum, F16_ORDERED, "exact")
    assert codes == ["not-ring-order"] and "A correct sum that rounds once" in text
    codes, text = find(_reverse_fold_refusing_large_values, F16_ORDERED, "exact")
    assert codes == ["not-ring-order"]
    assert text.endswith("(clause fold-order); only --mode exact requires that order")


ROUNDS_ONCE_WORDS = (
    "A correct sum that rounds once: every contribution is counted once and every element is the exact "
    "sum correctly rounded, but no tree of additions in the dtype gives the target's answers on reveal's "
    "swamping probes: the target accumulates in higher precision or otherwise does not round after every "
    "addition (a wider accumulator, a fused or compensated sum), so it has no summation order at all, the "
    "ring's included (clause fold-order); only --mode exact requires the ring's order"
)
# N = 4 float16 workers: worker 0 holds 1, the others 2^-11: recursive doubling's (1 + 2^-11) +
# (2^-11 + 2^-11) is 1 + 2^-10 (the first sum a tie, to even: 1), the sum 1 + 3 * 2^-11 rounded once a tie
# to 1 + 2^-9.
F16_PAIRWISE = Case(4, 4, (), torch.float16, "contiguous", (1.0,) * 4 + (2.0**-11,) * 12)


@pytest.mark.clause("difftest-diagnoses", "difftest-exact-orders")
@pytest.mark.parametrize(
    ("order", "c", "shown", "tree"),
    [
        # chunk c of the ring (+1, +1) folds c + 1, c + 2, ..., c: element 1 folds 2, 0, 1 (1 + 2^-11 is 1)
        (
            schedule_order("1,1,even"),
            F16_ORDERED,
            "(1,) (chunk 1): expected 1.0, actual 1.0009765625",
            "the order of the ring with direction +1, offset 1, layout even folds 2,0,1",
        ),
        (
            schedule_order("recursive-doubling"),
            F16_PAIRWISE,
            "(0,) (chunk 0): expected 1.0009765625, actual 1.001953125",
            "the recursive-doubling schedule's order sums it as ((0+1)+(2+3))",
        ),
        # no trees to name: the words end with the order's
        (
            ExactOrder("the ring's values", lambda c: ring_all_reduce(c.tensor())),
            F16_ORDERED,
            "(0,) (chunk 0): expected 1.0, actual 1.0009765625",
            "",
        ),
    ],
    ids=["ring-by-value", "recursive-doubling", "no-trees"],
)
def test_a_sum_that_rounds_once_is_named_with_the_expected_orders_tree(
    order: ExactOrder, c: Case, shown: str, tree: str
) -> None:
    codes, text = find(planted_impls.torch_sum, c, "exact", order)
    assert codes == ["not-ring-order"]
    assert text.startswith(f"First differing element {shown}; not bitwise equal to {order.name}")
    assert text.endswith(f". {ROUNDS_ONCE_WORDS}" + (f" ({tree} at that element)" if tree else ""))


@pytest.mark.clause("difftest-diagnoses")
def test_the_spec_fold_is_named_only_when_exact_is_the_specs_ring() -> None:
    torch_order = ExactOrder("torch.sum's order", lambda c: torch.sum(c.tensor(), 0))
    codes, text = find(ring_all_reduce, ORDERED, "exact", torch_order)
    assert codes == ["not-ring-order"]
    assert re.search(r"the target sums that element as fold 1,2,0 \(revealed in \d+ calls\)$", text), text


@pytest.mark.clause("difftest-diagnoses")
def test_under_and_overflow_counts_are_the_most_any_rank_accepted() -> None:
    # Every element: 2**-100 twice and 2**100 twice.  Their product is 1, but two of them multiply to
    # 2**-200 (some order underflows) and two to 2**200 (some order overflows): inf is accepted there as an
    # overflow, and any positive finite value as an underflow.
    low, high = 2.0**-100, 2.0**100
    c = Case(4, 4, (), torch.float32, "contiguous", (low,) * 8 + (high,) * 8, "prod")
    inf, one = torch.full((4,), torch.inf), torch.ones(4)
    assert passes(each_rank(inf, inf, inf, inf).call(c), "bound") == (True, 4, 0)
    assert passes(each_rank(one, one, one, one).call(c), "bound") == (True, 0, 4)
    assert passes(each_rank(inf, one, one, one).call(c), "bound") == (False, 4, 4)
    assert passes(each_rank(one, one, one, inf).call(c), "bound") == (False, 4, 4)


def _group_of(bug: Callable[..., torch.Tensor]) -> PerRank:
    """Rank 1 runs ``bug`` on the whole stacked input, every other rank the correct ring."""

    def fn(c: Case, r: int) -> torch.Tensor:
        x = c.tensor()
        if c.op is None:
            return bug(x) if r == 1 else ring_all_reduce(x)
        return bug(x, c.op) if r == 1 else planted_impls.op_ring(x, c.op)

    return PerRank(fn)


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("bug", "c", "code"),
    [
        (planted_impls.mean_instead_of_sum, PAIR, "mean-not-sum"),
        (planted_impls.sums_whatever_the_op, replace(PAIR, op="max"), "sum-not-op"),
        (planted_impls.other_extreme, replace(PAIR, op="min"), "wrong-op"),
        (planted_impls.divides_first, F16_THIRDS, "avg-divided-first"),
    ],
    ids=["mean", "sum", "other-op", "avg"],
)
def test_a_rank_whose_probes_show_a_counting_bug_is_named_for_it_not_for_disagreeing(
    bug: Callable[..., torch.Tensor], c: Case, code: str
) -> None:
    group = _group_of(bug)
    finding = diagnose(group, group.call(c), "exact")
    assert finding is not None and finding.codes == [code] and finding.ranks == [1]
    right = "[0, 2]" if c.n == 3 else "[0]"
    assert (
        f"rank(s) [1] fail; rank(s) {right} happen to be right on this input; rank 1: " in finding.explanation
    )


@pytest.mark.clause("difftest-diagnoses")
def test_a_rank_out_of_bound_while_another_is_right_disagrees() -> None:
    group = _group_of(planted_impls.chunks_rotated)
    finding = diagnose(group, group.call(PAIR), "exact")
    assert finding is not None and finding.codes == ["ranks-disagree"] and finding.ranks == [1]


def _keeps_own_chunk(x: torch.Tensor, r: int) -> torch.Tensor:
    """Rank ``r`` of a ring whose all-gather never stores: the sum, but chunk ``r`` (one row per worker
    here) keeps rank ``r``'s own row, every other worker lost there."""
    out = x.sum(0)
    out[r] = x[r, r]
    return out


@pytest.mark.clause("difftest-diagnoses")
def test_ranks_losing_workers_get_their_stacked_twins_code_and_counts_though_one_is_right_by_luck() -> None:
    # Issue 29, item 6: rank 0 is right here only because worker 1 holds 0 in chunk 0; its own probes
    # show worker 1 lost, so the ranks do not merely disagree: both lose a worker, as the stacked form.
    c = case((1.0, 2.0, 0.0, 4.0))
    group = PerRank(lambda c, r: _keeps_own_chunk(c.tensor(), r))

    def twin(x: torch.Tensor) -> torch.Tensor:
        return _keeps_own_chunk(x, 1)

    stacked = diagnose(twin, call_target(twin, c), "bound")
    finding = diagnose(group, group.call(c), "bound")
    assert stacked is not None and finding is not None
    assert finding.codes == stacked.codes == ["out-of-bound"] and finding.ranks == [1]
    words = stacked.explanation.split(". ", 1)[1]
    assert words == (
        "Contributions missing: with only worker j holding ones (the rest zeros), element (1,) (chunk 1) is "
        "worker 0: 0, worker 1: 1, so worker(s) [0] lost"
    )
    assert finding.explanation.startswith("out-of-bound: rank(s) [1] fail; rank(s) [0] happen to be right")
    assert words in finding.explanation


@pytest.mark.clause("difftest-diagnoses")
def test_a_rank_losing_a_worker_while_the_others_count_each_once_disagrees_with_its_counts() -> None:
    c = replace(ORDERED, values=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0))
    group = _group_of(planted_impls.drops_last_worker)
    finding = diagnose(group, group.call(c), "bound")
    assert finding is not None and finding.codes == ["ranks-disagree"] and finding.ranks == [1]
    assert finding.explanation.endswith(
        "per failing rank: rank 1: element (0,) (chunk 0) is worker 0: 1, worker 1: 1, worker 2: 0 "
        "(worker(s) [2] lost)"
    ), finding.explanation


@pytest.mark.clause("difftest-diagnoses")
def test_every_failing_rank_has_its_counts_whatever_the_code() -> None:
    def fn(c: Case, r: int) -> torch.Tensor:
        x = c.tensor()
        return {0: x.sum(0), 1: x.sum(0) + x[0], 2: x[:-1].sum(0)}[r]

    c = replace(ORDERED, values=(1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0))
    finding = diagnose(PerRank(fn), PerRank(fn).call(c), "bound")
    assert finding is not None and finding.codes == ["double-counted"] and finding.ranks == [1, 2]
    assert finding.explanation.endswith(
        "per failing rank: rank 2: element (0,) (chunk 0) is worker 0: 1, worker 1: 1, worker 2: 0 "
        "(worker(s) [2] lost)"
    ), finding.explanation
    swapped = PerRank(lambda c, r: fn(c, {1: 2, 2: 1}.get(r, r)))
    both = diagnose(swapped, swapped.call(c), "bound")
    assert both is not None and both.codes == ["ranks-disagree"] and both.ranks == [1, 2]
    assert both.explanation.endswith(
        "per failing rank: rank 1: element (0,) (chunk 0) is worker 0: 1, worker 1: 1, worker 2: 0 "
        "(worker(s) [2] lost); rank 2: element (0,) (chunk 0) is worker 0: 2, worker 1: 1, worker 2: 1 "
        "(worker(s) [0] counted more than once)"
    ), both.explanation
    rotated = _group_of(planted_impls.chunks_rotated)
    disagree = diagnose(rotated, rotated.call(PAIR), "exact")
    assert disagree is not None and disagree.codes == ["ranks-disagree"]
    assert disagree.explanation.endswith(
        "per failing rank: rank 1: every worker counted once in every element"
    )
    scaled = PerRank(lambda c, r: c.tensor().sum(0) * (1.5 if r == 1 else 1.0))
    odd = diagnose(scaled, scaled.call(PAIR), "bound")
    assert odd is not None and odd.explanation.endswith(
        "rank 1: counts that are not whole numbers (a scaling or a rounding, not a counting bug)"
    )

    def zeros_then_raises(c: Case, r: int) -> torch.Tensor:
        if r == 1 and c.values != PAIR.values:
            raise ValueError("not on the probes")
        return c.tensor().sum(0) * (0.0 if r == 1 else 1.0)

    flaky = PerRank(zeros_then_raises)
    unanswered = diagnose(flaky, flaky.call(PAIR), "bound")
    assert unanswered is not None and unanswered.codes == ["ranks-disagree"]
    assert unanswered.explanation.endswith("per failing rank: rank 1: no well-formed result on some probe")


@pytest.mark.clause("difftest-diagnoses", "difftest-exact-orders")
def test_each_failing_rank_s_counts_label_the_chunk_by_the_expected_orders_layout() -> None:
    # N = 3, M = 4 under openmpi-ring's blocks layout: chunks of 2, 1, 1 elements, element 3 in chunk 2.
    # Workers hold 0 but at element 3 (5, 6, 7): every rank below is wrong only there.
    c = Case(
        3, 4, (), torch.float32, "contiguous", (0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 6.0, 0.0, 0.0, 0.0, 7.0)
    )
    blocks = schedule_order("openmpi-ring")
    twice_and_lost = (
        "worker 0: 1, worker 1: 2, worker 2: 0 (worker(s) [1] counted more than once, worker(s) [2] lost)"
    )

    def counting(c: Case, r: int) -> torch.Tensor:
        x = c.tensor()
        return {0: x.sum(0), 1: x.sum(0) + x[0], 2: x.sum(0) + x[1] - x[2]}[r]

    finding = diagnose(PerRank(counting), PerRank(counting).call(c), "bound", blocks)
    assert finding is not None and finding.codes == ["double-counted"] and finding.ranks == [1, 2]
    assert "element (3,) (chunk 2) is worker 0: 2, worker 1: 1, worker 2: 1" in finding.explanation
    assert finding.explanation.endswith(
        "; the one-hot probes (only worker j holding ones (the rest zeros)) per failing rank: rank 2: "
        f"element (3,) (chunk 2) is {twice_and_lost}"
    ), finding.explanation

    def disagreeing(c: Case, r: int) -> torch.Tensor:
        x = c.tensor()
        return {0: x.sum(0), 1: x.sum(0) - x[2], 2: x.sum(0) + x[1] - x[2]}[r]

    finding = diagnose(PerRank(disagreeing), PerRank(disagreeing).call(c), "bound", blocks)
    assert finding is not None and finding.codes == ["ranks-disagree"] and finding.ranks == [1, 2]
    assert finding.explanation.endswith(
        "per failing rank: rank 1: element (3,) (chunk 2) is worker 0: 1, worker 1: 1, worker 2: 0 "
        f"(worker(s) [2] lost); rank 2: element (3,) (chunk 2) is {twice_and_lost}"
    ), finding.explanation


def _avg_off_on_marks(steps: int) -> Callable[..., torch.Tensor]:
    """The average, plus ``steps`` float16 ulps of 1/4 (2**-12) wherever a worker holds 1."""

    def fn(x: torch.Tensor, op: str = "avg") -> torch.Tensor:
        right = ring_all_reduce(x, op="avg")
        return right + (steps * 2.0**-12 if bool((x == 1).any()) else 0.0)

    return fn


@pytest.mark.clause("difftest-diagnoses")
def test_an_avg_count_is_whole_within_two_roundings_and_not_beyond() -> None:
    # N = 4: the probe's 1/4 is exact; one ulp more is a count of 1 + 2u (u = 2**-11), two ulps 1 + 4u.
    c = Case(4, 4, (), torch.float16, "contiguous", (0.0,) * 16, "avg")
    assert count_contributions(as_launcher(_avg_off_on_marks(1)), c) == [[1.0] * 4] * 4
    assert count_contributions(as_launcher(_avg_off_on_marks(2)), c) == [[1.0 + 2.0**-9] * 4] * 4


# --- what the full mutation run found unchecked -----------------------------------------------------------


@pytest.mark.clause("difftest-diagnoses")
def test_passes_applies_the_modes_own_oracle() -> None:
    outcome = call_target(planted_impls.torch_sum, ORDERED)  # within the bound, not the ring's bits
    assert passes(outcome, "exact") == (False, 0, 0)
    assert passes(outcome, "order-free") == (False, 0, 0)  # 1 + 2 * 2**-24 is exact: torch rounds it off
    assert passes(outcome, "bound") == (True, 0, 0)


def _refusing_probes(offset: list[float]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A target that raises on the one-hot probes (so no counts), else gives the mean plus ``offset``."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        if bool(((x == 0) | (x == 1)).all()):
            raise RuntimeError("probes refused")
        return x.sum(0) / x.shape[0] + torch.tensor(offset)

    return fn


@pytest.mark.clause("difftest-diagnoses")
def test_the_mean_is_recognised_within_two_of_its_roundings() -> None:
    # The allowance is twice the mean's forward-error bound, 2 gamma_N sum|x_i| / N: for PAIR's element 0
    # (mean 2, sum|x_i| = 4, N = 2) that is just over 8 u = 2 ulps of 2 (u = 2**-24).
    ulp = 2.0**-22
    for k, code in [(0, "mean-not-sum"), (2, "mean-not-sum"), (3, "out-of-bound")]:
        fn = _refusing_probes([k * ulp, 0.0])
        codes, _ = find(fn, PAIR, "bound")
        assert codes == [code], k
    # Where the sum is 0 and so is sum|x_i|, only the smallest subnormal is allowed.
    zero_column = case((1.0, 0.0, 3.0, 0.0))
    for y, code in [(2.0**-149, "mean-not-sum"), (2.0**-120, "out-of-bound")]:
        fn = _refusing_probes([0.0, y])
        codes, _ = find(fn, zero_column, "bound")
        assert codes == [code], y


@pytest.mark.clause("difftest-diagnoses")
def test_no_mean_where_every_sum_is_zero_or_for_one_worker() -> None:
    # Sums of 0 from 1 - 1: 1.5 * 2**-23 is out of the sum's bound (gamma_1 * 2) but within the mean's
    # allowance; with every sum 0 there is no mean to speak of.
    cancelling = case((1.0, 0.0, -1.0, 0.0))
    fn = _refusing_probes([1.5 * 2.0**-23, 0.0])
    codes, _ = find(fn, cancelling, "bound")
    assert codes == ["out-of-bound"]
    # One worker: its sum is its value, and a result one ulp off is no mean.
    one = case((1.0, 2.0), n=1)
    codes, _ = find(lambda x: x[0] + torch.tensor([2.0**-23, 0.0]), one, "bound")
    assert codes == ["out-of-bound"]


@pytest.mark.clause("difftest-diagnoses")
def test_a_mean_within_the_sums_bound_is_no_mean_not_sum() -> None:
    # 1 + (-1 + 2**-23) = 2**-23; the mean 2**-24 is within gamma_1 * 2 of it, only exact tells them apart.
    c = case((1.0, 1.0, -1.0 + 2.0**-23, -1.0 + 2.0**-23))
    codes, _ = find(planted_impls.mean_instead_of_sum, c, "exact")
    assert codes == ["out-of-bound"]


def _avg_on_marks(value: float) -> Callable[..., torch.Tensor]:
    """An ``avg`` target giving ``value`` wherever a worker holds 1, else 0."""

    def fn(x: torch.Tensor, op: str = "avg") -> torch.Tensor:
        return torch.full(x.shape[1:], value if bool((x == 1).any()) else 0.0, dtype=x.dtype)

    return fn


@pytest.mark.clause("difftest-diagnoses")
def test_avg_counts_are_whole_within_two_roundings_of_the_count() -> None:
    c = Case(3, 3, (), torch.float16, "contiguous", (0.0,) * 9, "avg")
    u = 2.0**-11
    # float16 near 1/3 is spaced 2**-12: 0.33349609375 * 3 = 1 + u, 0.333740234375 * 3 = 1 + 2.5 u;
    # near 2/3 it is spaced 2**-11: 0.6669921875 * 3 = 2 + 2 u, within two roundings of 2.
    for value, count in [(0.33349609375, 1.0), (0.333740234375, 1.0 + 2.5 * u), (0.6669921875, 2.0)]:
        assert count_contributions(as_launcher(_avg_on_marks(value)), c) == [[count] * 3] * 3, value


def _plus_two(x: torch.Tensor, op: str) -> torch.Tensor:
    return ring_all_reduce(x, op=op) + 2 if op != "prod" else 2 * ring_all_reduce(x, op=op)


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize("op", ["avg", "prod"])
def test_counts_are_measured_from_the_all_base_result_for_every_op(op: Op) -> None:
    # avg + 2: measured from 2 (2.25 on a probe, N = 4: exact); 2 * prod: a ratio to 2.
    c = Case(4, 4, (), torch.float32, "contiguous", (0.0,) * 16, op)
    assert count_contributions(as_launcher(_plus_two), c) == [[1.0] * 4] * 4


@pytest.mark.clause("difftest-diagnoses")
def test_a_product_asked_for_a_sum_loses_every_worker_on_the_probes() -> None:
    codes, text = find(lambda x: x.prod(0), PAIR, "bound")
    assert codes == ["out-of-bound"]
    assert text.endswith("is worker 0: 0, worker 1: 0, so worker(s) [0, 1] lost")


@pytest.mark.clause("difftest-diagnoses")
def test_the_order_free_probe_is_the_same_each_time() -> None:
    seen: list[tuple[float, ...]] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(x.reshape(-1).tolist()))
        return torch.sum(x, 0)

    first = diagnose(fn, call_target(fn, ORDERED), "exact")
    calls = len(seen)
    second = diagnose(fn, call_target(fn, ORDERED), "exact")
    assert first is not None and second is not None and first.codes == ["not-ring-order"]
    assert seen[:calls] == seen[calls:] and first.explanation == second.explanation


PROD_ORDERED = Case(3, 3, (), torch.float32, "contiguous", (1.1,) * 3 + (0.7,) * 3 + (1.25,) * 3, "prod")


@pytest.mark.clause("difftest-diagnoses")
def test_a_correct_product_in_another_order_is_not_ring_order() -> None:
    codes, text = find(planted_impls.prod_in_torch_order, PROD_ORDERED, "exact")
    assert codes == ["not-ring-order"]
    assert "A correct prod in a different order: every contribution is counted once" in text
    assert "the exact product and exact on order-free inputs" in text


def _torch_prod_plus_zeros(x: torch.Tensor, op: str) -> torch.Tensor:
    result = torch.prod(x, 0)
    return torch.where(result == 0, 0.0, result)


@pytest.mark.clause("difftest-diagnoses")
def test_a_product_in_another_order_with_a_wrong_zero_is_no_signed_zero_under_exact() -> None:
    # Element 0's product is -0 (written +0), element 1's rounds differently in torch's order.
    c = Case(3, 3, (), torch.float32, "contiguous", (-0.0, 1.1, 1.1, 1.0, 0.7, 0.7, 1.0, 1.25, 1.25), "prod")
    codes, _ = find(_torch_prod_plus_zeros, c, "exact")
    assert codes == ["out-of-bound"]


def _nudged_off_the_counterexample(x: torch.Tensor) -> torch.Tensor:
    """torch's order; on inputs without 2**-24 and not one-hot, one ulp up where the sum is not 0."""
    s = torch.sum(x, 0)
    if bool((x == EPS).any()) or bool(((x == 0) | (x == 1)).all()):
        return s
    return torch.where(s != 0, torch.nextafter(s, torch.tensor(torch.inf)), s)


@pytest.mark.clause("difftest-diagnoses")
def test_not_ring_order_needs_the_order_free_probe_exact_not_only_within_the_bound() -> None:
    codes, _ = find(_nudged_off_the_counterexample, ORDERED, "exact")
    assert codes == ["out-of-bound"]


def _shrunk_without_zeros(x: torch.Tensor, op: str) -> torch.Tensor:
    """A product with zeros written +0; on inputs without zeros one ulp toward 0 (within the bound)."""
    result = torch.prod(x, 0)
    if bool((x == 0).any()):
        return torch.where(result == 0, 0.0, result)
    return torch.nextafter(result, torch.tensor(0.0))


@pytest.mark.clause("difftest-diagnoses")
def test_signed_zero_needs_the_position_probe_right_under_the_modes_oracle() -> None:
    c = case((-0.0, 2.0, 1.0, 4.0), "prod")
    codes, _ = find(_shrunk_without_zeros, c, "order-free")
    assert codes == ["out-of-bound"]


@pytest.mark.clause("difftest-diagnoses")
def test_one_worker_averaging_wrongly_is_not_divided_first() -> None:
    codes, _ = find(lambda x, op: x[0] + 1, case((1.0, 2.0), "avg", n=1), "bound")
    assert codes == ["out-of-bound"]


@pytest.mark.clause("difftest-diagnoses")
def test_the_premultiplied_probe_runs_where_no_divided_pair_exists() -> None:
    # float32, N = 63: dividing two small whole numbers by 63 first never differs from dividing once,
    # multiplying them by fl(1/63) does.
    c = Case(63, 63, (), torch.float32, "contiguous", (1.0,) * (63 * 63), "avg")
    words = _divided_first(as_launcher(_premultiplies_in_torch_order), c, torch.zeros(63), None)
    assert words.startswith("With only workers 0 and 1 holding ")
    assert "each multiplied by 1/N rounded first" in words


@pytest.mark.clause("difftest-diagnoses")
def test_both_averages_divided_once_are_named() -> None:
    # bfloat16, N = 13: (1 + 5) / 13 and (1 + 5) * fl(1/13) round to two values, neither what
    # 1 * fl(1/13) + 5 * fl(1/13) rounds to.
    c = Case(13, 13, (), torch.bfloat16, "contiguous", (1.0,) * 169, "avg")
    words = _divided_first(as_launcher(_premultiplies_in_torch_order), c, torch.zeros(13), None)
    a, b, scaled, once = _pair_and_words(words)
    bf = torch.bfloat16
    third = torch.tensor(1 / 13, dtype=bf)
    assert (a, b) == (1, 5)
    assert scaled == float(
        torch.tensor(float(a * third), dtype=bf) + torch.tensor(float(b * third), dtype=bf)
    )
    assert sorted(once) == sorted(
        {float(torch.tensor(6 / 13, dtype=bf)), float(torch.tensor(6, dtype=bf) * third)}
    )
    assert len(once) == 2 and " or " in words


def _torch_order_when_strided(x: torch.Tensor) -> torch.Tensor:
    return torch.sum(x, 0) if not x.is_contiguous() else ring_all_reduce(x)


@pytest.mark.clause("difftest-diagnoses")
def test_the_order_is_revealed_on_contiguous_inputs() -> None:
    c = replace(ORDERED, layout="transposed")
    codes, text = find(_torch_order_when_strided, c, "exact")
    assert codes == ["not-ring-order"]
    assert "the target sums that element as fold 1,2,0" in text


def _bug_on_every_rank(bug: Callable[..., torch.Tensor]) -> PerRank:
    """Every rank runs ``bug`` on the stacked input (with ``op`` when the case has one)."""

    def fn(c: Case, r: int) -> torch.Tensor:
        x = c.tensor()
        return bug(x) if c.op is None else bug(x, c.op)

    return PerRank(fn)


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("bug", "c", "code", "words"),
    [
        (lambda x: x.max(0).values, PAIR, "wrong-op", "the target computed max when asked for sum"),
        (planted_impls.unsigned_zero_product, case((-0.0, 1.0, 1.0, 1.0), "prod"), "signed-zero", "IEEE 754"),
        (
            _divides_in_torch_order,
            Case(
                3,
                3,
                (),
                torch.float16,
                "contiguous",
                (242.0, 334.0, 195.0, 108.0, 49.0, 250.0, 15.0, 200.0, 222.0),
                "avg",
            ),
            "avg-divided-first",
            "With only workers 0 and 1 holding",
        ),
        (planted_impls.torch_sum, ORDERED, "not-ring-order", "the target sums that element as fold 0,1,2"),
        (planted_impls.multiplies_after_the_sum, XLA_PMEAN, "avg-times-reciprocal", "as XLA's pmean does"),
    ],
    ids=["wrong-op", "signed-zero", "divided-first", "not-ring-order", "times-reciprocal"],
)
def test_a_ranks_probes_are_read_from_that_rank(
    bug: Callable[..., torch.Tensor], c: Case, code: str, words: str
) -> None:
    group = _bug_on_every_rank(bug)
    finding = diagnose(group, group.call(c), "exact")
    assert finding is not None and finding.codes == [code], finding
    assert finding.ranks == list(range(c.n)) and words in finding.explanation


@pytest.mark.clause("difftest-diagnoses")
def test_a_result_whose_bits_did_not_come_back_does_not_pass_and_is_garbled() -> None:
    # A well-shaped CPU float32 result without its bits (an answer no worker sends, built here by hand):
    # the search and the report agree that it fails, and why.
    sent = call_target(ring_all_reduce, PAIR).answers[0]
    assert sent.result is not None
    blind = replace(sent.result, bits=None, storage=None)
    outcome = Outcome(PAIR, (replace(sent, result=blind),))
    assert structural(outcome) == [
        ("crashed", "its reply was garbled (a result of the right shape came without bits)")
    ]
    assert passes(outcome, "bound") == (False, 0, 0)
    finding = diagnose(ring_all_reduce, outcome, "bound")
    assert finding is not None and finding.codes == ["crashed"], finding
    assert "its reply was garbled" in finding.explanation and "without bits" in finding.explanation


def _in_bfloat16(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x.to(torch.bfloat16)).to(x.dtype)


def _in_float16(x: torch.Tensor) -> torch.Tensor:
    return ring_all_reduce(x.to(torch.float16)).to(x.dtype)


def _max_in_float32(x: torch.Tensor, op: str) -> torch.Tensor:
    return ring_all_reduce(x.to(torch.float32), op=op).to(x.dtype)


# Worker 0 holds 1 + 2^-k, 2 and worker 1 2^-k, 3: every sum exact (order-free inputs), and 1 + 2^-k is no
# value of float32 (k = 40) or of bfloat16 (k = 20), which round it to 1; and 1 + 2^-10 + 2^-40, whose
# float32 sum (1 + 2^-10) tells float32 from bfloat16 (1), so that the narrower one is named.
WIDE = (1 + 2**-40, 2.0, 2**-40, 3.0)
F32 = (1 + 2**-20, 2.0, 2**-20, 3.0)
WIDE_BF16 = (1 + 2**-10 + 2**-40, 2.0, 2**-40, 3.0)
# Both workers hold 1 + 2^-10 + 2^-20, a float32 value (so float32 is passed over) of neither bfloat16 nor
# float16, which round it to 1 and 1 + 2^-10; float16's sum 2 + 2^-9 is no bfloat16 value: float16 is named.
F32_IN_F16 = (1 + 2**-10 + 2**-20, 2.0, 1 + 2**-10 + 2**-20, 3.0)


@pytest.mark.clause("difftest-narrowed-dtype")
@pytest.mark.parametrize(
    ("bug", "c", "narrow"),
    [
        (planted_impls.narrows_float64, case(WIDE, dtype=torch.float64), "float32"),
        (_in_bfloat16, case(F32), "bfloat16"),
        (_in_bfloat16, case(WIDE_BF16, dtype=torch.float64), "bfloat16"),
        (_max_in_float32, case(WIDE, "max", dtype=torch.float64), "float32"),
        (_in_float16, case(F32_IN_F16, dtype=torch.float64), "float16"),
    ],
    ids=["float64-in-float32", "float32-in-bfloat16", "float64-in-bfloat16", "max", "float64-in-float16"],
)
def test_a_result_computed_in_a_narrower_dtype_is_named_for_any_target(
    bug: Callable[..., torch.Tensor], c: Case, narrow: str
) -> None:
    wide = str(c.dtype).removeprefix("torch.")
    for mode in MODES:
        codes, text = find(bug, c, mode)
        assert codes == ["narrowed-dtype"], (mode, text)
        assert text.endswith(
            f". Every element is a {narrow} value, within {narrow}'s forward-error bound of the "
            f"{c.reduction} of the inputs rounded to {narrow}: the target computed in {narrow} and widened "
            f"the result back to {wide} (a conversion that narrows silently, as mlx.core.array makes float32 "
            "of a float64 numpy array)"
        )
    # The same on every rank of a group: each rank's result is named, the ranks listed.
    group = _bug_on_every_rank(bug)
    finding = diagnose(group, group.call(c), "bound")
    assert finding is not None and finding.codes == ["narrowed-dtype"] and finding.ranks == [0, 1]


@pytest.mark.clause("difftest-narrowed-dtype")
@pytest.mark.parametrize(
    "bug",
    [
        lambda x: -planted_impls.narrows_float64(x),  # float32 values, but nowhere near the sum
        lambda x: ring_all_reduce(x) * (1 + 2**-30),  # off by more than float64's bound, not float32 values
    ],
    ids=["negated", "scaled"],
)
def test_wrong_values_of_no_narrower_computation_are_not_narrowed_dtype(
    bug: Callable[..., torch.Tensor],
) -> None:
    codes, _ = find(bug, case(WIDE, dtype=torch.float64), "bound")
    assert "narrowed-dtype" not in codes and codes == ["out-of-bound"]


def _flushes_subnormals(x: torch.Tensor) -> torch.Tensor:
    total = ring_all_reduce(x)
    return torch.where(total.abs() < torch.finfo(x.dtype).tiny, torch.zeros_like(total), total)


@pytest.mark.clause("difftest-narrowed-dtype")
def test_a_subnormal_flushed_to_zero_is_out_of_bound_not_narrowed_dtype() -> None:
    """XLA's CPU collectives flush subnormals: 2^-140 + 2^-141 comes back 0.0, a value of every narrower
    dtype, and within bfloat16's bound of the inputs rounded to it (both round to 0); no input of a
    narrower dtype's normal range lost a bit, so nothing names a narrowing."""
    c = Case(2, 2, (), torch.float32, "contiguous", (2.0**-140, 1.0, 2.0**-141, 1.0))
    codes, _ = find(_flushes_subnormals, c, "bound")
    assert codes == ["out-of-bound"]
