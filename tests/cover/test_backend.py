"""``ring_ref._ranks._backend`` in one process: the order a group agrees on, and the ops it refuses.

The group's store is a ``HashStore`` that the test fills with the other ranks' answers, so one
process plays every rank in turn; the backend on real ranks is ``nocover/test_backend.py``.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore, _make_nccl_premul_sum

from ring_ref._ranks._backend import ORDER_ENV, RingRefOptions, _op_of, _order_text, agree_on_order


def agree(asked: list[str]) -> list[str]:
    """Every rank's outcome: the agreed order, or the error's text."""
    outcomes = []
    for rank in range(len(asked)):
        store = HashStore()
        for other, order in enumerate(asked):
            if other != rank:
                store.set(f"order/{other}", order)
        try:
            outcomes.append(agree_on_order(store, rank, len(asked), asked[rank]))
        except ValueError as exc:
            outcomes.append(f"ValueError: {exc}")
    return outcomes


@pytest.mark.clause("backend-order")
def test_every_rank_gets_the_order_all_asked_for() -> None:
    assert agree(["chain"] * 3) == ["chain"] * 3
    assert agree(["openmpi-ring"] * 2) == ["openmpi-ring"] * 2


@pytest.mark.clause("backend-order")
def test_differing_orders_are_refused_naming_every_rank() -> None:
    outcomes = agree(["spec", "chain", "spec"])
    assert len(set(outcomes)) == 1, outcomes
    assert "rank 0: 'spec'; rank 1: 'chain'; rank 2: 'spec'" in outcomes[0]
    assert ORDER_ENV in outcomes[0]


@pytest.mark.clause("backend-order")
def test_an_unknown_order_is_refused_with_the_choices() -> None:
    outcomes = agree(["ring", "ring"])
    assert outcomes[0] == outcomes[1]
    assert "unknown order 'ring'" in outcomes[0] and "'spec', 'openmpi-ring', 'gloo', 'chain'" in outcomes[0]


@pytest.mark.clause("backend-order")
def test_the_options_come_before_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ORDER_ENV, raising=False)
    assert _order_text(None) == "spec"
    monkeypatch.setenv(ORDER_ENV, "")
    assert _order_text(RingRefOptions()) == "spec"
    monkeypatch.setenv(ORDER_ENV, "chain")
    assert _order_text(None) == "chain"
    assert _order_text(RingRefOptions(order="gloo")) == "gloo"
    assert "not ring_ref.distributed.RingRefOptions" in _order_text(object())


@pytest.mark.clause("backend-reductions")
def test_premul_sum_is_refused_with_the_fix() -> None:
    opts = dist.AllreduceOptions()
    opts.reduceOp = _make_nccl_premul_sum(2.0)
    with pytest.raises(ValueError, match=r"PREMUL_SUM .* scale the tensor first"):
        _op_of(opts)
    opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
    assert _op_of(opts) == "max"  # by name: the ring's per-call cache keys on it
    opts.reduceOp = dist.ReduceOp(dist.ReduceOp.BAND)
    assert _op_of(opts) == dist.ReduceOp.BAND  # no op of the ring's: its check refuses it on every rank
