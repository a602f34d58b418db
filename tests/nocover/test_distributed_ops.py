"""``ring_all_reduce_(tensor, op=...)`` on gloo ranks: each op gives the simulation's bits on every rank."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from ring_ref import OPS, ring_all_reduce
from ring_ref._processes._gloo import ProcessRing
from ring_ref.distributed import ring_all_reduce_
from tests.common.oracles import ring_fold_op, same_bits

N = 3
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def reduce_with_ops(rank: int, _n: int, cases: list[tuple[torch.Tensor, object]]) -> list[torch.Tensor]:
    """On each rank: reduce a copy of ``x[rank]`` in place with each case's op."""
    out = []
    for x, op in cases:
        mine = x[rank].clone()
        ring_all_reduce_(mine, op=op)
        out.append(mine)
    return out


def reject(rank: int, _n: int, ops: list[object]) -> str:
    """On each rank: the error for this rank's op (``ops[rank]``)."""
    try:
        ring_all_reduce_(torch.ones(6), op=ops[rank])
    except (TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


@pytest.fixture(scope="module")
def ring() -> Iterator[ProcessRing]:
    with ProcessRing(N) as r:
        yield r


@pytest.mark.clause("op-prod", "op-max", "op-min", "op-avg")
def test_every_op_on_every_rank_equals_the_simulation(ring: ProcessRing) -> None:
    gen = torch.Generator().manual_seed(17)
    cases: list[tuple[torch.Tensor, object]] = []
    for dtype in DTYPES:
        for name in OPS:
            x = (torch.randn(N, 2 * N, 2, generator=gen) * 3).to(dtype)
            x[0, 0, 0], x[1, 0, 0] = -0.0, 0.0  # the signed-zero rule of max and min
            cases.append((x, name))
    cases.append((cases[0][0], dist.ReduceOp.PRODUCT))
    per_rank = ring.run(reduce_with_ops, cases, timeout_s=120)
    for k, (x, op) in enumerate(cases):
        want = ring_all_reduce(x, op=op)
        assert same_bits(want, ring_fold_op(x, op if isinstance(op, str) else "prod"))
        for rank in range(N):
            assert same_bits(per_rank[rank][k], want), (rank, op, x.dtype)


@pytest.mark.clause("op-choice", "bad-input")
def test_an_unknown_or_differing_op_is_refused_on_every_rank(ring: ProcessRing) -> None:
    unknown_ops: list[object] = ["sum", "mean", "sum"]
    unknown = ring.run(reject, unknown_ops, timeout_s=120)
    assert len(set(unknown)) == 1 and "rank 1: unknown reduction op 'mean'" in unknown[0], unknown
    differing_ops: list[object] = ["sum", "max", "sum"]
    differing = ring.run(reject, differing_ops, timeout_s=120)
    assert len(set(differing)) == 1 and "the same op" in differing[0], differing
    assert "op 'max'" in differing[0]
