"""The round-by-round check for every reduction op (clause ``op-trace``).

The implementations checked are ``tests/common/op_rings.py``'s ring, typed in from the
spec, with its planted faults.  Each fault's expected first difference
``(phase, round, worker, slot)`` is derived by hand in the test's docstring
from the schedule (reduce-scatter round ``r``: worker ``i`` receives chunk
``(i - 1 - r) mod N``; all-gather round ``r``: chunk ``(i - r) mod N``) and the
order the checker scans (workers, then slots, ascending).
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings

from ring_ref._tracecheck import (
    Mismatch,
    RoundCallback,
    TracedImplementation,
    TraceMismatch,
    check_trace,
    first_mismatch,
    reference_rounds,
)
from tests.common.op_rings import op_ring
from tests.common.oracles import ring_fold_op, same_bits
from tests.common.strategies import worker_tensors

OPS = ("sum", "prod", "max", "min", "avg")


def _random_input(n: int, m: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand((n, m), generator=gen, dtype=torch.float64) * 8 + 1).to(dtype)


def _correct(op: str) -> TracedImplementation:
    def fn(t: torch.Tensor, cb: RoundCallback) -> torch.Tensor:
        return op_ring(t, op, cb)

    return fn


def _faulty(op: str, fault: str) -> TracedImplementation:
    def fn(t: torch.Tensor, cb: RoundCallback) -> torch.Tensor:
        return op_ring(t, op, cb, fault=fault)

    return fn


def _where(op: str, fault: str, x: torch.Tensor) -> tuple[str, int, int | None, int | None]:
    mismatch = first_mismatch(_faulty(op, fault), x, op)
    assert mismatch is not None, f"the trace check found no difference for {op} {fault}"
    return (mismatch.phase, mismatch.round, mismatch.worker, mismatch.slot)


@pytest.mark.parametrize(
    ("op", "rs", "ag", "result"),
    [
        ("sum", [[1.0, 6.0], [4.0, 4.0]], [[4.0, 6.0], [4.0, 6.0]], [4.0, 6.0]),
        ("prod", [[1.0, 8.0], [3.0, 4.0]], [[3.0, 8.0], [3.0, 8.0]], [3.0, 8.0]),
        ("max", [[1.0, 4.0], [3.0, 4.0]], [[3.0, 4.0], [3.0, 4.0]], [3.0, 4.0]),
        ("min", [[1.0, 2.0], [1.0, 4.0]], [[1.0, 2.0], [1.0, 2.0]], [1.0, 2.0]),
        ("avg", [[1.0, 6.0], [4.0, 4.0]], [[4.0, 6.0], [4.0, 6.0]], [2.0, 3.0]),
    ],
)
@pytest.mark.clause("op-trace")
def test_reference_rounds_of_the_worked_example_for_every_op(
    op: str, rs: list[list[float]], ag: list[list[float]], result: list[float]
) -> None:
    """[1, 2] and [3, 4]: worker 0 stores 4 o 2 in slot 1, worker 1 stores 1 o 3 in slot 0, then copies.

    avg's rounds hold the sums; only the result is divided by N = 2.
    """
    rounds, got = reference_rounds(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), op)
    assert [(r.phase, r.round, r.buffers.tolist()) for r in rounds] == [
        ("reduce-scatter", 0, rs),
        ("all-gather", 0, ag),
    ]
    assert got.tolist() == result


@settings(max_examples=10)
@given(worker_tensors(max_n=6))
@pytest.mark.clause("op-trace", "op-prod", "op-max", "op-min", "op-avg")
def test_a_correct_ring_passes_round_by_round_for_every_op(x: torch.Tensor) -> None:
    for op in OPS:
        assert first_mismatch(_correct(op), x, op) is None, op
        check_trace(_correct(op), x, op)


@pytest.mark.parametrize("op", ["prod", "max"])
@pytest.mark.clause("op-trace")
def test_summing_instead_of_the_op_is_named_at_its_first_receive(op: str) -> None:
    """N = 3, round 0: worker 0 receives chunk 2 from worker 2; its slots 0 and 1 are still its own."""
    x = _random_input(3, 3, seed=41)
    assert _where(op, "sum-not-op", x) == ("reduce-scatter", 0, 0, 2)


@pytest.mark.clause("op-trace", "op-avg")
def test_avg_that_never_divides_differs_only_in_the_result() -> None:
    """Its rounds are the sum's, which the reference's avg rounds are too; the result is not divided."""
    x = _random_input(4, 8, seed=42)
    mismatch = first_mismatch(_faulty("avg", "sum-not-op"), x, "avg")
    assert mismatch is not None
    assert (mismatch.phase, mismatch.round, mismatch.worker, mismatch.slot) == ("result", -1, None, 0)
    assert "divided by N = 4 once" in mismatch.reason


@pytest.mark.clause("op-trace", "op-max")
def test_max_that_keeps_own_on_a_signed_zero_tie_is_named_where_the_tie_is_met() -> None:
    """N = 3, one element per chunk.  Chunk 1 folds workers 1, 2, 0: +0, -1, -0.

    Round 0: worker 2 stores max(+0, -1) = +0 (no tie).  Round 1: worker 0
    receives that +0 and its own is -0: a tie, which the spec gives to incoming
    (+0) and the fault to own (-0).  Chunks 0 (5, 6, 7) and 2 (1, 2, 3) never tie.
    """
    x = torch.tensor([[5.0, -0.0, 2.0], [6.0, 0.0, 3.0], [7.0, -1.0, 1.0]])
    assert _where("max", "own-on-tie", x) == ("reduce-scatter", 1, 0, 1)
    with pytest.raises(TraceMismatch, match=r"reduce-scatter round 1, worker 0, slot 1: element 0 .* -0\.0"):
        check_trace(_faulty("max", "own-on-tie"), x, "max")


@pytest.mark.clause("op-trace", "op-min")
def test_min_that_takes_the_larger_is_named_at_round_0() -> None:
    """N = 2, [1, 2] and [3, 4]: worker 0 receives chunk 1 (4) and keeps 4 instead of its own 2."""
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert _where("min", "max-for-min", x) == ("reduce-scatter", 0, 0, 1)


@pytest.mark.parametrize(("op", "n"), [("prod", 3), ("prod", 5), ("avg", 3)])
@pytest.mark.clause("op-trace", "ag-copy-not-add")
def test_the_op_applied_in_all_gather_is_named_at_its_first_round(op: str, n: int) -> None:
    """All-gather round 0: worker 0 receives finished chunk 0 and combines it with its own x_0."""
    x = _random_input(n, n, seed=43 + n)
    assert _where(op, "op-in-all-gather", x) == ("all-gather", 0, 0, 0)


@settings(max_examples=15)
@given(worker_tensors(max_n=6))
@pytest.mark.clause("op-trace", "op-max", "op-min")
def test_max_and_min_in_all_gather_change_nothing(x: torch.Tensor) -> None:
    """An equivalent fault: a receiver's own partial extreme is a prefix's first extreme, never
    beyond the finished chunk's, and equal to it only as the same element, signed zeros included."""
    for op in ("max", "min"):
        assert first_mismatch(_faulty(op, "op-in-all-gather"), x, op) is None


@pytest.mark.parametrize("fault", ["divide-first", "premultiply"])
@pytest.mark.clause("op-trace", "op-avg")
def test_avg_that_scales_contributions_first_is_named_at_round_0_worker_0_slot_0(fault: str) -> None:
    """Every slot is scaled before the ring, so worker 0's own slot 0 already differs after round 0."""
    x = _random_input(3, 6, seed=44)
    assert _where("avg", fault, x) == ("reduce-scatter", 0, 0, 0)


@pytest.mark.clause("op-trace", "op-avg")
def test_avg_by_the_rounded_reciprocal_is_named_in_the_result() -> None:
    """Every chunk sums to 1 + 1 + 3 = 5 exactly; 5/3 and 5 x fl(1/3) differ in float32."""
    x = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])
    third = float(torch.tensor(1 / 3, dtype=torch.float32))
    quotient = torch.tensor(float(Fraction(5, 3)), dtype=torch.float64).to(torch.float32)
    assert float(torch.tensor(5.0) * torch.tensor(third)) != float(quotient)
    assert _where("avg", "reciprocal", x) == ("result", -1, None, 0)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.clause("op-trace", "op-avg")
def test_avg_divided_where_each_chunk_finishes_has_the_right_result_and_other_rounds(n: int) -> None:
    """The owner divides at the end of reduce-scatter (worker i owns chunk i + 1): the result's
    bits are the spec's, so output-only testing passes it, but round N - 2 differs at worker 0, slot 1."""
    x = _random_input(n, 2 * n, seed=45 + n)
    assert same_bits(op_ring(x, "avg", fault="divide-when-finished"), ring_fold_op(x, "avg"))
    assert _where("avg", "divide-when-finished", x) == ("reduce-scatter", n - 2, 0, 1)


@pytest.mark.clause("op-trace")
def test_the_checker_refuses_an_unknown_op() -> None:
    with pytest.raises(ValueError, match="unknown reduction op 'mean'"):
        first_mismatch(lambda t, cb: op_ring(t, "sum", cb), torch.ones(2, 2), "mean")


def test_the_default_op_is_sum() -> None:
    """An avg ring checked without ``op`` is checked as a sum: its result is the sum's half."""
    x = _random_input(2, 2, seed=46)
    mismatch = first_mismatch(lambda t, cb: op_ring(t, "avg", cb), x)
    assert isinstance(mismatch, Mismatch)
    assert (mismatch.phase, mismatch.slot) == ("result", 0)
    assert "clause op-avg" not in mismatch.reason
