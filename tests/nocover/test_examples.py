"""Example-based tests of the public entry point and the core on small, hand-checked cases."""

from __future__ import annotations

import operator

import numpy as np
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref.core import initial_state, run_ring
from ring_ref.invariants import Provenance, State
from ring_ref.schedule import Phase
from tests.common.oracles import ring_fold, same_bits


@pytest.mark.clause("worked-example", "rs-owned-chunk", "ag-complete")
def test_worked_example_round_by_round() -> None:
    seen: list[tuple[Phase, int, State[float]]] = []

    def observe(phase: Phase, r: int, state: State[float], _prov: State[Provenance]) -> None:
        seen.append((phase, r, state))

    final = run_ring(initial_state([[1.0, 2.0], [3.0, 4.0]]), operator.add, observe)
    assert seen == [
        ("reduce-scatter", 0, ((1.0, 6.0), (4.0, 4.0))),
        ("all-gather", 0, ((4.0, 6.0), (4.0, 6.0))),
    ]
    assert final == ((4.0, 6.0), (4.0, 6.0))


@pytest.mark.clause("worked-example", "sum-not-mean", "return-worker-zero")
@pytest.mark.parametrize(
    "x",
    [torch.tensor([[1.0, 2.0], [3.0, 4.0]]), np.array([[1.0, 2.0], [3.0, 4.0]])],
    ids=["torch", "numpy"],
)
def test_worked_example_result(x: torch.Tensor | np.ndarray) -> None:
    assert ring_all_reduce(x).tolist() == [4.0, 6.0]


@pytest.mark.clause("return-worker-zero", "ag-complete")
def test_every_worker_ends_with_the_same_buffer_and_worker_zero_is_returned() -> None:
    x = torch.randn(5, 10, dtype=torch.float64)
    final = run_ring(initial_state([torch.split(x[i], 2) for i in range(5)]), torch.add)
    rows = [torch.cat(row) for row in final]
    for row in rows[1:]:
        assert same_bits(row, rows[0])
    assert same_bits(ring_all_reduce(x), rows[0])


@pytest.mark.clause("n1-no-rounds", "no-aliasing")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_single_worker_runs_no_rounds_and_returns_a_copy(dtype: torch.dtype) -> None:
    x = torch.tensor([[[1.5, -2.0], [0.25, 3.0], [-0.0, 7.0]]], dtype=dtype)
    rounds: list[tuple[Phase, int]] = []
    run_ring(initial_state([[x[0]]]), torch.add, lambda phase, r, _s, _p: rounds.append((phase, r)))
    assert rounds == []
    result = ring_all_reduce(x)
    assert same_bits(result, x[0])
    assert result.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    result.add_(1)
    assert x[0, 0, 0].item() == 1.5


@pytest.mark.clause("output-shape", "chunk-layout")
@pytest.mark.parametrize("trailing", [(), (3,), (2, 3), (1, 2, 2)])
def test_trailing_dimensions_are_kept(trailing: tuple[int, ...]) -> None:
    x = torch.randn(3, 6, *trailing)
    result = ring_all_reduce(x)
    assert result.shape == (6, *trailing)
    assert same_bits(result, ring_fold(x))


@pytest.mark.clause("chunk-layout")
def test_chunks_are_leading_axis_row_blocks() -> None:
    # Worker i holds 1 in row block i only: chunk c of the result must then be
    # exactly the rows c*M/N .. (c+1)*M/N - 1, summed over one worker.
    n, k = 4, 2
    x = torch.zeros(n, n * k, 3)
    for i in range(n):
        x[i, i * k : (i + 1) * k] = i + 1
    result = ring_all_reduce(x)
    for c in range(n):
        assert torch.equal(result[c * k : (c + 1) * k], torch.full((k, 3), float(c + 1)))


@pytest.mark.clause("sum-not-mean", "output-shape")
def test_result_is_a_sum_not_a_mean_or_a_stack() -> None:
    x = torch.ones(4, 8)
    result = ring_all_reduce(x)
    assert result.shape == (8,)
    assert torch.equal(result, torch.full((8,), 4.0))


@pytest.mark.clause("input-finite")
def test_sums_may_overflow_to_infinity_in_the_input_dtype() -> None:
    x = torch.tensor([[65504.0], [65504.0]], dtype=torch.float16).expand(2, 2).contiguous()
    result = ring_all_reduce(x)
    assert torch.isinf(result).all() and bool((result > 0).all())


@pytest.mark.clause("fold-order")
def test_ring_order_is_observable_in_float16() -> None:
    # 2048 + 1 + 1 in float16: (2048 + 1) rounds to 2048 (ties to even), so a
    # left fold starting at 2048 loses both ones, while (1 + 1) + 2048 = 2050.
    x = torch.tensor([[2048.0, 1.0, 1.0]], dtype=torch.float16).T.expand(3, 3).contiguous()
    result = ring_all_reduce(x)
    # chunk 0 folds workers 0,1,2 = 2048+1+1; chunk 1 folds 1,2,0 = 1+1+2048.
    assert result.tolist() == [2048.0, 2050.0, 2048.0]
    assert torch.sum(x, 0).tolist() != result.tolist()


@pytest.mark.clause("preserve-dtype-device")
def test_numpy_result_is_a_numpy_array_of_the_same_dtype() -> None:
    for dtype in (np.float16, np.float32, np.float64):
        x = np.arange(12, dtype=dtype).reshape(3, 4, 1)[:, :3]
        result = ring_all_reduce(x)
        assert type(result) is np.ndarray
        assert result.dtype == dtype
        assert result.shape == (3, 1)
        assert not np.shares_memory(result, x)
