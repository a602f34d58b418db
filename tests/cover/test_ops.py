"""Reduction operations beyond sum: every op is the fold of its combine, bit for bit (clauses ``op-*``)."""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from ring_ref import OPS, ring_all_reduce
from ring_ref._ops import COMMUTING_OPS, torch_combine
from tests.common.oracles import bits, ring_fold_op, same_bits
from tests.common.strategies import ALL_DTYPES, finite_values, worker_tensors


@pytest.mark.clause("op-prod", "op-max", "op-min", "op-avg", "op-choice")
@given(worker_tensors(max_n=6), st.sampled_from(OPS))
def test_every_op_is_the_fold_of_its_combine_bit_for_bit(x: torch.Tensor, op: str) -> None:
    want = ring_fold_op(x, op)
    got = ring_all_reduce(x, op=op)
    assert same_bits(got, want), (op, x, got, want)
    if x.dtype != torch.bfloat16:
        array = x.numpy()
        from_numpy = ring_all_reduce(array, op=op)
        assert from_numpy.dtype == array.dtype
        assert same_bits(torch.from_numpy(from_numpy), want), (op, from_numpy, want)


@pytest.mark.clause("op-max", "op-min")
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_max_and_min_keep_the_first_zero_in_fold_order(kind: str) -> None:
    # Worker 0 holds -0, worker 1 holds +0. Chunk 0 folds workers 0, 1; chunk 1 folds 1, 0.
    rows = [[-0.0, -0.0], [0.0, 0.0]]
    x: torch.Tensor | np.ndarray = torch.tensor(rows) if kind == "torch" else np.array(rows)
    for op in ("max", "min"):
        got = ring_all_reduce(x, op=op)
        signs = [float(np.copysign(1.0, float(v))) for v in got.tolist()]
        assert signs == [-1.0, 1.0], (kind, op, got)


@pytest.mark.clause("op-prod")
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_numpy_prod_that_overflows_then_meets_a_zero_is_nan_without_a_warning(
    engine: Literal["reference", "fast"],
) -> None:
    # Every chunk holds 1e300, 1e300 and 0 from workers 0, 1, 2: folded from worker c, chunk 0 meets
    # the zero last (inf * 0 = NaN), chunks 1 and 2 meet it before any overflow.
    x = np.array([[1e300] * 3, [1e300] * 3, [0.0] * 3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = ring_all_reduce(x, op="prod", engine=engine)
    assert same_bits(torch.from_numpy(got), ring_fold_op(torch.from_numpy(x), "prod"))
    assert np.isnan(got[0]) and got[1:].tolist() == [0.0, 0.0]


@st.composite
def finite_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Two equal-length tensors of finite values of one supported dtype, signed zeros included."""
    dtype = draw(st.sampled_from(ALL_DTYPES))
    values = st.one_of(st.sampled_from([0.0, -0.0]), finite_values(dtype))
    pairs = draw(st.lists(st.tuples(values, values), min_size=1, max_size=32))
    tensors = []
    for side in (0, 1):
        t = torch.tensor([p[side] for p in pairs], dtype=torch.float64).to(dtype)
        tensors.append(torch.where(torch.isfinite(t), t, torch.zeros((), dtype=dtype)))
    return tensors[0], tensors[1]


@pytest.mark.clause("op-choice")
@given(finite_pairs())
def test_the_commuting_ops_give_the_same_bits_with_their_inputs_swapped(
    pair: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """The distributed ring's two-rank swap relies on it (``ring_ref.distributed._check_gloo``)."""
    a, b = pair
    for op in COMMUTING_OPS:
        combine = torch_combine(op)
        assert same_bits(combine(a, b), combine(b, a)), (op, a, b)


@pytest.mark.clause("op-max", "op-min")
def test_max_and_min_are_not_commuting_ops() -> None:
    """Of -0.0 and +0.0 they keep the incoming one, so swapping them changes the sign of a zero."""
    minus, plus = torch.tensor([-0.0]), torch.tensor([0.0])
    for op in ("max", "min"):
        assert op not in COMMUTING_OPS
        combine = torch_combine(op)
        assert not same_bits(combine(minus, plus), combine(plus, minus)), op
    assert set(OPS) - COMMUTING_OPS == {"max", "min"}


@pytest.mark.clause("op-avg")
def test_avg_is_the_ring_sum_divided_once() -> None:
    x = torch.tensor([[1.0], [1.0], [3.0]], dtype=torch.float16).expand(3, 3).contiguous()
    got = ring_all_reduce(x, op="avg")
    assert got.tolist() == [1.6669921875] * 3  # 5 / 3 rounded once to float16
    divided_first = ring_all_reduce(x / 3, op="sum")
    assert divided_first.tolist() == [1.666015625] * 3  # not the same: N roundings more
    assert not same_bits(got, divided_first)


@pytest.mark.clause("op-choice")
def test_op_names_and_reduce_ops_are_accepted_and_others_refused() -> None:
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    for name, reduce_op in [
        ("sum", dist.ReduceOp.SUM),
        ("prod", dist.ReduceOp.PRODUCT),
        ("max", dist.ReduceOp.MAX),
        ("min", dist.ReduceOp.MIN),
        ("avg", dist.ReduceOp.AVG),
    ]:
        by_name = ring_all_reduce(x, op=name.upper())
        assert torch.equal(bits(by_name), bits(ring_all_reduce(x, op=reduce_op)))
    assert ring_all_reduce(x, op="prod").tolist() == [3.0, -8.0]
    assert ring_all_reduce(x, op="max").tolist() == [3.0, 4.0]
    assert ring_all_reduce(x, op="min").tolist() == [1.0, -2.0]
    assert ring_all_reduce(x, op="avg").tolist() == [2.0, 1.0]
    with pytest.raises(ValueError, match="unknown reduction op 'mean'; choose one of sum, prod"):
        ring_all_reduce(x, op="mean")
