"""The adapters' refusals (``ring_ref._torch_adapter``, ``_numpy_adapter``): the bad-input table's words.

Each case states the whole message (or its distinctive parts) as the spec's
``bad-input`` table words it, for the torch and numpy entry points and for one
rank's tensor of the distributed ring (``rank_tensor_problem``, pure and
in-process).
"""

from __future__ import annotations

import re
from typing import Literal

import numpy as np
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._ranks._rules import rank_tensor_problem
from ring_ref._torch_adapter import chunk_state
from ring_ref._validate import check_ring_size
from ring_ref.schedule import RingSchedule

pytestmark = pytest.mark.clause("bad-input", "input-finite", "supported-dtypes", "input-shape")

Engine = Literal["reference", "fast"]
ENGINES: tuple[Engine, ...] = ("reference", "fast")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_list_gets_the_stack_hint_and_other_objects_do_not(engine: Engine) -> None:
    with pytest.raises(TypeError) as listed:
        ring_all_reduce([[1.0, 2.0], [3.0, 4.0]], engine=engine)  # type: ignore[call-overload]
    assert str(listed.value) == (
        "ring_all_reduce expects worker_tensors as one torch.Tensor or numpy.ndarray of shape "
        "(N, M, ...); got list. Stack the per-worker tensors first, e.g. torch.stack(tensors)."
    )
    with pytest.raises(TypeError) as other:
        ring_all_reduce("x", engine=engine)  # type: ignore[call-overload]
    assert str(other.value).endswith("; got str.")


@pytest.mark.parametrize("engine", ENGINES)
def test_integer_dtypes_are_refused_naming_the_dtype_and_the_cast(engine: Engine) -> None:
    with pytest.raises(TypeError, match=r"^unsupported dtype torch\.int32; the ring sums floating-point"):
        ring_all_reduce(torch.ones(2, 2, dtype=torch.int32), engine=engine)
    with pytest.raises(TypeError, match=r"^unsupported dtype int64; .*\(numpy\.float16, float32, float64\)"):
        ring_all_reduce(np.ones((2, 2), dtype=np.int64), engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_sparse_tensor_is_refused_as_not_dense(engine: Engine) -> None:
    with pytest.raises(TypeError, match=r"dense strided tensor; got layout torch\.sparse_coo\. Convert"):
        ring_all_reduce(torch.ones(2, 2).to_sparse(), engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_masked_array_is_refused_as_a_subclass(engine: Engine) -> None:
    with pytest.raises(TypeError, match=r"^worker_tensors is a MaskedArray, an ndarray subclass"):
        ring_all_reduce(np.ma.masked_array(np.ones((2, 2))), engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ((0, 4), "N = 0 workers (shape (0, 4)); the ring needs at least one."),
        ((2, 0), "M = 0 rows (shape (2, 0)); M must be positive."),
        ((2, 4, 0), "trailing dimensions must be positive; got shape (2, 4, 0). Drop the empty dimension."),
        (
            (3, 4),
            "M = 4 is not divisible by N = 3, so the 3 chunks cannot be equal. Pad M to a multiple "
            "of 3 (e.g. 6), or use a ring whose layout takes any M: schedule='openmpi-ring' or "
            "schedule='gloo'.",
        ),
    ],
)
def test_shape_messages_word_for_word(engine: Engine, shape: tuple[int, ...], words: str) -> None:
    for x in (torch.ones(shape), np.ones(shape)):
        with pytest.raises(ValueError) as caught:
            ring_all_reduce(x, engine=engine)
        assert str(caught.value) == words


@pytest.mark.parametrize("engine", ENGINES)
def test_non_finite_count_and_first_index_with_bad_elements_in_several_workers(engine: Engine) -> None:
    """The count is every bad element; the first is in row-major order over (worker, row, ...)."""
    for make in (torch.zeros, np.zeros):
        x = make((4, 4, 2))
        x[3, 0, 0] = float("nan")
        x[2, 3, 1] = float("inf")
        x[2, 1, 1] = float("-inf")
        x[3, 3, 1] = float("nan")
        with pytest.raises(ValueError) as caught:
            ring_all_reduce(x, engine=engine)
        assert str(caught.value) == (
            "inputs must be finite: 4 element(s) are NaN or infinite, the first at index (2, 1, 1). "
            "Clean or mask them before the all-reduce."
        )


def test_one_rank_tensor_gets_the_same_words_plus_its_own_rows() -> None:
    problem = rank_tensor_problem([1.0], 2, "gloo")
    assert problem is not None
    assert (problem.kind, problem.message) == (
        TypeError,
        "expects a torch.Tensor of shape (M, ...); got list.",
    )
    zero_d = rank_tensor_problem(torch.tensor(1.0), 2, "gloo")
    assert zero_d is not None
    assert zero_d.message == "needs a tensor of shape (M, ...) with at least 1 dimension; got a 0-d tensor."
    shared = rank_tensor_problem(torch.zeros(1).expand(4), 2, "gloo")
    assert shared is not None
    assert shared.kind is ValueError
    assert "(strides (0,)) lets elements share memory" in shared.message
    device = rank_tensor_problem(torch.zeros(4), 2, "nccl")
    assert device is not None
    assert device.message == "the nccl backend needs cuda tensors; got a cpu tensor."
    bad = torch.zeros(4)
    bad[1] = float("nan")
    found = rank_tensor_problem(bad, 2, "gloo")
    assert found is not None
    assert "1 element(s) are NaN or infinite, the first at index (1,)" in found.message
    assert rank_tensor_problem(bad, 2, "gloo", finite=False) is None
    assert rank_tensor_problem(torch.zeros(4), 2, "unknown-backend") is None


def test_ring_size_alone_is_checked_like_a_stacked_input() -> None:
    check_ring_size(3, 6)
    with pytest.raises(ValueError, match=re.escape("M = 5 is not divisible by N = 2")):
        check_ring_size(2, 5)
    with pytest.raises(ValueError, match=re.escape("N = 0 workers (shape (0, 4))")):
        check_ring_size(0, 4)


@pytest.mark.clause("chunk-layout", "schedule-layouts")
def test_the_torch_adapters_chunks_are_row_block_views_for_the_even_layout_only() -> None:
    """``even``: chunk ``c`` of worker ``i`` views rows ``c M/N .. (c+1) M/N - 1``, trailing axes whole."""
    x = torch.arange(3 * 6 * 2, dtype=torch.float32).reshape(3, 6, 2)[:, :, :1]  # not contiguous
    state = chunk_state(x)
    for i in range(3):
        for c in range(3):
            chunk = state[i][c]
            assert chunk.shape == (2, 1)
            assert torch.equal(chunk, x[i, 2 * c : 2 * c + 2])
            assert chunk.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    flat = chunk_state(x.contiguous(), RingSchedule(1, 0, "blocks"))
    assert [tuple(chunk.shape) for chunk in flat[0]] == [(2,), (2,), (2,)]
