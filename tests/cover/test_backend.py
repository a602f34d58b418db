"""``ring_ref._ranks._backend`` in one process: the order a group agrees on, and the ops it refuses.

The group's store is a ``HashStore`` that the test fills with the other ranks' answers, so one
process plays every rank in turn; the backend on real ranks is ``nocover/test_backend.py``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import HashStore, _make_nccl_premul_sum
from torch.distributed import distributed_c10d
from torch.distributed.distributed_c10d import _coalescing_manager

from ring_ref._ranks._backend import (
    ORDER_ENV,
    RingRefOptions,
    _op_of,
    _order_text,
    agree_on_order,
    on_cpu,
)


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
    refused = (
        "ValueError: ring_ref backend: every rank of a group must choose the same order; got rank 0: "
        "'spec'; rank 1: 'chain'; rank 2: 'spec'. Set RING_REF_ORDER alike on every rank (torchrun passes "
        "its environment on) or pass the same RingRefOptions(order=...)."
    )
    assert outcomes == [refused] * 3


@pytest.mark.clause("backend-order")
def test_an_unknown_order_is_refused_with_the_choices() -> None:
    outcomes = agree(["ring", "ring"])
    refused = (
        "ValueError: ring_ref backend: unknown order 'ring' (from RingRefOptions(order=...) or "
        "RING_REF_ORDER); choose one of 'spec', 'openmpi-ring', 'gloo', 'chain', 'mpich-ring', "
        "'intel-ring', 'mlx-ring', 'recursive-doubling'."
    )
    assert outcomes == [refused] * 2


@pytest.mark.clause("backend-order")
def test_the_options_come_before_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ORDER_ENV, raising=False)
    assert _order_text(None) == "spec"
    monkeypatch.setenv(ORDER_ENV, "")
    assert _order_text(RingRefOptions()) == "spec"
    monkeypatch.setenv(ORDER_ENV, "chain")
    assert _order_text(None) == "chain"
    assert _order_text(RingRefOptions(order="gloo")) == "gloo"
    assert _order_text(object()) == "<pg_options of type object, not ring_ref.distributed.RingRefOptions>"
    assert _order_text(3) == "<pg_options of type int, not ring_ref.distributed.RingRefOptions>"


@pytest.mark.clause("backend-reductions")
def test_premul_sum_is_refused_with_the_fix() -> None:
    opts = dist.AllreduceOptions()
    opts.reduceOp = _make_nccl_premul_sum(2.0)
    with pytest.raises(ValueError) as raised:
        _op_of(opts)
    assert str(raised.value) == (
        "ring_ref backend: ReduceOp.PREMUL_SUM (a sum of pre-scaled tensors) is not one of the ring's ops; "
        "scale the tensor first (tensor.mul_(factor)) and reduce with SUM, or use AVG."
    )
    opts.reduceOp = dist.ReduceOp(dist.ReduceOp.MAX)
    assert _op_of(opts) == "max"  # by name: the ring's per-call cache keys on it
    opts.reduceOp = dist.ReduceOp(dist.ReduceOp.BAND)
    assert _op_of(opts) == dist.ReduceOp.BAND  # no op of the ring's: its check refuses it on every rank


@pytest.mark.clause("backend-devices")
def test_a_reduction_of_a_tensor_off_the_cpu_is_refused_with_the_fix() -> None:
    # torch hands a Python group every device's tensors; the meta device stands in for CUDA here
    with pytest.raises(ValueError) as raised:
        on_cpu(torch.ones(2), torch.ones(2, device="meta"))
    assert str(raised.value) == (
        "ring_ref backend: reductions run on CPU tensors only; got a tensor on meta. Move it to the CPU "
        "(tensor.cpu()) and back, or, for CUDA tensors in the same order, call "
        "ring_ref.distributed.ring_all_reduce_(tensor, group=...) on an NCCL group; the backend does not "
        "route CUDA tensors to NCCL."
    )
    on_cpu(torch.ones(2), torch.zeros((), dtype=torch.float64))  # CPU tensors pass


@pytest.mark.clause("backend-devices")
def test_every_reduction_of_a_one_rank_group_refuses_a_tensor_off_the_cpu() -> None:
    dist.init_process_group("ring_ref", store=HashStore(), rank=0, world_size=1)
    try:
        meta = torch.ones(4, device="meta")
        calls: list[Callable[[], object]] = [
            lambda: dist.all_reduce(meta),
            lambda: dist.reduce(meta, dst=0),
            lambda: dist.reduce_scatter_single(torch.empty(4, device="meta"), meta),
        ]
        for call in calls:
            with pytest.raises(ValueError, match="reductions run on CPU tensors only; got a tensor on meta"):
                call()
        cpu = torch.ones(4)
        dist.all_reduce(cpu)  # one rank: its own tensor
        assert cpu.tolist() == [1.0] * 4
    finally:
        dist.destroy_process_group()


@pytest.fixture
def alone() -> Iterator[dist.ProcessGroup]:
    """A ``ring_ref`` group (order ``chain``, timeout 77 s, described ``alone``) of a one-rank gloo world."""
    dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
    try:
        yield dist.new_group(
            backend="ring_ref",
            pg_options=RingRefOptions(order="chain"),
            timeout=datetime.timedelta(seconds=77),
            group_desc="alone",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.clause("backend-movement")
def test_the_inner_gloo_group_is_registered_as_gloo_with_the_groups_timeout(alone: dist.ProcessGroup) -> None:
    inner = alone.inner  # type: ignore[attr-defined]  # the backend's own attribute
    assert alone.group_desc == "alone"
    assert (dist.get_backend(inner), dist.get_backend_config(inner)) == ("gloo", "cpu:gloo")
    assert inner._get_backend(torch.device("cpu")).options._timeout == datetime.timedelta(seconds=77)
    store = distributed_c10d._get_process_group_store(inner)  # torch's record of the group's store
    store.set("written", "read back")
    assert store.get("written") == b"read back"


@pytest.mark.clause("backend-reductions")
def test_every_reductions_work_holds_its_tensors_as_ddp_hooks_read_them(alone: dist.ProcessGroup) -> None:
    """DDP's communication hooks read ``work.get_future().value()[0]``: the reduced tensor itself."""
    tensor, output, piece = torch.ones(3), torch.empty(2), torch.ones(2)
    works = {
        "all_reduce": (dist.all_reduce(tensor, group=alone, async_op=True), [tensor]),
        "reduce": (dist.reduce(tensor, dst=0, group=alone, async_op=True), [tensor]),
        "reduce_scatter_tensor": (
            dist.reduce_scatter_tensor(output, torch.ones(2), group=alone, async_op=True),
            [output],
        ),
        "reduce_scatter": (dist.reduce_scatter(piece, [torch.ones(2)], group=alone, async_op=True), [piece]),
    }
    for name, (work, tensors) in works.items():
        assert work is not None
        value = work.get_future().value()
        assert len(value) == len(tensors) and all(v is t for v, t in zip(value, tensors, strict=True)), name
    shards = [torch.empty(2), torch.empty(3)]
    with _coalescing_manager(group=alone, async_ops=True) as coalesced:
        dist.reduce_scatter_tensor(shards[0], torch.ones(2), group=alone)
        dist.reduce_scatter_tensor(shards[1], torch.full((3,), 2.0), group=alone)
    (work,) = coalesced.works
    value = work.get_future().value()
    assert len(value) == 2 and value[0] is shards[0] and value[1] is shards[1]
    assert shards[1].tolist() == [2.0, 2.0, 2.0]


@pytest.mark.clause("backend-movement")
def test_the_coalesced_all_gathers_fill_every_output(alone: dist.ProcessGroup) -> None:
    lists = [[torch.zeros(2), torch.zeros(3)]]  # one rank: its own list of one output per input
    dist.all_gather_coalesced(lists, [torch.ones(2), torch.full((3,), 2.0)], group=alone)
    assert [t.tolist() for t in lists[0]] == [[1.0, 1.0], [2.0, 2.0, 2.0]]
    into = [torch.zeros(2), torch.zeros(3)]
    with _coalescing_manager(group=alone):
        dist.all_gather_into_tensor(into[0], torch.full((2,), 3.0), group=alone)
        dist.all_gather_into_tensor(into[1], torch.full((3,), 4.0), group=alone)
    assert [t.tolist() for t in into] == [[3.0, 3.0], [4.0, 4.0, 4.0]]


@pytest.mark.clause("backend-devices")
def test_a_reduce_scatter_refuses_an_output_or_an_input_off_the_cpu(alone: dist.ProcessGroup) -> None:
    for output, input in (
        (torch.empty(2, device="meta"), torch.ones(2)),
        (torch.empty(2), torch.ones(2, device="meta")),
    ):
        with pytest.raises(
            ValueError, match=r"^ring_ref backend: reductions run on CPU tensors only; got a tensor on meta"
        ):
            dist.reduce_scatter_tensor(output, input, group=alone)
