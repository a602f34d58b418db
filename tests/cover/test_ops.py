"""Reduction operations beyond sum: every op is the fold of its combine, bit for bit (clauses ``op-*``)."""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

import numpy as np
import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from ring_ref import OPS, ring_all_reduce
from ring_ref._ops import COMMUTING_OPS, torch_combine, torch_combine_into
from tests.common.oracles import REDUCE_OPS, bits, ring_fold_op, same_bits
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
    """The distributed ring's two-rank swap relies on it (``ring_ref._ranks._transport.check_gloo``)."""
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


# ==========================================================================================================
# Choosing the op (clause ``op-choice``) and the ops' overflow and underflow (``op-prod``, ``input-finite``).
#
# What the fold tests leave open in ``ring_ref._ops``:
# every spelling the spec allows, the refusal naming every choice, and
# overflow/underflow giving the rounded result even when the caller has told
# numpy to raise on floating-point errors.
# ==========================================================================================================


X = [[1.0, -2.0], [3.0, 4.0]]
WANT = {"sum": [4.0, 2.0], "prod": [3.0, -8.0], "max": [3.0, 4.0], "min": [1.0, -2.0], "avg": [2.0, 1.0]}
CHOICES = (
    "choose one of sum, prod, max, min, avg (or torch.distributed.ReduceOp SUM, PRODUCT, MAX, MIN, AVG)."
)


@pytest.mark.clause("op-choice")
@pytest.mark.parametrize("op", list(WANT))
def test_every_spelling_of_an_op_gives_that_op(op: str) -> None:
    spellings: list[object] = [op, op.upper(), op.capitalize(), REDUCE_OPS[op]]
    for spelling in spellings:
        assert ring_all_reduce(torch.tensor(X), op=spelling).tolist() == WANT[op], spelling
        assert ring_all_reduce(np.array(X), op=spelling).tolist() == WANT[op], spelling


@pytest.mark.clause("op-choice")
def test_reduce_op_names_given_as_strings_are_accepted() -> None:
    for name in ("PRODUCT", "product"):
        assert ring_all_reduce(torch.tensor(X), op=name).tolist() == WANT["prod"]


@pytest.mark.clause("op-choice")
@pytest.mark.parametrize(
    "op", ["mean", "", "su", "PRODUC", dist.ReduceOp.BAND, dist.ReduceOp.PREMUL_SUM, 3, None]
)
def test_anything_else_is_refused_naming_every_choice(op: object) -> None:
    for x in (torch.tensor(X), np.array(X)):
        with pytest.raises(ValueError) as caught:
            ring_all_reduce(x, op=op)
        assert str(caught.value) == f"unknown reduction op {op!r}; {CHOICES}"


@pytest.mark.clause("input-finite", "op-prod", "op-avg")
@pytest.mark.parametrize(
    ("op", "rows", "dtype", "want"),
    [
        ("sum", [[65504.0], [65504.0]], np.float16, math.inf),
        ("avg", [[-65504.0], [-65504.0]], np.float16, -math.inf),
        ("prod", [[1e300], [-1e300]], np.float64, -math.inf),
        ("prod", [[1e-200], [1e-200]], np.float64, 0.0),
        ("prod", [[2.0**-14], [2.0**-14]], np.float16, 0.0),
    ],
)
def test_overflow_and_underflow_give_the_rounded_result_even_when_numpy_is_told_to_raise(
    op: str, rows: list[list[float]], dtype: type[np.floating[Any]], want: float
) -> None:
    array = np.repeat(np.array(rows, dtype=dtype), 2, axis=1)  # N = 2 workers of M = 2 rows
    with np.errstate(all="raise"):
        got = ring_all_reduce(array, op=op)
    assert got.dtype == array.dtype and got.tolist() == [want, want]
    assert ring_all_reduce(torch.from_numpy(array), op=op).tolist() == [want, want]


def _spec_combine(op: str, incoming: float, own: float) -> float:
    """What the receiver stores (clauses ``op-*``); the values below make sums and products exact."""
    if op in ("sum", "avg"):
        return incoming + own
    if op == "prod":
        return incoming * own
    keep_own = own > incoming if op == "max" else own < incoming
    return own if keep_own else incoming


@pytest.mark.clause("op-prod", "op-max", "op-min", "rs-add")
@pytest.mark.parametrize("op", list(WANT))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_in_place_combine_stores_what_the_receiver_stores_in_own(op: str, dtype: torch.dtype) -> None:
    """``torch_combine_into`` (the distributed ring's receive): the spec's rule's bits, stored in ``own``."""
    incoming_values = [1.0, -0.0, 0.0, 3.0, -2.5, 0.5, -0.0, 7.0]
    own_values = [2.0, 0.0, -0.0, 3.0, 1.5, -4.0, -0.0, -7.0]
    incoming = torch.tensor(incoming_values, dtype=dtype)
    own = torch.tensor(own_values, dtype=dtype)
    incoming_before = incoming.clone()
    want = torch.tensor(
        [_spec_combine(op, a, b) for a, b in zip(incoming_values, own_values, strict=True)], dtype=dtype
    )
    storage = own.untyped_storage().data_ptr()
    torch_combine_into(op)(incoming, own)  # type: ignore[arg-type]
    assert own.untyped_storage().data_ptr() == storage
    assert same_bits(own, want), (op, own, want)
    assert same_bits(incoming, incoming_before)
