"""The trace-level differential check (ring_ref._tracecheck) against implementations written here.

``plain_ring`` is an independent ring on stacked ``(N, M, ...)`` buffers, with
the schedule typed in from the spec (not imported from ``ring_ref``); its
switches plant the faults.  The expected location of each fault's first
difference is derived by hand from the spec in the test's docstring.
"""

from __future__ import annotations

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
)
from ring_ref.testing import assert_matches_reference
from tests.common.oracles import ring_fold, same_bits
from tests.common.strategies import worker_tensors


def plain_ring(
    x: torch.Tensor,
    on_round: RoundCallback,
    *,
    extra_rs_round: bool = False,
    report_extra: bool = True,
    ag_adds: bool = False,
) -> torch.Tensor:
    """Ring all-reduce on one ``(N, M, ...)`` buffer tensor, reporting after every round.

    ``extra_rs_round`` runs reduce-scatter round ``N - 1`` too; ``report_extra``
    says whether that round is reported on its own (otherwise the state after it
    is reported as round ``N - 2``); ``ag_adds`` makes all-gather add.
    """
    n, m = x.shape[0], x.shape[1]
    k = m // n
    buf = x.detach().clone()
    rs_rounds = n if extra_rs_round and n > 1 else n - 1

    def rows(c: int) -> slice:
        return slice(c * k, (c + 1) * k)

    for r in range(rs_rounds):
        old = buf.clone()
        for i in range(n):
            src = (i - 1) % n
            c = (src - r) % n
            buf[i, rows(c)] = old[src, rows(c)] + old[i, rows(c)]
        if report_extra:
            on_round("reduce-scatter", r, buf)
        elif r != n - 2:
            on_round("reduce-scatter", min(r, n - 2), buf)
    for r in range(n - 1):
        old = buf.clone()
        for i in range(n):
            src = (i - 1) % n
            c = (src + 1 - r) % n
            buf[i, rows(c)] = old[src, rows(c)] + old[i, rows(c)] if ag_adds else old[src, rows(c)]
        on_round("all-gather", r, buf)
    return buf[0].clone()


def _random_input(n: int, m: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand((n, m), generator=gen, dtype=torch.float64) * 8 + 1).to(dtype)


def located(fn: TracedImplementation, x: torch.Tensor) -> Mismatch:
    """The first mismatch, which must exist."""
    mismatch = first_mismatch(fn, x)
    assert mismatch is not None, "the trace check found no difference"
    return mismatch


@settings(max_examples=20)
@given(worker_tensors())
@pytest.mark.clause("simultaneous-rounds", "rs-add", "ag-copy-not-add", "fold-order")
def test_a_correct_ring_passes_round_by_round(x: torch.Tensor) -> None:
    assert first_mismatch(plain_ring, x) is None
    check_trace(plain_ring, x)


@pytest.mark.parametrize("n", [2, 3, 4, 7])
@pytest.mark.clause("round-count")
def test_extra_reduce_scatter_round_is_named_while_the_output_is_right(n: int) -> None:
    """Round N - 1 of reduce-scatter: worker i adds its left neighbour's chunk i, the full sum,
    into its own slot i -- which all-gather round 0 overwrites, so the output is right."""
    x = _random_input(n, 2 * n, seed=n)
    out = plain_ring(x, lambda *_: None, extra_rs_round=True)
    assert same_bits(out, ring_fold(x)), "the planted fault must leave the output right"
    mismatch = located(lambda t, cb: plain_ring(t, cb, extra_rs_round=True), x)
    assert (mismatch.phase, mismatch.round, mismatch.worker, mismatch.slot) == (
        "reduce-scatter",
        n - 1,
        None,
        None,
    )
    assert "unexpected round" in mismatch.reason
    with pytest.raises(TraceMismatch, match=f"reduce-scatter round {n - 1}"):
        check_trace(lambda t, cb: plain_ring(t, cb, extra_rs_round=True), x)


@pytest.mark.clause("round-count", "fold-order")
def test_output_only_difftest_passes_the_extra_round_that_the_trace_check_names() -> None:
    """The acceptance case: the output-only tester, in exact (bitwise) mode, sees nothing wrong."""
    report = assert_matches_reference(
        lambda t: plain_ring(t, lambda *_: None, extra_rs_round=True), mode="exact", examples=40, seed=3
    )
    assert report.verdict == "pass"
    assert report.modes["exact"].examples >= 40
    x = _random_input(4, 8, seed=11)
    with pytest.raises(TraceMismatch, match="at reduce-scatter round 3: unexpected round"):
        check_trace(lambda t, cb: plain_ring(t, cb, extra_rs_round=True), x)


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.clause("inv-rs-provenance")
def test_an_unreported_extra_round_is_found_in_worker_0_slot_0(n: int) -> None:
    """Reported as round N - 2, the extra round's damage is slot i of worker i; worker 0 comes first."""
    x = _random_input(n, n, seed=20 + n)
    mismatch = located(lambda t, cb: plain_ring(t, cb, extra_rs_round=True, report_extra=False), x)
    assert (mismatch.phase, mismatch.round, mismatch.worker, mismatch.slot) == ("reduce-scatter", n - 2, 0, 0)


@pytest.mark.parametrize("n", [2, 4, 6])
@pytest.mark.clause("ag-copy-not-add")
def test_adding_in_all_gather_is_named_at_its_first_round(n: int) -> None:
    """All-gather round 0: worker 0 receives chunk 0 from worker n-1 and adds it to its own value."""
    x = _random_input(n, 3 * n, seed=30 + n)
    mismatch = located(lambda t, cb: plain_ring(t, cb, ag_adds=True), x)
    assert (mismatch.phase, mismatch.round, mismatch.worker, mismatch.slot) == ("all-gather", 0, 0, 0)
    assert "element 0 of the slot" in mismatch.reason


def test_missing_reports_name_the_first_missing_round() -> None:
    x = _random_input(3, 3, seed=4)

    def first_two_only(t: torch.Tensor, cb: RoundCallback) -> torch.Tensor:
        calls = 0

        def limited(phase: str, r: int, b: torch.Tensor) -> None:
            nonlocal calls
            calls += 1
            if calls <= 2:
                cb(phase, r, b)

        return plain_ring(t, limited)

    mismatch = located(first_two_only, x)
    assert (mismatch.phase, mismatch.round) == ("all-gather", 0)
    assert "reported 2 of the reference's 4 rounds" in mismatch.reason


def test_a_wrong_result_with_a_right_trace_is_named_as_the_result() -> None:
    x = _random_input(4, 4, seed=5)

    def halves(t: torch.Tensor, cb: RoundCallback) -> torch.Tensor:
        return plain_ring(t, cb) / 2

    mismatch = located(halves, x)
    assert (mismatch.phase, mismatch.worker, mismatch.slot) == ("result", None, 0)


def test_wrong_buffer_shape_is_named_with_its_round() -> None:
    x = _random_input(2, 2, seed=6)

    def worker_zero_only(t: torch.Tensor, cb: RoundCallback) -> torch.Tensor:
        return plain_ring(t, lambda phase, r, b: cb(phase, r, b[0]))

    mismatch = located(worker_zero_only, x)
    assert (mismatch.phase, mismatch.round, mismatch.worker) == ("reduce-scatter", 0, None)
    assert "buffers are (2,)" in mismatch.reason


@pytest.mark.clause("n1-no-rounds")
def test_one_worker_must_report_no_round() -> None:
    x = _random_input(1, 2, seed=7)

    def reports_anyway(t: torch.Tensor, cb: RoundCallback) -> torch.Tensor:
        cb("reduce-scatter", 0, t.clone())
        return t[0].clone()

    assert first_mismatch(plain_ring, x) is None
    mismatch = located(reports_anyway, x)
    assert (mismatch.phase, mismatch.round) == ("reduce-scatter", 0)
    assert "extra round" in mismatch.reason


def test_reports_are_copied_when_made() -> None:
    """plain_ring keeps updating the tensor it reported; the check must see each round's values."""
    x = _random_input(4, 4, seed=8)
    assert first_mismatch(plain_ring, x) is None


def test_buffers_that_are_not_tensors_are_rejected_clearly() -> None:
    x = _random_input(2, 2, seed=9)

    def lists(t: torch.Tensor, cb: RoundCallback) -> torch.Tensor:
        return plain_ring(t, lambda phase, r, b: cb(phase, r, b.tolist()))  # type: ignore[arg-type]

    with pytest.raises(TypeError, match=r"expects buffers as a torch\.Tensor"):
        first_mismatch(lists, x)


def test_invalid_input_is_rejected_before_running_the_implementation() -> None:
    with pytest.raises(ValueError, match="not divisible"):
        first_mismatch(plain_ring, torch.ones(3, 4))


def test_results_of_the_wrong_kind_or_shape_are_named() -> None:
    x = _random_input(2, 4, seed=10)

    def as_list(t: torch.Tensor, cb: RoundCallback) -> torch.Tensor:
        return plain_ring(t, cb).tolist()  # type: ignore[return-value]

    with pytest.raises(TypeError, match="must return a torch"):
        first_mismatch(as_list, x)
    mismatch = located(lambda t, cb: plain_ring(t, cb)[None], x)
    assert (mismatch.phase, mismatch.worker, mismatch.slot) == ("result", None, None)
    assert "result is (1, 4)" in mismatch.reason
