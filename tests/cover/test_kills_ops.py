"""Choosing the op (clause ``op-choice``) and the ops' overflow and underflow (``op-prod``, ``input-finite``).

Written for the mutants of ``_ops.py`` the fold tests could not tell apart:
every spelling the spec allows, the refusal naming every choice, and
overflow/underflow giving the rounded result even when the caller has told
numpy to raise on floating-point errors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ring_ref import ring_all_reduce
from ring_ref._ops import torch_combine_into
from tests.common.oracles import REDUCE_OPS, same_bits

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
