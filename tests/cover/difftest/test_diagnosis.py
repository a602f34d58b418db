"""Diagnosis: each planted bug gets its code and an explanation naming the element, chunk and values."""

from __future__ import annotations

import json

import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._reveal import RevealError, reveal
from ring_ref.difftest import CODES, DTYPES, Case, difftest
from ring_ref.difftest._call import Answer, Outcome, call_target
from ring_ref.difftest._diagnosis import diagnose, structural
from ring_ref.difftest._inputs import (
    LAYOUTS,
)
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._orders import per_rank_target
from ring_ref.testing import assert_matches_reference
from tests.common import planted_impls, planted_rank_impls
from tests.common.oracles import exact_sum, ring_fold, same_bits
from tests.common.paths import ROOT
from tests.common.planted_impls import Impl, run_all

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
GUIDE = (ROOT / "docs" / "guide" / "difftest.md").read_text(encoding="utf-8")
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())


@pytest.mark.clause("difftest-diagnoses", "sum-not-mean", "ag-copy-not-add", "input-unchanged")
@pytest.mark.clause("no-aliasing", "preserve-dtype-device", "output-shape", "n1-no-rounds")
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
