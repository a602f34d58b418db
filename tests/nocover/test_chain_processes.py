"""The chain and recursive doubling (spec/schedules.md) across processes: gloo groups of 2 to 6 ranks,
``ring_hook``, and MPI.

Every rank must end with the left fold over the ranks' inputs in rank order (the chain), or
with recursive doubling's one tree, bit for bit, for any ``M``; the oracles are
:func:`tests.common.oracles.left_fold` and :func:`tests.common.planted_orders.recursive_doubling`,
which import nothing from ``ring_ref``, and the stacked engines for every op.  Inputs are drawn
by Hypothesis in the parent and shipped to long-lived groups (one per world size).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast
from unittest import mock

import numpy.typing as npt
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, which the stubs do not export

from ring_ref import ring_all_reduce
from ring_ref._processes._gloo import SpawnedGroup
from ring_ref._processes._mpi_job import MpiJob
from ring_ref._ranks import _plans
from ring_ref.distributed import RingHookState, ring_all_reduce_, ring_hook
from ring_ref.mpi import ring_all_reduce_ as mpi_ring_all_reduce_
from ring_ref.schedule import ChainSchedule, DoublingSchedule
from tests.common.oracles import left_fold, same_bits
from tests.common.planted_orders import recursive_doubling
from tests.common.processes import Jobs

CALL_TIMEOUT_S = 120.0
OPS = ("sum", "prod", "max", "min", "avg")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
PER_ROUND: dict[str, Any] = {"_PIPELINED_BACKENDS": frozenset()}
"""The check as for NCCL (one gathering collective of its own) instead of gloo's ``alltoall`` check."""

Case = tuple[torch.Tensor, str, bool]  # stacked input, op, column-major per-rank tensor
Array = npt.NDArray[Any]
PROCESS_SETTINGS = settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def rings() -> Iterator[dict[int, SpawnedGroup]]:
    """Gloo groups of 2, 3, 4 and 6 processes, reused by every test of the module."""
    with (
        SpawnedGroup(2, group_timeout_s=CALL_TIMEOUT_S) as two,
        SpawnedGroup(3, group_timeout_s=CALL_TIMEOUT_S) as three,
        SpawnedGroup(4, group_timeout_s=CALL_TIMEOUT_S) as four,
        SpawnedGroup(6, group_timeout_s=CALL_TIMEOUT_S) as six,
    ):
        yield {2: two, 3: three, 4: four, 6: six}


@st.composite
def stacked(draw: st.DrawFn, n: int, dtypes: tuple[torch.dtype, ...] = DTYPES) -> torch.Tensor:
    """``(N, M, ...)`` for any ``M`` in 1..40 (``M < N`` leaves segments empty), magnitudes over
    2**-8 .. 2**8 so that other orders give other bits."""
    m = draw(st.integers(1, 40))
    trailing = draw(st.sampled_from([(), (3,)]))
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    shape = (n, m, *trailing)
    scale = torch.exp2(torch.randint(-8, 9, shape, generator=gen).to(torch.float64))
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def reduce_cases(
    rank: int, world_size: int, payload: tuple[dict[str, Any], str, list[Case]]
) -> list[torch.Tensor]:
    """On each rank: ``ring_all_reduce_(x[rank], schedule=SCHEDULE, op=...)`` in place, per case."""
    patches, schedule, cases = payload
    results = []
    with mock.patch.multiple(_plans, **patches) if patches else contextlib.nullcontext():
        for x, op, column_major in cases:
            mine = x[rank].clone()
            if column_major:
                mine = mine.transpose(0, -1).contiguous().transpose(0, -1)
            assert ring_all_reduce_(mine, schedule=schedule, op=op) is mine
            results.append(mine)
    return results


@pytest.mark.clause("chain-processes")
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("patches", [{}, PER_ROUND], ids=["gloo-check", "gathered-check"])
@PROCESS_SETTINGS
@given(data=st.data())
def test_chain_on_gloo_ranks_is_the_left_fold(
    rings: dict[int, SpawnedGroup], n: int, patches: dict[str, Any], data: st.DataObject
) -> None:
    cases: list[Case] = [
        (data.draw(stacked(n)), data.draw(st.sampled_from(OPS)), data.draw(st.booleans())) for _ in range(6)
    ]
    cases.append((data.draw(stacked(n)), "sum", False))
    per_rank = rings[n].run(reduce_cases, (patches, "chain", cases), timeout_s=CALL_TIMEOUT_S)
    for k, (x, op, _) in enumerate(cases):
        want = left_fold(x, op)
        for rank in range(n):
            assert same_bits(per_rank[rank][k], want), (op, x.dtype, tuple(x.shape), rank)


class Bucket:
    """What ``ring_hook`` reads of DDP's ``GradBucket``: its flat buffer."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer


def hook_rows(rank: int, world_size: int, x: torch.Tensor) -> torch.Tensor:
    """On each rank: ``ring_hook`` with ``RingHookState(schedule="chain")`` on a bucket of ``x[rank]``."""
    buffer = x[rank].clone()
    future = ring_hook(RingHookState(schedule="chain"), cast(GradBucket, Bucket(buffer)))
    assert future.wait() is buffer
    return buffer


@pytest.mark.clause("chain-processes")
def test_ring_hook_with_the_chain_averages_the_left_fold(rings: dict[int, SpawnedGroup]) -> None:
    """A bucket of 37 elements on 4 ranks (not a multiple of 4: nothing is padded): the left fold / N."""
    n = 4
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(n, 37, generator=gen) * torch.exp2(torch.randint(-8, 9, (n, 37), generator=gen).float())
    per_rank = rings[n].run(hook_rows, x, timeout_s=CALL_TIMEOUT_S)
    want = left_fold(x, "sum") / n
    for rank in range(n):
        assert same_bits(per_rank[rank], want), rank


def refuse_a_differing_schedule(rank: int, world_size: int, _: None) -> tuple[str, str, bool]:
    """Rank 0 asks for the chain, the others for the spec's ring: every rank must raise the same error."""
    mine = torch.arange(6.0)
    try:
        ring_all_reduce_(mine, schedule="chain" if rank == 0 else "spec")
    except ValueError as exc:
        return "ValueError", str(exc), bool(torch.equal(mine, torch.arange(6.0)))
    return "ok", "", True


@pytest.mark.clause("chain-processes")
@pytest.mark.parametrize("n", [2, 3])
def test_a_chain_on_one_rank_only_is_refused_on_every_rank(rings: dict[int, SpawnedGroup], n: int) -> None:
    per_rank = rings[n].run(refuse_a_differing_schedule, None, timeout_s=CALL_TIMEOUT_S)
    kinds = {kind for kind, _, _ in per_rank}
    assert kinds == {"ValueError"}, per_rank
    assert len({message for _, message, _ in per_rank}) == 1
    assert "chain 0 -> N-1" in per_rank[0][1]
    assert all(unchanged for _, _, unchanged in per_rank)


@pytest.mark.clause("doubling-processes")
@pytest.mark.parametrize("n", [2, 3, 4, 6])
@pytest.mark.parametrize("patches", [{}, PER_ROUND], ids=["gloo-check", "gathered-check"])
@PROCESS_SETTINGS
@given(data=st.data())
def test_doubling_on_gloo_ranks_is_the_doubling_tree(
    rings: dict[int, SpawnedGroup], n: int, patches: dict[str, Any], data: st.DataObject
) -> None:
    """Recursive doubling on torch ranks, ``N`` a power of two or not (the pre-step's pairs at 3 and 6):
    every rank ends with the stacked engines' bits for every op, and for a sum with the doubling tree of
    ``tests.common.planted_orders.recursive_doubling`` (a plain loop, no ``ring_ref``)."""
    cases: list[Case] = [
        (data.draw(stacked(n)), data.draw(st.sampled_from(OPS)), data.draw(st.booleans())) for _ in range(6)
    ]
    cases.append((data.draw(stacked(n)), "sum", False))
    per_rank = rings[n].run(reduce_cases, (patches, "recursive-doubling", cases), timeout_s=CALL_TIMEOUT_S)
    for k, (x, op, _) in enumerate(cases):
        want = ring_all_reduce(x, schedule="recursive-doubling", op=op)
        fast = ring_all_reduce(x, schedule="recursive-doubling", op=op, engine="fast")
        assert same_bits(fast, want)
        if op == "sum":
            assert same_bits(recursive_doubling(x), want)
        for rank in range(n):
            assert same_bits(per_rank[rank][k], want), (op, x.dtype, tuple(x.shape), rank)


def hook_doubling(rank: int, world_size: int, x: torch.Tensor) -> torch.Tensor:
    """On each rank: ``ring_hook`` with ``RingHookState(schedule="recursive-doubling")`` on ``x[rank]``."""
    buffer = x[rank].clone()
    future = ring_hook(RingHookState(schedule="recursive-doubling"), cast(GradBucket, Bucket(buffer)))
    assert future.wait() is buffer
    return buffer


@pytest.mark.clause("doubling-processes")
def test_ring_hook_with_recursive_doubling_averages_the_doubling_tree(rings: dict[int, SpawnedGroup]) -> None:
    """A bucket of 37 elements on 3 ranks (the pre-step's pair, then the doubling step): the tree / N."""
    n = 3
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(n, 37, generator=gen) * torch.exp2(torch.randint(-8, 9, (n, 37), generator=gen).float())
    per_rank = rings[n].run(hook_doubling, x, timeout_s=CALL_TIMEOUT_S)
    want = recursive_doubling(x) / n
    for rank in range(n):
        assert same_bits(per_rank[rank], want), rank


# --- MPI ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mpi4() -> Iterator[tuple[Jobs, MpiJob]]:
    """One MPI job of 4 ranks; every process it started is gone afterwards."""
    pool = Jobs()
    yield pool, pool.ring(4)
    pool.close()


def mpi_rows(
    comm: Any, cases: list[tuple[Array, str | ChainSchedule | DoublingSchedule]]
) -> list[Array | None]:
    """On each rank: the MPI ring's chain on ``x[rank]`` among the first ``N`` ranks (others: ``None``)."""
    from mpi4py import MPI

    subs: dict[int, Any] = {}
    results: list[Array | None] = []
    for x, schedule in cases:
        n = x.shape[0]
        if n not in subs:
            subs[n] = comm.Split(0 if comm.Get_rank() < n else MPI.UNDEFINED, comm.Get_rank())
        if subs[n] == MPI.COMM_NULL:
            results.append(None)
            continue
        mine = x[comm.Get_rank()].copy()
        assert mpi_ring_all_reduce_(subs[n], mine, schedule=schedule) is mine
        results.append(mine)
    return results


@pytest.mark.clause("chain-processes")
@PROCESS_SETTINGS
@given(data=st.data())
def test_chain_on_mpi_ranks_is_the_left_fold(mpi4: tuple[Jobs, MpiJob], data: st.DataObject) -> None:
    jobs, world4 = mpi4
    cases: list[tuple[Array, str | ChainSchedule]] = []
    for n in (1, 2, 3, 4):
        stack = data.draw(stacked(n, (torch.float16, torch.float32, torch.float64)))
        schedules: list[str | ChainSchedule] = ["chain", ChainSchedule("gloo")]
        cases.append((stack.numpy(), data.draw(st.sampled_from(schedules))))
    per_rank = jobs.run(world4, mpi_rows, cases, timeout_s=CALL_TIMEOUT_S)
    for k, (x, schedule) in enumerate(cases):
        want = left_fold(torch.from_numpy(x), "sum")
        for rank in range(x.shape[0]):
            got = per_rank[rank][k]
            assert got is not None and same_bits(torch.from_numpy(got), want), (
                x.dtype,
                x.shape,
                schedule,
                rank,
            )


@pytest.mark.clause("doubling-processes")
@PROCESS_SETTINGS
@given(data=st.data())
def test_doubling_on_mpi_ranks_is_the_doubling_tree(mpi4: tuple[Jobs, MpiJob], data: st.DataObject) -> None:
    jobs, world4 = mpi4
    cases: list[tuple[Array, str | ChainSchedule | DoublingSchedule]] = []
    for n in (1, 2, 3, 4):
        stack = data.draw(stacked(n, (torch.float16, torch.float32, torch.float64)))
        schedules: list[str | ChainSchedule | DoublingSchedule] = [
            "recursive-doubling",
            DoublingSchedule("ceil"),
        ]
        cases.append((stack.numpy(), data.draw(st.sampled_from(schedules))))
    per_rank = jobs.run(world4, mpi_rows, cases, timeout_s=CALL_TIMEOUT_S)
    for k, (x, schedule) in enumerate(cases):
        want = recursive_doubling(torch.from_numpy(x))
        for rank in range(x.shape[0]):
            got = per_rank[rank][k]
            assert got is not None and same_bits(torch.from_numpy(got), want), (x.shape, schedule, rank)
