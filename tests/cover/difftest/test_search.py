"""The search of one mode (``ring_ref.difftest._search``): correct implementations pass, the N = 1 and
non-contiguous cases are always tried, every input is counted, a failure is shrunk, zeroed, replayed twice
and diagnosed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

from ring_ref import ring_all_reduce
from ring_ref._chunks import chunk_bounds, chunk_rows
from ring_ref.difftest import DTYPES, Case, difftest
from ring_ref.difftest._call import Outcome, call_target
from ring_ref.difftest._inputs import every_n_cases, one_worker_cases, uneven_cases
from ring_ref.difftest._oracles import SPEC_ORDER, ExactOrder, reduce_scatter_reference
from ring_ref.difftest._orders import reduce_scatter_order, schedule_order
from ring_ref.difftest._search import (
    ZERO_OUT_BUDGET,
    _equal_chunks,
    _Failed,
    _first_failed,
    _searched,
    _zero_signs_only,
    run_mode,
    zero_out,
)
from ring_ref.difftest._vocabulary import Mode, Op
from ring_ref.schedule import Collective, RingSchedule
from tests.common import planted_impls
from tests.common.paths import ROOT
from tests.common.planted_impls import Impl, run_all
from tests.common.scripted import Answer, Scripted, crashed, off_by, right

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
BUGGY_EXAMPLE = ROOT / "examples" / "buggy_allreduce.py"
ALL_DTYPES = tuple(DTYPES.values())


@pytest.mark.clause("difftest-oracles", "fold-order")
@pytest.mark.parametrize("name", sorted(planted_impls.CORRECT))
def test_correct_implementations_pass_every_mode(name: str) -> None:
    report = run_all(planted_impls.CORRECT[name], examples=40)
    assert report.verdict == "pass", report.render()
    assert set(report.modes) == {"exact", "order-free", "bound"}
    assert all(r.examples >= 40 for r in report.modes.values())
    assert report.diagnoses == []


@pytest.mark.clause("difftest-diagnoses", "n1-no-rounds")
@pytest.mark.parametrize("bug", [planted_impls.raises_on_one_worker, planted_impls.returns_view_of_input])
def test_one_worker_is_always_tried(bug: Impl) -> None:
    report = difftest(bug, modes=("bound",), examples=1, seed=0, max_workers=16)
    result = report.modes["bound"]
    assert result.verdict == "fail" and result.counterexample is not None
    assert result.counterexample.n == 1


@pytest.mark.clause("difftest-diagnoses", "n1-no-rounds")
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_non_contiguous_input_is_tried_for_every_dtype_even_with_one_example(dtype: torch.dtype) -> None:
    report = difftest(
        planted_impls.rejects_non_contiguous, modes=("bound",), examples=1, seed=0, dtypes=[dtype]
    )
    result = report.modes["bound"]
    assert result.finding is not None and result.counterexample is not None, report.render()
    assert result.finding.codes == ["raised"] and "expected a contiguous tensor" in result.finding.explanation
    assert not result.counterexample.tensor().is_contiguous()


@pytest.mark.soak
@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("name", sorted(planted_impls.CORRECT))
def test_soak_correct_implementations_pass_many_examples(name: str) -> None:
    report = difftest(planted_impls.CORRECT[name], examples=1000, seed=7)
    assert report.verdict == "pass", report.render()


@pytest.mark.clause("difftest-every-n")
@pytest.mark.parametrize("seed", range(20))
def test_a_value_bug_at_one_n_fails_every_mode_at_every_seed(seed: int) -> None:
    """Issue #40 item 1, stacked: a bug at ``N = 3`` alone, which zeros hide, fails every mode at
    ``--examples 20``, whatever the seed: every ``N`` gets its value probes and a random case."""
    report = difftest(planted_impls.chunks_rotated_at_three, examples=20, seed=seed, isolate=False)
    for mode, result in report.modes.items():
        case = result.counterexample
        assert result.verdict == "fail" and case is not None and case.n == 3, (mode, report.render())


@pytest.mark.clause("difftest-coverage")
def test_a_pass_names_the_remainders_it_never_tried_and_the_option_that_tries_them() -> None:
    """Issue #40 item 2: a ring that drops the remainder passes the default schedule (every M a multiple
    of N); its report says, per mode, that no M had a remainder, and names ``--schedule openmpi-ring``."""
    report = difftest(planted_impls.drops_the_remainder, examples=10, seed=3, isolate=False)
    assert report.verdict == "pass", report.render()
    doc = report.to_json()
    jsonschema.validate(doc, SCHEMA)
    for mode, result in doc["modes"].items():
        coverage = result["coverage"]
        assert coverage["m_not_multiple_of_n"] is False and coverage["n"] == list(range(1, 17)), mode
        assert {"what": "M not a multiple of N", "option": "--schedule openmpi-ring"} in coverage["untried"]
    text = report.render()
    assert text.count("never tried: M not a multiple of N (--schedule openmpi-ring)") == 3, text
    assert "--op prod/max/min/avg" in text, text
    blocks = difftest(
        planted_impls.drops_the_remainder, examples=10, seed=3, isolate=False, schedule="openmpi-ring"
    )
    assert blocks.verdict == "fail" and blocks.modes["exact"].coverage is not None, blocks.render()
    assert blocks.modes["exact"].coverage.remainder, blocks.render()


# ==========================================================================================================
# The search (``ring_ref.difftest._search``): cases run, failures shrunk, zeroed and replayed.
#
# Fast, so that ``make mutation`` can run it for each mutant of the search: tiny
# example budgets, targets run in pytest's process (the correct
# ``ring_all_reduce``, small wrong ones written here, and a scripted launcher
# whose every answer is chosen by the test), and ``zero_out`` with predicates
# written here.  What is checked is what the difftest guide (``docs/guide/difftest.md``)
# and ``difftest``'s docstring promise: every generated input is answered and counted, the
# ``N = 1`` cases run first, a failure is shrunk and then zeroed value by value,
# replayed twice (``nondeterministic`` when the answers differ), a call that
# does not answer ends the mode at once.
# ==========================================================================================================


F32 = [torch.float32]
F64 = [torch.float64]
CASE = Case(2, 2, (), torch.float32, "contiguous", (1.0, 2.0, 3.0, 4.0))
OVERFLOWS = Case(2, 2, (), torch.float16, "contiguous", (60000.0,) * 4)
"""Each element's sum, 120000, is past float16's largest finite value in every order: two elements skipped."""
UNDERFLOWS = Case(2, 2, (), torch.float16, "contiguous", (2.0**-14,) * 4, "prod")
"""Each element's product, 2^-28, is below float16's smallest subnormal: two elements skipped."""


def all_zero(case: Case) -> bool:
    return all(v == 0 for v in case.values)


def zero_calls(launcher: Scripted) -> list[int]:
    """The call numbers (from 1) of the calls on an all-zero case."""
    return [k for k, c in enumerate(launcher.cases, 1) if all_zero(c)]


# --- run_mode: counting, order of cases, per-rank layouts ------------------------------------------------


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("op", [None, "max"])
def test_a_passing_mode_counts_every_call_and_runs_the_one_worker_cases_first(op: Op | None) -> None:
    launcher = Scripted(right)
    result = run_mode(launcher, "bound", examples=4, seed=3, max_workers=3, dtypes=F32, op=op)
    assert result.mode == "bound" and result.verdict == "pass"
    assert result.finding is None and result.counterexample is None
    # --examples generated, after the N = 1 ones and the three of every N (clause difftest-every-n)
    assert result.examples == len(launcher.cases) == 4 + 2 + 3 * 3
    first = one_worker_cases("bound", F32, op=op)
    assert launcher.cases[: len(first)] == first
    every_n = every_n_cases("bound", F32, range(1, 4), seed=3, op=op)
    assert launcher.cases[len(first) : len(first) + len(every_n)] == every_n
    assert {c.op for c in launcher.cases} == {op} and max(c.n for c in launcher.cases) <= 3
    assert result.overflow_skipped == result.underflow_skipped == 0


@pytest.mark.clause("difftest-oracles")
def test_a_per_rank_launcher_is_given_contiguous_inputs_only() -> None:
    per_rank, stacked = Scripted(right, per_rank=True), Scripted(right)
    for launcher in (per_rank, stacked):
        run_mode(launcher, "order-free", examples=4, seed=2, max_workers=4, dtypes=F32)
    assert {c.layout for c in per_rank.cases} == {"contiguous"}
    assert per_rank.cases[:2] == one_worker_cases("order-free", F32, per_rank=True)
    assert len({c.layout for c in stacked.cases[2:]}) > 1


@pytest.mark.clause("difftest-oracles")
def test_a_launcher_that_cannot_run_one_worker_gets_no_one_worker_case() -> None:
    launcher = Scripted(right)
    launcher.min_workers = 2  # a job of two ranks: N = 1 cannot be called
    result = run_mode(launcher, "bound", examples=6, seed=1, max_workers=3, dtypes=F32)
    assert result.verdict == "pass" and {c.n for c in launcher.cases} == {2, 3}, launcher.cases


@pytest.mark.clause("difftest-exact-orders")
def test_an_order_whose_layout_takes_any_m_is_searched_at_m_not_a_multiple_of_n() -> None:
    order = schedule_order("openmpi-ring")  # layout blocks: any M
    launcher = Scripted(lambda case, k: call_target(lambda x: order.expected(case), case))
    result = run_mode(launcher, "bound", examples=5, seed=4, max_workers=3, dtypes=F64, order=order)
    assert result.verdict == "pass", result
    assert {c.dtype for c in launcher.cases} == {torch.float64} and max(c.n for c in launcher.cases) == 3
    uneven = [c for c in launcher.cases if c.m % c.n]
    assert uneven, launcher.cases  # the uneven examples run first, whatever Hypothesis draws
    assert launcher.cases.index(uneven[0]) < 3 + 2 * 3 + 2  # before the generated inputs


@pytest.mark.clause("difftest-order-probes")
def test_a_sum_that_passes_exact_is_then_probed_and_the_probes_reported() -> None:
    launcher = Scripted(right)
    result = run_mode(launcher, "exact", examples=2, seed=0, max_workers=3, dtypes=F32)
    assert result.verdict == "pass" and result.probes is not None, result
    # N - 1 calls per N from 2 to 3 and per size probed there (clause difftest-order-probes)
    probes = result.probes
    assert probes.workers == {"float32": [2, 3]} and set(probes.sizes) == {2, 3}
    assert probes.calls == sum((n - 1) * len(sizes) for n, sizes in probes.sizes.items()), probes
    assert result.examples < len(launcher.cases)  # the probes are calls beyond the counted examples
    others: tuple[tuple[Mode, Op | None], ...] = (("bound", None), ("exact", "max"))
    for mode, op in others:
        other = run_mode(Scripted(right), mode, examples=2, seed=0, max_workers=3, dtypes=F32, op=op)
        assert other.verdict == "pass" and other.probes is None, (mode, op)


def plus_zero_fold(x: torch.Tensor) -> torch.Tensor:
    """Worker 0 to N - 1 added in turn onto ``+0.0``: not the ring's order, and ``+0.0`` where every
    worker holds ``-0.0``."""
    total = torch.zeros_like(x[0])
    for row in x:
        total = total + row
    return total


@pytest.mark.clause("difftest-order-probes")
def test_a_fold_from_plus_zero_is_reported_on_the_probe_that_shows_its_order() -> None:
    launcher = Scripted(lambda case, k: call_target(plus_zero_fold, case))
    result = run_mode(launcher, "exact", examples=3, seed=0, max_workers=4, dtypes=F32)
    assert result.verdict == "fail" and result.counterexample is not None, result
    # the search fails first on -0.0 (N = 1); the order probes then find an input where the order shows
    assert not all_zero(result.counterexample) and result.counterexample.n >= 3, result.counterexample
    assert result.probes is not None and result.probes.calls >= 1
    assert result.finding is not None and result.finding.codes == ["not-ring-order"], result.finding


def test_a_difference_only_in_zero_signs_is_read_against_the_order_checked() -> None:
    # by hand: element 0 is -0.0 on every worker; elements 1 and 2 sum 1 + 1 + 2^24, which the chain
    # (((1 + 1) + 2^24) = 2^24 + 2) and the spec's ring (1 + 2^24 first: 2^24, then + 1: 2^24) round apart
    case = Case(
        3, 3, (), torch.float32, "contiguous", (-0.0, 1.0, 1.0, -0.0, 1.0, 1.0, -0.0, 2.0**24, 2.0**24)
    )
    chain = schedule_order("chain")
    answer = torch.tensor([0.0, 2.0**24 + 2, 2.0**24 + 2])  # the chain's sums, from +0.0
    outcome = call_target(lambda x: answer.clone(), case)
    assert _zero_signs_only(outcome, chain)
    assert not _zero_signs_only(outcome, SPEC_ORDER)  # against the spec's ring the sums differ too


def reduce_scatter_answer(ring: RingSchedule) -> Answer:
    def answer(case: Case, k: int) -> Outcome:
        return call_target(lambda x, op="sum": reduce_scatter_reference(x, op=op, schedule=ring), case)

    return answer


@pytest.mark.clause("difftest-collectives")
@pytest.mark.parametrize("per_rank", [False, True])
def test_a_reduce_scatter_draws_shards_the_orders_layout_cuts_equally(per_rank: bool) -> None:
    ring = RingSchedule(1, 1, "gloo")  # gloo's layout: unequal chunks at many M a multiple of N
    order = reduce_scatter_order(ring, 4)
    launcher = Scripted(reduce_scatter_answer(ring), per_rank=per_rank)
    collective = Collective.REDUCE_SCATTER
    result = run_mode(
        launcher, "bound", examples=20, seed=3, max_workers=4, dtypes=F64, collective=collective, order=order
    )
    assert result.verdict == "pass", result
    cases = launcher.cases
    assert {c.collective for c in cases} == {collective} and {c.dtype for c in cases} == {torch.float64}
    assert cases[0].n == 1 and max(c.n for c in cases) <= 4  # the one-worker cases first
    for case in cases:
        s = len(case.values) // case.n
        assert case.m % case.n == 0 and chunk_bounds("gloo", case.n, s) == chunk_rows(s, case.n), case
    layouts = {c.layout for c in cases}
    assert layouts == {"contiguous"} if per_rank else len(layouts) > 1, layouts


@pytest.mark.clause("difftest-collectives")
def test_an_all_gather_draws_shards_of_any_bits_in_every_layout() -> None:
    launcher = Scripted(lambda case, k: call_target(planted_impls.all_gather_copied, case))
    collective = Collective.ALL_GATHER
    result = run_mode(
        launcher, "order-free", examples=8, seed=2, max_workers=3, dtypes=F32, collective=collective
    )
    assert result.verdict == "pass", result
    assert {c.collective for c in launcher.cases} == {collective} and launcher.cases[0].n == 1
    assert {c.dtype for c in launcher.cases} == {torch.float32} and len(
        {c.layout for c in launcher.cases}
    ) > 1


def test_equal_chunks_under_a_layout_are_the_shards_of_a_reduce_scatter() -> None:
    # by hand from gloo's segments (ring_ref/_chunks.py): N = 4, 4 elements each cut 2, 2, 0, 0
    four = Case(4, 4, (), torch.float64, "contiguous", (0.0,) * 16)
    assert not _equal_chunks(four, "gloo") and _equal_chunks(four, "even") and _equal_chunks(four, "blocks")
    assert _equal_chunks(replace(four, m=8, values=(0.0,) * 32), "gloo")  # 2, 2, 2, 2


def fixed(case: Case, then: Answer | None = None, after: int = 0) -> Answer:
    """Answers the reference on ``case`` whatever was asked; from call ``after + 1`` on, ``then``."""

    def answer(asked: Case, k: int) -> Outcome:
        return then(asked, k) if then is not None and k > after else right(case, k)

    return answer


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize(("case", "over", "under"), [(OVERFLOWS, 2, 0), (UNDERFLOWS, 0, 2)])
def test_elements_skipped_for_overflow_and_underflow_are_summed_over_the_calls(
    case: Case, over: int, under: int
) -> None:
    launcher = Scripted(fixed(case))
    result = run_mode(launcher, "bound", examples=3, seed=0, max_workers=2, dtypes=F32, op=case.op)
    calls = len(launcher.cases)
    assert result.verdict == "pass" and calls >= 5
    assert (result.overflow_skipped, result.underflow_skipped) == (over * calls, under * calls)


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("then", [crashed, off_by(1.0)], ids=["crash", "wrong"])
@pytest.mark.parametrize(("case", "over", "under"), [(OVERFLOWS, 2, 0), (UNDERFLOWS, 0, 2)])
def test_a_failing_mode_reports_the_skips_before_the_failure(
    then: Answer, case: Case, over: int, under: int
) -> None:
    # Call 4 is the last of the four N = 1 cases, which are not shrunk.
    launcher = Scripted(fixed(case, then, after=3))
    dtypes = [torch.float32, torch.float64]
    result = run_mode(launcher, "bound", examples=3, seed=0, max_workers=2, dtypes=dtypes, op=case.op)
    assert result.verdict == "fail" and result.counterexample is not None
    assert launcher.cases[3] == one_worker_cases("bound", dtypes, op=case.op)[3]
    assert (result.overflow_skipped, result.underflow_skipped) == (3 * over, 3 * under)


# --- run_mode: calls that do not answer ----------------------------------------------------------------


@pytest.mark.clause("difftest-oracles")
def test_a_crash_in_the_search_ends_the_mode_at_once_with_that_call() -> None:
    launcher = Scripted(lambda case, k: crashed(case, k) if k == 4 else right(case, k))
    result = run_mode(launcher, "order-free", examples=10, seed=0, max_workers=3, dtypes=F32)
    assert len(launcher.cases) == 4 and result.examples == 4
    assert result.verdict == "fail" and result.mode == "order-free"
    assert result.counterexample == launcher.cases[3] and result.output == "call 4"
    assert result.finding is not None and result.finding.codes == ["crashed"]
    assert result.finding.explanation == "died on call 4" and result.finding.stack == "stack of the dead"


@pytest.mark.clause("difftest-oracles")
def test_a_crash_while_zeroing_ends_the_mode_with_the_zeroed_case() -> None:
    def answer(case: Case, k: int) -> Outcome:
        return crashed(case, k) if 0 in case.values else off_by(1.0)(case, k)

    launcher = Scripted(answer)
    result = run_mode(launcher, "exact", examples=3, seed=0, max_workers=2, dtypes=F32)
    first = launcher.cases[0]
    assert result.verdict == "fail" and result.finding is not None and result.finding.codes == ["crashed"]
    assert result.counterexample == launcher.cases[-1] == replace(first, values=(0.0, *first.values[1:]))
    assert result.output == f"call {len(launcher.cases)}"


@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("replay", [1, 2])
def test_a_crash_when_the_shrunk_case_is_replayed_is_reported(replay: int) -> None:
    # Always off by one; the calls on the fully zeroed case are the last zeroing trial, then the replays.
    launcher = Scripted(off_by(1.0))

    def answer(case: Case, k: int) -> Outcome:
        if all_zero(case) and len(zero_calls(launcher)) == 1 + replay:
            return crashed(case, k)
        return off_by(1.0)(case, k)

    launcher.answer = answer
    result = run_mode(launcher, "bound", examples=3, seed=0, max_workers=2, dtypes=F32)
    assert result.finding is not None and result.finding.codes == ["crashed"]
    assert result.counterexample is not None and all_zero(result.counterexample)
    assert result.output == f"call {zero_calls(launcher)[replay]}"


# --- run_mode: failures, shrinking, replays -----------------------------------------------------------


@pytest.mark.clause("difftest-oracles")
def test_a_value_failure_is_zeroed_replayed_twice_and_diagnosed() -> None:
    launcher = Scripted(off_by(1.0))
    result = run_mode(launcher, "exact", examples=3, seed=0, max_workers=2, dtypes=F32)
    assert result.verdict == "fail" and result.mode == "exact" and result.finding is not None
    assert "nondeterministic" not in result.finding.codes and result.finding.mismatch is not None
    assert result.counterexample == replace(launcher.cases[0], values=(0.0, 0.0))
    first_replay = zero_calls(launcher)[1]
    assert launcher.cases[first_replay - 1 : first_replay + 1] == [result.counterexample] * 2
    assert result.output == f"call {first_replay}"
    assert result.examples == first_replay - 1


@pytest.mark.clause("difftest-oracles")
def test_different_answers_on_the_two_replays_are_nondeterministic() -> None:
    launcher = Scripted(off_by(1.0))

    def answer(case: Case, k: int) -> Outcome:
        return off_by(2.0 if all_zero(case) and len(zero_calls(launcher)) == 3 else 1.0)(case, k)

    launcher.answer = answer
    result = run_mode(launcher, "order-free", examples=3, seed=0, max_workers=2, dtypes=F32)
    assert result.finding is not None and result.finding.codes == ["nondeterministic"]
    assert result.finding.explanation.startswith("The same input, called twice, gave different answers: ")
    assert "1.0 the first time, 2.0 the second" in result.finding.explanation
    assert result.counterexample is not None and all_zero(result.counterexample)
    assert result.output == f"call {zero_calls(launcher)[1]}"


def once(answer: Answer, smallest_n: int, then: Answer = right) -> Scripted:
    """A launcher that answers ``answer`` on the first case with ``N >= smallest_n``, else ``then``."""
    launcher = Scripted(then)

    def script(case: Case, k: int) -> Outcome:
        first = next((j for j, c in enumerate(launcher.cases, 1) if c.n >= smallest_n), None)
        return answer(case, k) if k == first else then(case, k)

    launcher.answer = script
    return launcher


# N = 1: an explicit case; N = 2: a generated one, which Hypothesis calls again (a flaky failure).
@pytest.mark.clause("difftest-oracles")
@pytest.mark.parametrize("smallest_n", [1, 2])
def test_a_failure_that_passes_on_replay_is_nondeterministic(smallest_n: int) -> None:
    launcher = once(off_by(1.0), smallest_n)
    result = run_mode(launcher, "bound", examples=5, seed=0, max_workers=2, dtypes=F32)
    assert result.verdict == "fail" and result.finding is not None
    assert result.finding.codes == ["nondeterministic"]
    explanation = result.finding.explanation
    assert explanation.startswith("This input failed during the search but passed both times it was replayed")
    assert "the target's answer depends on more than its input" in explanation
    assert explanation.endswith("(earlier calls, time, randomness)")
    failed = next(c for c in launcher.cases if c.n >= smallest_n)
    assert result.counterexample == failed and launcher.cases[-2:] == [failed] * 2
    assert result.output == f"call {len(launcher.cases) - 1}"


@pytest.mark.clause("difftest-oracles")
def test_an_error_of_the_launcher_itself_is_not_taken_for_a_failure() -> None:
    def broken(case: Case, k: int) -> Outcome:
        raise RuntimeError("a bug in the launcher")

    # the first case of N = 2 is an explicit one (clause difftest-every-n): its error comes through as is
    with pytest.raises(RuntimeError, match=r"^a bug in the launcher$"):
        run_mode(once(broken, 2), "bound", examples=5, seed=0, max_workers=2, dtypes=F32)


@pytest.mark.clause("difftest-oracles")
def test_a_bug_of_the_launcher_is_raised_even_where_other_cases_fail() -> None:
    # Hypothesis reports one bug, the smallest: here the launcher's, on N = 2.
    def answer(case: Case, k: int) -> Outcome:
        if case.n == 2:
            raise RuntimeError("a bug in the launcher")
        return (off_by(1.0) if case.n == 3 else right)(case, k)

    with pytest.raises(RuntimeError, match="a bug in the launcher"):
        run_mode(Scripted(answer), "bound", examples=30, seed=0, max_workers=3, dtypes=F32)


NOT_RING = Case(
    3, 3, (), torch.float16, "contiguous", (0, 0, -0.0670166015625, 0, 0, -18.390625, 0, 0, 18.25)
)
"""``torch.sum`` adds the three workers in another order than the ring: the third element rounds otherwise."""


@pytest.mark.clause("difftest-oracles")
def test_a_failure_is_diagnosed_under_its_mode_with_probes_sent_through_the_launcher() -> None:
    def summed(case: Case, k: int) -> Outcome:
        return call_target(planted_impls.torch_sum, case)

    launcher = Scripted(summed)
    order = replace(SPEC_ORDER, cases=st.just(NOT_RING))
    result = run_mode(launcher, "exact", examples=3, seed=0, max_workers=3, dtypes=F32, order=order)
    assert result.verdict == "fail" and result.counterexample == NOT_RING
    assert result.finding is not None and result.finding.codes == ["not-ring-order"]
    replayed = max(k for k, c in enumerate(launcher.cases) if c == NOT_RING)
    assert len(launcher.cases) > replayed + 1  # the diagnosis' probes went through the launcher too


@pytest.mark.clause("difftest-oracles")
def test_the_same_seed_draws_the_same_cases_and_another_seed_others() -> None:
    runs = {}
    for name, seed in (("first", 7), ("again", 7), ("other", 8)):
        launcher = Scripted(right)
        run_mode(launcher, "order-free", examples=4, seed=seed, max_workers=4, dtypes=F32)
        runs[name] = launcher.cases
    assert runs["first"] == runs["again"] and runs["first"] != runs["other"]


@pytest.fixture
def with_a_deadline() -> Iterator[None]:
    """A Hypothesis profile with a deadline (Hypothesis' default has one of 200 ms; this suite's has none)."""
    previous = settings.get_current_profile_name()
    settings.register_profile("ring-ref-kills-deadline", deadline=timedelta(milliseconds=20))
    settings.load_profile("ring-ref-kills-deadline")
    try:
        yield
    finally:
        settings.load_profile(previous)


@pytest.mark.clause("difftest-oracles")
def test_a_slow_call_is_not_a_failure_whatever_the_profile(with_a_deadline: None) -> None:
    def slow(case: Case, k: int) -> Outcome:
        time.sleep(0.05)
        return right(case, k)

    result = run_mode(once(slow, 2), "bound", examples=5, seed=0, max_workers=2, dtypes=F32)
    assert result.verdict == "pass"


@pytest.mark.clause("difftest-oracles")
def test_no_health_check_stops_the_search() -> None:
    # An order whose inputs come from a strategy with a very large smallest example.
    large = st.lists(st.booleans(), min_size=4200, max_size=4200).map(lambda _: CASE)
    order = replace(SPEC_ORDER, cases=large)
    result = run_mode(Scripted(right), "exact", examples=2, seed=0, max_workers=2, dtypes=F32, order=order)
    assert result.verdict == "pass" and result.examples == 2  # (Hypothesis checks health from 2 examples)


@pytest.mark.clause("difftest-oracles")
def test_a_failure_raised_in_a_group_is_shrunk_like_any_other() -> None:
    def test() -> None:
        raise BaseExceptionGroup("two", [ValueError("no"), _Failed(CASE)])

    found = _searched(test, lambda c: c.values[0] != 0)
    assert found == replace(CASE, values=(1.0, 0.0, 0.0, 0.0))  # zeroed where it still fails
    with pytest.raises(BaseExceptionGroup):
        _searched(lambda: (_ for _ in ()).throw(ExceptionGroup("e", [KeyError()])), lambda c: True)


@pytest.mark.clause("difftest-oracles")
def test_the_first_failed_case_is_found_in_nested_groups() -> None:
    inner, other = _Failed(CASE), _Failed(replace(CASE, n=1))
    group = BaseExceptionGroup(
        "outer", [ValueError("no"), BaseExceptionGroup("inner", [KeyError(), inner]), other]
    )
    assert _first_failed(group) is inner
    assert (
        _first_failed(BaseExceptionGroup("none", [ValueError(), ExceptionGroup("e", [KeyError()])])) is None
    )


# --- exact against an order with its own cases -------------------------------------------------------------


@pytest.mark.clause("difftest-oracles")
def test_exact_draws_only_the_inputs_of_an_order_that_has_its_own() -> None:
    sliced = replace(CASE, layout="sliced", trailing=(1,))
    order = ExactOrder("a saved order", SPEC_ORDER.expected, cases=st.just(sliced))
    stacked, per_rank, bound = Scripted(right), Scripted(right, per_rank=True), Scripted(right)
    run_mode(stacked, "exact", examples=3, seed=0, max_workers=4, dtypes=F32, order=order)
    run_mode(per_rank, "exact", examples=3, seed=0, max_workers=4, dtypes=F32, order=order)
    run_mode(bound, "bound", examples=3, seed=0, max_workers=4, dtypes=F32, order=order)
    assert stacked.cases and set(stacked.cases) == {sliced}
    assert per_rank.cases and set(per_rank.cases) == {replace(sliced, layout="contiguous")}
    assert bound.cases[:2] == one_worker_cases("bound", F32)


# --- zero_out -----------------------------------------------------------------------------------------


def tried(
    values: tuple[float, ...], fails: Callable[[tuple[float, ...]], bool]
) -> tuple[list[tuple[float, ...]], tuple[float, ...]]:
    trials: list[tuple[float, ...]] = []
    case = Case(1, len(values), (), torch.float64, "strided", values, "prod")

    def predicate(candidate: Case) -> bool:
        assert replace(candidate, values=case.values) == case  # only the values change
        trials.append(candidate.values)
        return fails(candidate.values)

    out = zero_out(case, predicate)
    assert replace(out, values=case.values) == case
    return trials, out.values


@pytest.mark.clause("difftest-oracles")
def test_zero_out_tries_each_non_zero_value_in_order_and_keeps_the_zeros_that_still_fail() -> None:
    trials, out = tried((1.0, 2.0, 0.0, 3.0), lambda v: v[1] != 0)
    assert trials == [(0.0, 2.0, 0.0, 3.0), (0.0, 0.0, 0.0, 3.0), (0.0, 2.0, 0.0, 0.0)]
    assert out == (0.0, 2.0, 0.0, 0.0)


@pytest.mark.clause("difftest-oracles")
def test_zero_out_keeps_the_first_values_that_matter() -> None:
    _, out = tried((1.0, 1.0, 1.0, 1.0, -0.0), lambda v: sum(v) >= 2)
    assert out == (0.0, 0.0, 1.0, 1.0, -0.0)


@pytest.mark.clause("difftest-oracles")
def test_zero_out_changes_nothing_when_no_zero_still_fails() -> None:
    trials, out = tried((5.0, -6.0), lambda v: all(x != 0 for x in v))
    assert trials == [(0.0, -6.0), (5.0, 0.0)] and out == (5.0, -6.0)


@pytest.mark.clause("difftest-oracles")
def test_zero_out_stops_after_its_budget_of_values() -> None:
    values = tuple(float(i) for i in range(ZERO_OUT_BUDGET + 10))  # the first is zero already
    trials, out = tried(values, lambda v: True)
    assert len(trials) == ZERO_OUT_BUDGET
    assert out == (0.0,) * (ZERO_OUT_BUDGET + 1) + values[ZERO_OUT_BUDGET + 1 :]


@pytest.mark.clause("difftest-oracles")
def test_zero_out_of_an_all_zero_case_calls_nothing() -> None:
    trials, out = tried((0.0, -0.0), lambda v: True)
    assert trials == [] and out == (0.0, -0.0)


@pytest.mark.clause("difftest-oracles")
def test_the_search_ends_with_mostly_zeros_for_a_one_element_bug() -> None:
    def first_doubled(x: torch.Tensor) -> torch.Tensor:
        result = ring_all_reduce(x).clone()
        result.view(-1)[0] *= 2
        return result

    mode: Mode = "bound"
    result = run_mode(first_doubled, mode, examples=2, seed=0, max_workers=2, dtypes=F32)
    first = one_worker_cases(mode, F32)[0]
    assert result.counterexample == replace(first, values=(first.values[0], 0.0))


# --- run_mode: the order checked, probes, coverage and the first cases, per collective -------------------


def order_answer(order: ExactOrder) -> Answer:
    """Answers what ``order`` computes (a target of that order, right by it)."""

    def answer(case: Case, k: int) -> Outcome:
        return call_target(lambda x, op=None: order.expected(case), case)  # expected reads the case's op

    return answer


@pytest.mark.clause("difftest-exact-orders")
def test_exact_passes_a_target_of_the_order_checked_and_names_that_order_when_it_fails() -> None:
    backwards = schedule_order("-1,0,even")  # the spec's ring run the other way round (even: M = kN)
    options: dict[str, Any] = {"examples": 5, "seed": 1, "max_workers": 3, "dtypes": F32, "order": backwards}
    same = run_mode(Scripted(order_answer(backwards)), "exact", **options)
    assert same.verdict == "pass" and same.probes is not None and same.coverage is not None, same
    other = run_mode(Scripted(right), "exact", **options)
    assert other.verdict == "fail" and other.coverage is not None, other
    assert other.finding is not None and other.finding.codes == ["not-ring-order"], other.finding
    assert "direction -1, offset 0, layout even" in other.finding.explanation, other.finding


@pytest.mark.clause("difftest-order-probes")
def test_an_explicit_sum_is_probed_as_the_default_and_draws_the_same_first_cases() -> None:
    launcher = Scripted(right)
    result = run_mode(launcher, "exact", examples=2, seed=5, max_workers=3, dtypes=F32, op="sum")
    assert result.verdict == "pass" and result.probes is not None, result
    first = one_worker_cases("exact", F32, op="sum")
    every_n = every_n_cases("exact", F32, range(1, 4), seed=5, op="sum", drawn=False)
    assert launcher.cases[: len(first) + len(every_n)] == [*first, *every_n]


@pytest.mark.clause("difftest-order-probes")
def test_a_job_of_three_ranks_is_probed_at_three_only() -> None:
    launcher = Scripted(right)
    launcher.min_workers = 3
    result = run_mode(launcher, "exact", examples=2, seed=0, max_workers=3, dtypes=F32)
    assert (
        result.verdict == "pass" and result.probes is not None and result.probes.workers == {"float32": [3]}
    )
    assert {c.n for c in launcher.cases} == {3}


@pytest.mark.clause("difftest-coverage")
def test_a_mode_that_failed_or_did_not_answer_still_reports_what_it_tried() -> None:
    wrong = run_mode(Scripted(off_by(1.0)), "bound", examples=3, seed=0, max_workers=2, dtypes=F32)
    crash = run_mode(Scripted(crashed), "bound", examples=3, seed=0, max_workers=2, dtypes=F32)
    for result in (wrong, crash):
        assert result.verdict == "fail" and result.coverage is not None and result.coverage.n == {1}, result


@pytest.mark.clause("difftest-order-probes")
def test_a_crash_when_a_failing_probe_is_replayed_keeps_the_probes_run() -> None:
    seen = set()

    def answer(case: Case, k: int) -> Outcome:
        """A fold from +0.0 (fails first on -0.0 at N = 1, then a probe at N = 3), and a crash when a case
        of three workers is asked again (the probe's replay)."""
        if case.n >= 3 and case in seen:
            return crashed(case, k)
        seen.add(case)
        return call_target(plus_zero_fold, case)

    result = run_mode(Scripted(answer), "exact", examples=1, seed=0, max_workers=3, dtypes=F32)
    assert result.finding is not None and result.finding.codes == ["crashed"], result
    assert result.probes is not None and result.probes.calls >= 1 and result.coverage is not None


def exactly_summed(case: Case) -> bool:
    """Whether every element's sum over the workers is the same in the dtype in both directions (order-free
    values: every partial sum exact)."""
    x = case.tensor().reshape(case.n, -1)
    forward, backward = x[0].clone(), x[-1].clone()
    for i in range(1, case.n):
        forward, backward = forward + x[i], backward + x[case.n - 1 - i]
    return bool(torch.equal(forward, backward))


@pytest.mark.clause("difftest-collectives")
def test_a_reduce_scatter_search_runs_its_first_cases_then_draws_the_modes_values_with_the_op() -> None:
    ring = RingSchedule(1, 1, "blocks")
    order = reduce_scatter_order(ring, 4)
    scatter = Collective.REDUCE_SCATTER
    launcher = Scripted(reduce_scatter_answer(ring))
    result = run_mode(
        launcher,
        "order-free",
        examples=30,
        seed=1,
        max_workers=4,
        dtypes=F32,
        op="max",
        collective=scatter,
        order=order,
    )
    assert result.verdict == "pass", result
    first = one_worker_cases("order-free", F32, op="max", collective=scatter)
    every_n = every_n_cases("order-free", F32, range(1, 5), seed=1, op="max", collective=scatter)
    assert launcher.cases[: len(first) + len(every_n)] == [*first, *every_n]
    drawn = launcher.cases[len(first) + len(every_n) :]
    assert drawn and {c.op for c in drawn} == {"max"} and len({c.layout for c in drawn}) > 1
    # a layout that cuts M a multiple of N equally keeps the sizes gloo's layout would refuse
    assert any(chunk_bounds("gloo", c.n, c.m) != chunk_rows(c.m, c.n) for c in drawn if not c.trailing)
    summed = Scripted(reduce_scatter_answer(ring))
    run_mode(
        summed, "order-free", examples=30, seed=1, max_workers=4, dtypes=F32, collective=scatter, order=order
    )
    assert all(exactly_summed(c) for c in summed.cases), "order-free draws values every order sums alike"
    first = one_worker_cases("order-free", F32, collective=scatter)
    assert summed.cases[: len(first)] == first


@pytest.mark.clause("difftest-collectives", "difftest-order-probes")
def test_exact_probes_a_reduce_scatter_as_a_reduce_scatter() -> None:
    ring = RingSchedule(1, 1, "even")  # the spec's reduce-scatter ring
    launcher = Scripted(reduce_scatter_answer(ring))
    result = run_mode(
        launcher,
        "exact",
        examples=2,
        seed=0,
        max_workers=3,
        dtypes=F32,
        collective=Collective.REDUCE_SCATTER,
        order=reduce_scatter_order(None, 3),
    )
    assert result.verdict == "pass" and result.probes is not None and result.probes.calls >= 1, result
    assert {c.collective for c in launcher.cases} == {Collective.REDUCE_SCATTER}


@pytest.mark.clause("difftest-collectives")
def test_a_reduce_scatter_in_a_job_of_two_gets_no_one_worker_case() -> None:
    launcher = Scripted(reduce_scatter_answer(RingSchedule(1, 1, "even")))
    launcher.min_workers = 2
    order = reduce_scatter_order(None, 3)
    result = run_mode(
        launcher,
        "bound",
        examples=8,
        seed=2,
        max_workers=3,
        dtypes=F32,
        collective=Collective.REDUCE_SCATTER,
        order=order,
    )
    assert result.verdict == "pass" and {c.n for c in launcher.cases} == {2, 3}, launcher.cases


@pytest.mark.clause("difftest-exact-orders")
@pytest.mark.parametrize("per_rank", [False, True])
def test_an_uneven_layout_runs_the_one_worker_then_the_uneven_cases_first(per_rank: bool) -> None:
    order = schedule_order("openmpi-ring")
    launcher = Scripted(order_answer(order), per_rank=per_rank)
    launcher.min_workers = 3  # a job of three ranks: of the uneven shapes, (N, M) = (3, 4) only
    result = run_mode(
        launcher, "bound", examples=30, seed=3, max_workers=3, dtypes=F64, op="max", order=order
    )
    assert result.verdict == "pass", result
    uneven = uneven_cases("bound", F64, 3, per_rank=per_rank, op="max", min_workers=3)
    assert launcher.cases[: len(uneven)] == uneven and all(c.n == 3 for c in launcher.cases)
    one = Scripted(order_answer(order))  # order-free sums: the values are the mode's own
    run_mode(one, "order-free", examples=2, seed=3, max_workers=3, dtypes=F64, order=order)
    first = [*one_worker_cases("order-free", F64), *uneven_cases("order-free", F64, 3, min_workers=1)]
    assert one.cases[: len(first)] == first
    every_n = len(every_n_cases("bound", F64, range(3, 4), seed=3, per_rank=per_rank, op="max"))
    drawn = launcher.cases[len(uneven) + every_n :]
    assert any(c.m % c.n for c in drawn)  # Hypothesis draws M not a multiple of N too


@pytest.mark.clause("difftest-oracles")
def test_a_stacked_target_is_drawn_every_layout_by_hypothesis_too() -> None:
    launcher = Scripted(right)
    run_mode(launcher, "order-free", examples=30, seed=2, max_workers=3, dtypes=F32)
    skip = len(one_worker_cases("order-free", F32)) + len(
        every_n_cases("order-free", F32, range(1, 4), seed=2)
    )
    assert len({c.layout for c in launcher.cases[skip:]}) > 1
