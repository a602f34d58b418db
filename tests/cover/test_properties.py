"""Hypothesis property tests of ``ring_all_reduce`` and the core against independent oracles."""

from __future__ import annotations

import operator
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ring_ref import ring_all_reduce, schedule
from ring_ref.core import fold, initial_state, provenance_state, run_ring
from ring_ref.invariants import Provenance, State, is_complete
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, Phase
from tests.common.oracles import bits, exact_sum, ring_fold, same_bits
from tests.common.strategies import worker_tensors


@pytest.mark.clause("fold-order", "supported-dtypes", "chunk-layout", "output-shape", "n1-no-rounds")
@given(worker_tensors())
def test_bitwise_equal_to_the_closed_form_ring_fold(x: torch.Tensor) -> None:
    assert same_bits(ring_all_reduce(x), ring_fold(x))


@pytest.mark.clause("fold-order", "supported-dtypes", "preserve-dtype-device")
@given(worker_tensors(dtypes=(torch.float16, torch.float32, torch.float64)))
def test_numpy_input_gives_the_same_bits(x: torch.Tensor) -> None:
    array = x.numpy()
    result = ring_all_reduce(array)
    assert type(result) is np.ndarray and result.dtype == array.dtype
    assert same_bits(torch.from_numpy(result), ring_fold(x))


@pytest.mark.clause("input-unchanged", "no-aliasing", "preserve-dtype-device")
@given(worker_tensors())
def test_input_unchanged_and_result_owns_its_storage(x: torch.Tensor) -> None:
    before, stride = bits(x).clone(), x.stride()
    result = ring_all_reduce(x)
    assert torch.equal(bits(x), before) and x.stride() == stride
    assert (result.dtype, result.device) == (x.dtype, x.device)
    base = x.untyped_storage()
    start, end = base.data_ptr(), base.data_ptr() + base.nbytes()
    assert not start <= result.untyped_storage().data_ptr() < end
    result.fill_(1.0)
    assert torch.equal(bits(x), before)


@pytest.mark.clause("autograd")
@given(worker_tensors(max_n=8))
def test_gradient_of_the_sum_is_all_ones(x: torch.Tensor) -> None:
    leaf = x.detach().clone().requires_grad_(True)
    result = ring_all_reduce(leaf)
    assert result.requires_grad
    result.sum().backward()  # type: ignore[no-untyped-call]
    assert leaf.grad is not None
    assert torch.equal(leaf.grad, torch.ones_like(leaf))


@pytest.mark.clause("sum-not-mean", "fold-order")
@given(st.integers(1, 12), st.data())
def test_core_on_exact_rationals_gives_the_exact_sum(n: int, data: st.DataObject) -> None:
    cell = st.fractions(min_value=-(10**6), max_value=10**6, max_denominator=10**6)
    x = [[data.draw(cell) for _ in range(n)] for _ in range(n)]
    final = run_ring(initial_state(x), operator.add)
    totals = [sum((x[w][c] for w in range(n)), Fraction(0)) for c in range(n)]
    assert all(list(row) == totals for row in final)


@pytest.mark.clause("inv-finished-chunks", "ag-complete")
@pytest.mark.parametrize("n", range(1, 17))
def test_provenance_run_ends_with_every_chunk_complete_in_ring_order(n: int) -> None:
    final = run_ring(provenance_state(n), fold)
    for row in final:
        for c, p in enumerate(row):
            assert is_complete(p, n)
            assert p == tuple((c + k) % n for k in range(n))


@pytest.mark.clause("no-shortcut", "rs-add")
@given(worker_tensors(max_n=10, dtypes=(torch.float64,), layouts=("contiguous",)))
def test_exactly_n_times_n_minus_1_chunk_additions(x: torch.Tensor) -> None:
    n, m = x.shape[0], x.shape[1]
    chunk_shape = (m // n, *x.shape[2:])
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def counting_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append((tuple(a.shape), tuple(b.shape)))
        return torch.add(a, b)

    run_ring(initial_state([torch.split(x[i], m // n) for i in range(n)]), counting_add)
    assert len(calls) == n * (n - 1)
    assert all(shapes == (chunk_shape, chunk_shape) for shapes in calls)


@pytest.mark.clause("traffic", "round-count", "simultaneous-rounds", "ag-copy-not-add")
@given(st.integers(1, 12), st.integers(1, 3))
def test_each_worker_receives_one_chunk_per_round(n: int, rows_per_chunk: int) -> None:
    """Count what crosses each link: one chunk of S/N elements per worker per round."""
    m = n * rows_per_chunk
    x = torch.arange(n * m, dtype=torch.float64).reshape(n, m)
    start = initial_state([torch.split(x[i], rows_per_chunk) for i in range(n)])
    history: list[tuple[Phase, int, State[torch.Tensor], State[Provenance]]] = []
    run_ring(start, torch.add, lambda phase, r, s, p: history.append((phase, r, s, p)))
    assert [(h[0], h[1]) for h in history] == [(REDUCE_SCATTER, r) for r in range(n - 1)] + [
        (ALL_GATHER, r) for r in range(n - 1)
    ]
    received = [0] * n
    before = start
    for phase, _r, after, _p in history:
        for i in range(n):
            changed = [c for c in range(n) if after[i][c] is not before[i][c]]
            assert len(changed) == 1, (phase, i, changed)
            c = changed[0]
            received[i] += after[i][c].numel()
            if phase == ALL_GATHER:
                # A copy of what the left neighbour held at the start of the round.
                assert after[i][c] is before[(i - 1) % n][c]
        before = after
    s = m
    assert received == [2 * (n - 1) * s // n] * n
    assert received == [schedule.elements_sent_per_worker(n, s)] * n


@pytest.mark.clause("sum-not-mean")
@given(worker_tensors(dtypes=(torch.float64,), values=st.integers(-(2**20), 2**20).map(float)))
def test_small_integers_sum_exactly(x: torch.Tensor) -> None:
    expected = exact_sum(x)
    assert [Fraction(v) for v in ring_all_reduce(x).reshape(-1).tolist()] == expected
