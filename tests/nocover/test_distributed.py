"""``ring_ref.distributed.ring_all_reduce_`` on real gloo processes on 127.0.0.1 (``_processes._gloo``).

One process group per world size (2, 3 and 4 processes) is spawned once per
module and reused by every case.  Each rank reduces its own row of a stacked
input in place; the parent compares every rank's bits with the simulation
``ring_ref.ring_all_reduce`` *and* with the independent closed-form fold
``tests.common.oracles.ring_fold``.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import importlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, cast
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from ring_ref import distributed, ring_all_reduce
from ring_ref._processes._gloo import ProcessRing, RankError
from ring_ref._ranks import _plans, _transport
from ring_ref.distributed import ring_all_reduce_
from ring_ref.testing import assert_matches_reference
from tests.common.faults import failing_add
from tests.common.oracles import ring_fold, same_bits
from tests.common.paths import ROOT
from tests.common.processes import Rings

# The example script is imported by name here and, through sys.path (spawned ranks inherit it), on every rank.
sys.path.insert(0, str(ROOT / "examples"))
data_parallel_step: Any = importlib.import_module("data_parallel_step")

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
GROUP_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 60.0

_GROUPS: dict[tuple[tuple[int, ...], float], dist.ProcessGroup] = {}


def _group(ranks: tuple[int, ...], timeout_s: float = GROUP_TIMEOUT_S) -> dist.ProcessGroup:
    """A cached sub-group; all ranks must ask for the same groups in the same order (a collective)."""
    key = (ranks, timeout_s)
    if key not in _GROUPS:
        group = dist.new_group(list(ranks), timeout=datetime.timedelta(seconds=timeout_s))
        assert group is not None
        _GROUPS[key] = group
    return _GROUPS[key]


def stacked(
    n: int, rows_per_chunk: int, trailing: tuple[int, ...], dtype: torch.dtype, seed: int
) -> torch.Tensor:
    """A seeded ``(N, M, ...)`` input with magnitudes spread over 10**-3 .. 10**3 (order-sensitive sums)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n, n * rows_per_chunk, *trailing)
    scale = torch.pow(10.0, torch.randint(-3, 4, shape, generator=gen).to(torch.float64))
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def cases_for(n: int) -> list[tuple[torch.Tensor, bool]]:
    """Every dtype x trailing shape, contiguous and column-major (non-contiguous) per-rank tensors."""
    out = []
    for d, dtype in enumerate(DTYPES):
        for t, (rows, trailing) in enumerate([(1, ()), (3, ()), (2, (3,)), (1, (2, 3))]):
            x = stacked(n, rows, trailing, dtype, seed=100 * n + 10 * d + t)
            out.append((x, False))
            if trailing:
                out.append((x, True))
    # Finite inputs whose local sum overflows float16: the quick finiteness check (a sum) cannot vouch
    # for them, so the element-wise scan must, and the ring must still run (its sums overflow to inf).
    out.append((torch.full((n, 4 * n), 60000.0, dtype=torch.float16), False))
    return out


def reduce_rows(rank: int, world_size: int, cases: list[tuple[torch.Tensor, bool]]) -> list[torch.Tensor]:
    """On each rank: reduce ``x[rank]`` in place; check identity, strides and storage were kept."""
    results = []
    for x, column_major in cases:
        mine = x[rank].clone()
        if column_major:
            mine = mine.transpose(0, -1).contiguous().transpose(0, -1)
            assert not mine.is_contiguous()
        ptr, strides = mine.data_ptr(), mine.stride()
        assert ring_all_reduce_(mine) is mine
        assert (mine.data_ptr(), mine.stride()) == (ptr, strides)
        results.append(mine)
    return results


def reduce_in_subgroup(rank: int, world_size: int, payload: tuple[tuple[int, ...], torch.Tensor]) -> Any:
    """Members of the sub-group ``ranks`` reduce row ``group rank`` of ``x``; the others must be refused."""
    ranks, x = payload
    group = _group(ranks)
    if rank not in ranks:
        try:
            ring_all_reduce_(torch.zeros(len(ranks)), group)
        except ValueError as exc:
            return str(exc)
        return "accepted"
    mine = x[dist.get_group_rank(group, rank)].clone()
    ring_all_reduce_(mine, group)
    return mine


@pytest.fixture(scope="module")
def rings() -> Iterator[Rings]:
    pool = Rings(GROUP_TIMEOUT_S)
    yield pool
    pool.close()


@pytest.mark.clause("fold-order", "chunk-layout", "ag-complete", "supported-dtypes")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_rank_matches_the_simulation_bit_for_bit(rings: Rings, n: int) -> None:
    cases = cases_for(n)
    per_rank = rings(n).run(reduce_rows, cases, timeout_s=CALL_TIMEOUT_S)
    order_sensitive = 0
    for k, (x, _) in enumerate(cases):
        expected = ring_all_reduce(x)
        assert same_bits(expected, ring_fold(x)), "the simulation itself disagrees with the closed form"
        for rank in range(n):
            got = per_rank[rank][k]
            assert same_bits(got, expected), (
                f"rank {rank}, case {k} ({x.dtype}, {tuple(x.shape)}): {got} != {expected}"
            )
        forward = x[0]
        for i in range(1, n):
            forward = forward + x[i]
        order_sensitive += not same_bits(forward, expected)
    # With N >= 3 the inputs make the plain 0..N-1 fold differ, so bitwise agreement is a real check of
    # the association order; with N = 2 every order gives the same bits (IEEE addition commutes).
    assert order_sensitive > 0 if n >= 3 else order_sensitive == 0


def reduce_rows_with(
    rank: int, world_size: int, payload: tuple[dict[str, object], list[tuple[torch.Tensor, bool]]]
) -> list[torch.Tensor]:
    """:func:`reduce_rows` with some of the tuning constants (``ring_ref._ranks._plans``) replaced."""
    settings, cases = payload
    with contextlib.ExitStack() as stack:
        for name, value in settings.items():
            stack.enter_context(mock.patch.object(_plans, name, value))
        return reduce_rows(rank, world_size, cases)


SMALL_SEGMENTS: dict[str, object] = {"SEGMENT_BYTES": 8, "MAX_SEGMENTS": 1 << 30}
ROUNDS: dict[str, object] = {"SWAP_BYTES": 0}  # two ranks run rounds, not one swap
EXCHANGE_SEGMENTS: dict[str, object] = {"EXCHANGE_SEGMENT_BYTES": 8, "MAX_SEGMENTS": 4}
AFTER_THE_CHECK: dict[str, object] = {"LEAD_BYTES": 0}  # reduce-scatter's first step does not ride with it
PER_ROUND: dict[str, object] = {
    "_PIPELINED_BACKENDS": frozenset()
}  # one batch_isend_irecv per round (as for NCCL)


@pytest.mark.clause("fold-order", "chunk-layout", "simultaneous-rounds")
@pytest.mark.parametrize(
    ("n", "settings"),
    [
        (2, {}),
        (2, EXCHANGE_SEGMENTS | ROUNDS),
        (2, EXCHANGE_SEGMENTS | ROUNDS | AFTER_THE_CHECK),
        (2, {"SEGMENT_BYTES": 8} | ROUNDS | {"_EXCHANGE_RANKS": 1}),
        (3, SMALL_SEGMENTS),
        (3, SMALL_SEGMENTS | AFTER_THE_CHECK),
        (4, SMALL_SEGMENTS | {"SEGMENT_BYTES": 6}),
        (4, SMALL_SEGMENTS | AFTER_THE_CHECK),
        (3, PER_ROUND),
    ],
    ids=[
        "n2-swap",
        "n2-4-segments-first-round-with-the-check",
        "n2-4-segments-after-the-check",
        "n2-4-segments-point-to-point",
        "n3-segments-of-8-bytes",
        "n3-segments-of-8-bytes-after-the-check",
        "n4-segments-of-6-bytes",
        "n4-segments-of-8-bytes-after-the-check",
        "n3-one-send-per-round",
    ],
)
def test_segmented_and_per_round_sends_give_the_simulations_bits(
    rings: Rings, n: int, settings: dict[str, object]
) -> None:
    """Chunks of 15 elements in segments of 1-4 elements (a short last one), on ``alltoall`` rounds
    (two ranks) and point-to-point sends (all-gather received straight into the slot), with
    reduce-scatter's first step carried by the check or sent after it, the unsegmented per-round
    path, and two ranks swapping their tensors."""
    cases = []
    for d, dtype in enumerate(DTYPES):
        x = stacked(n, 5, (3,), dtype, seed=7 * n + d)
        cases += [(x, False), (x, True)]
    per_rank = rings(n).run(reduce_rows_with, (settings, cases), timeout_s=CALL_TIMEOUT_S)
    for k, (x, _) in enumerate(cases):
        expected = ring_fold(x)
        assert same_bits(ring_all_reduce(x), expected)
        for rank in range(n):
            assert same_bits(per_rank[rank][k], expected), (rank, k, x.dtype)


def count_collectives(rank: int, world_size: int, _: None) -> dict[str, list[int]]:
    """Per collective one good call starts, the element count of this rank's contribution to each.

    ``torch.distributed``'s own collectives are counted, and the two that ``ring_ref.distributed``
    calls on the group directly (``allgather``, for backends other than gloo, and ``alltoall``,
    with the call's timeout).
    """
    seen: dict[str, list[int]] = {
        "all_reduce": [],
        "all_gather_object": [],
        "_all_gather": [],
        "_all_to_all": [],
    }

    def counting(module: Any, name: str, position: int) -> Any:
        real = getattr(module, name)

        def collective(*args: Any, **kwargs: Any) -> Any:
            contribution = args[position]
            seen[name].append(contribution.numel() if isinstance(contribution, torch.Tensor) else -1)
            return real(*args, **kwargs)

        return mock.patch.object(module, name, collective)

    with contextlib.ExitStack() as stack:
        for module, name, position in [
            (dist, "all_reduce", 0),
            (dist, "all_gather_object", 1),
            (_transport, "_all_gather", 2),
            (_transport, "_all_to_all", 2),
        ]:
            stack.enter_context(counting(module, name, position))
        ring_all_reduce_(torch.randn(world_size << 10, 3))
    return seen


@pytest.mark.parametrize("n", [2, 3])
def test_good_input_is_checked_with_one_small_collective(rings: Rings, n: int) -> None:
    """The check before the ring costs one collective of fixed-size signatures, which also carries
    the first data; descriptions move only on a mismatch.

    Every rank sends every other rank its signature (a few tens of integers) in one ``alltoall``,
    as bytes.  Three ranks' tensors (3 * 2**10 rows of 3 float32) are cut into chunks within
    :data:`ring_ref.distributed.LEAD_BYTES`, so each rank's message to its right neighbour also
    carries its first reduce-scatter chunk, and the rest of the ring runs on point-to-point sends.
    Two ranks send each other their whole tensor (within :data:`ring_ref.distributed.SWAP_BYTES`)
    with the signature, and that is all.
    """
    sent = (6 << 10) * 4 if n == 2 else (3 << 10) * 3 * 4 // n  # the tensor, or one chunk, in bytes
    for seen in rings(n).run(count_collectives, None, timeout_s=CALL_TIMEOUT_S):
        assert seen["all_reduce"] == [] and seen["all_gather_object"] == [] and seen["_all_gather"] == [], (
            seen
        )
        (check,) = seen["_all_to_all"]
        assert sent < check <= sent + 32 * 8 * (n - 1), seen


@pytest.mark.clause("sum-not-mean")
def test_worked_example_on_two_processes(rings: Rings) -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    per_rank = rings(2).run(reduce_rows, [(x, False)], timeout_s=CALL_TIMEOUT_S)
    assert [r[0].tolist() for r in per_rank] == [[4.0, 6.0], [4.0, 6.0]]


def test_subgroups_reduce_in_group_rank_order(rings: Rings) -> None:
    for ranks in [(1, 3), (0, 2, 3), (2,)]:
        x = stacked(len(ranks), 2, (2,), torch.float16, seed=len(ranks))
        per_rank = rings(4).run(reduce_in_subgroup, (ranks, x), timeout_s=CALL_TIMEOUT_S)
        for rank, got in enumerate(per_rank):
            if rank in ranks:
                assert same_bits(got, ring_fold(x)), (ranks, rank)
            else:
                assert got.startswith(f"this process (global rank {rank}) is not a member of the given group")


def reduce_on_first_n(rank: int, world_size: int, x: torch.Tensor) -> torch.Tensor | None:
    """Ranks ``0 .. N-1`` reduce their rows of ``x`` (``N = x.shape[0]``) in a sub-group; rank 0's result.

    The members' results are compared bitwise first: a disagreement raises, so a
    target built on this reports it rather than hiding it behind rank 0.
    """
    n = x.shape[0]
    group = _group(tuple(range(n)))
    if rank >= n:
        return None
    mine = x[rank].clone()
    ring_all_reduce_(mine, group)
    everyone: list[torch.Tensor | None] = [None] * n
    dist.all_gather_object(everyone, mine, group=group)
    if not all(t is not None and same_bits(t, mine) for t in everyone):
        raise AssertionError(f"the ranks of the N = {n} ring ended with different bits")
    return mine if rank == 0 else None


def ring_target(ring: ProcessRing, rotate: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """A difftest target: ``(N, M, ...)`` in, rank 0's ``(M, ...)`` out, computed by N real ranks (N <= 4).

    ``rotate`` plants a fault: rank ``r`` reduces row ``r + 1``, a correct sum in the wrong fold order.
    """

    def target(x: torch.Tensor) -> torch.Tensor:
        rows = x.roll(1, 0) if rotate else x
        result = ring.run(reduce_on_first_n, rows, timeout_s=CALL_TIMEOUT_S)[0]
        assert result is not None
        return result

    return target


@pytest.mark.clause("fold-order")
def test_difftest_exact_mode_passes_on_real_processes(rings: Rings) -> None:
    """The differential tester (exact mode: bitwise against the reference) with N = 1..4 real ranks."""
    report = assert_matches_reference(ring_target(rings(4)), mode="exact", examples=30, seed=7, max_workers=4)
    assert report.modes["exact"].examples >= 30


@pytest.mark.soak  # shrinking the counterexample takes hundreds of multi-process calls
def test_difftest_catches_a_wrong_fold_order_on_real_processes(rings: Rings) -> None:
    with pytest.raises(AssertionError, match="not-ring-order"):
        assert_matches_reference(
            ring_target(rings(4), rotate=True), mode="exact", examples=30, seed=1, max_workers=4
        )


MakeArg = Callable[[int, int], object]
BAD_CASES: dict[str, tuple[MakeArg, type[Exception], str]] = {
    "indivisible": (lambda r, n: torch.zeros(n + 1), ValueError, "M = 4 is not divisible by N = 3"),
    "scalar": (lambda r, n: torch.tensor(1.0), ValueError, "at least 1 dimension"),
    "empty": (lambda r, n: torch.zeros(0, 2), ValueError, "M = 0"),
    "shape-mismatch": (
        lambda r, n: torch.zeros(n, 2) if r == 1 else torch.zeros(n),
        ValueError,
        "the ranks passed different tensors",
    ),
    "int-on-one-rank": (
        lambda r, n: torch.zeros(n, dtype=torch.int32 if r == n - 1 else torch.float32),
        TypeError,
        "unsupported dtype torch.int32",
    ),
    "nan-on-one-rank": (
        lambda r, n: torch.tensor([float("nan") if r == 0 else 1.0] * n),
        ValueError,
        "rank 0: inputs must be finite",
    ),
    "not-a-tensor": (
        lambda r, n: [1.0] * n if r == 1 else torch.zeros(n),
        TypeError,
        "rank 1: expects a torch.Tensor",
    ),
    "sparse": (lambda r, n: torch.zeros(n, n).to_sparse(), TypeError, "dense strided tensor"),
    "meta": (lambda r, n: torch.zeros(n, device="meta"), ValueError, "meta device"),
    "expanded-on-one-rank": (
        lambda r, n: torch.zeros(1, 2).expand(n, 2) if r == 2 else torch.zeros(n, 2),
        ValueError,
        "rank 2: the sum is written in place, but the layout (strides (0, 1)) lets elements share memory",
    ),
    "trailing-shape-mismatch": (
        lambda r, n: torch.zeros(n, 2, 3) if r == 1 else torch.zeros(n, 3, 2),
        ValueError,
        "rank 1: shape (3, 2, 3) torch.float32 on cpu",
    ),
    "deep-shape-mismatch": (  # differs beyond the dimensions the signature holds exactly
        lambda r, n: torch.zeros(n, *([1] * 8), 2 if r == 2 else 1, 1 if r == 2 else 2),
        ValueError,
        "the ranks passed different tensors",
    ),
    "inf-on-one-rank": (
        lambda r, n: torch.tensor([float("-inf") if r == 2 else 1.0] * n),
        ValueError,
        "rank 2: inputs must be finite",
    ),
    "dtype-mismatch": (
        lambda r, n: torch.zeros(n, dtype=torch.float64 if r == 0 else torch.float32),
        ValueError,
        "rank 0: shape (3,) torch.float64 on cpu; rank 1: shape (3,) torch.float32 on cpu",
    ),
}


def _beyond(n: int) -> int:
    """Elements of a float32 tensor whose chunks are too large to travel with the check (and, for
    two ranks, which is too large to swap)."""
    return n * (max(distributed.SWAP_BYTES, distributed.LEAD_BYTES) // 4 + 1)


CARRYING_CASES: dict[str, tuple[MakeArg, type[Exception], str]] = {
    "shape-mismatch": (
        lambda r, n: torch.zeros(n, 2) if r == 1 else torch.zeros(n),
        ValueError,
        "the ranks passed different tensors",
    ),
    "bigger-chunks-on-one-rank": (  # rank 1's first chunk is 16 times what its right neighbour expects
        lambda r, n: torch.zeros(16 * n if r == 1 else n),
        ValueError,
        "the ranks passed different tensors",
    ),
    "dtype-mismatch-same-length": (
        lambda r, n: torch.zeros(n, dtype=torch.float64 if r == 0 else torch.float32),
        ValueError,
        "rank 0: shape (N,) torch.float64 on cpu; rank 1: shape (N,) torch.float32 on cpu",
    ),
    "one-rank-beyond-what-travels-with-the-check": (  # the others send data with their signature
        lambda r, n: torch.zeros(_beyond(n) if r == 1 else n),
        ValueError,
        "the ranks passed different tensors",
    ),
    "nan-on-one-rank": (
        lambda r, n: torch.tensor([float("nan") if r == 1 else 1.0] * n),
        ValueError,
        "rank 1: inputs must be finite",
    ),
    "inf-beyond-what-travels-with-the-check": (
        lambda r, n: torch.full((_beyond(n),), float("inf") if r == 0 else 1.0),
        ValueError,
        "rank 0: inputs must be finite",
    ),
    "not-a-tensor": (
        lambda r, n: [1.0] * n if r == 0 else torch.zeros(n),
        TypeError,
        "rank 0: expects a torch.Tensor",
    ),
    "int-on-one-rank": (
        lambda r, n: torch.zeros(n, dtype=torch.int32 if r == 1 else torch.float32),
        TypeError,
        "unsupported dtype torch.int32",
    ),
    "expanded-on-one-rank": (
        lambda r, n: torch.zeros(1, 2).expand(n, 2) if r == 0 else torch.zeros(n, 2),
        ValueError,
        "rank 0: the sum is written in place",
    ),
}


def _unchanged(before: object, after: object) -> bool:
    """Same bits (NaN included), dtype and shape; non-tensors must compare equal to their copy."""
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return before == after
    if before.is_meta:  # no values to compare
        return after.is_meta and (after.shape, after.dtype) == (before.shape, before.dtype)
    if before.layout != torch.strided:
        return after.layout == before.layout and same_bits(before.to_dense(), after.to_dense())
    return same_bits(before, after)


def reject_bad_inputs(rank: int, world_size: int, names: list[str]) -> list[tuple[str, str, bool]]:
    """Call with each bad input; record the exception and whether the argument was left unchanged."""
    seen = []
    for name in names:
        arg = BAD_CASES[name][0](rank, world_size)
        before = arg.clone() if isinstance(arg, torch.Tensor) else copy.deepcopy(arg)
        try:
            ring_all_reduce_(cast(torch.Tensor, arg))  # deliberately not always a dense float tensor
        except (TypeError, ValueError) as exc:
            seen.append((type(exc).__name__, str(exc), _unchanged(before, arg)))
        else:
            seen.append(("no exception", "", False))
    good = torch.ones(world_size)
    ring_all_reduce_(good)  # the group is still usable afterwards
    seen.append(("ok", str(good.tolist()), True))
    return seen


def test_bad_input_is_rejected_identically_on_every_rank(rings: Rings) -> None:
    names = list(BAD_CASES)
    per_rank = rings(3).run(reject_bad_inputs, names, timeout_s=CALL_TIMEOUT_S)
    for k, name in enumerate(names):
        _, kind, text = BAD_CASES[name]
        outcomes = {per_rank[rank][k] for rank in range(3)}
        assert len(outcomes) == 1, f"{name}: ranks disagree: {outcomes}"
        exc_name, message, unchanged = outcomes.pop()
        assert exc_name == kind.__name__, (name, exc_name, message)
        assert text in message, (name, message)
        assert message.startswith("ring_all_reduce_ rejected the input on every rank")
        assert unchanged, name
    assert {per_rank[rank][-1] for rank in range(3)} == {("ok", "[3.0, 3.0, 3.0]", True)}


def reject_then_reduce(rank: int, world_size: int, names: list[str]) -> list[tuple[str, str, bool, bool]]:
    """Each bad input of :data:`CARRYING_CASES`, then a good call: what was raised, whether the
    argument was left unchanged, and whether the good call right after it gave the right sum
    (nothing left behind)."""
    seen = []
    n = world_size
    for k, name in enumerate(names):
        arg = CARRYING_CASES[name][0](rank, world_size)
        before = arg.clone() if isinstance(arg, torch.Tensor) else copy.deepcopy(arg)
        try:
            ring_all_reduce_(cast(torch.Tensor, arg))  # deliberately not always a dense float tensor
        except (TypeError, ValueError) as exc:
            outcome = (type(exc).__name__, str(exc), _unchanged(before, arg))
        else:
            outcome = ("no exception", "", False)
        good = torch.arange(8.0) * (rank + 1) + k
        ring_all_reduce_(good)
        seen.append((*outcome, same_bits(good, torch.arange(8.0) * (n * (n + 1) // 2) + n * k)))
    return seen


@pytest.mark.parametrize(
    ("n", "settings"),
    # At most 64 segments a chunk: with 8-byte segments and no bound, a tensor beyond LEAD_BYTES is cut into
    # half a million views before the check, which took seconds per call on a loaded machine.
    [(2, {}), (2, ROUNDS), (4, {}), (4, SMALL_SEGMENTS | {"MAX_SEGMENTS": 64})],
    ids=["n2-swap", "n2-rounds", "n4", "n4-segments-of-8-bytes"],
)
def test_a_check_that_carries_data_rejects_bad_input_identically_and_leaves_nothing_behind(
    rings: Rings, n: int, settings: dict[str, object]
) -> None:
    """The check's exchange also carries data (two ranks' whole tensors, or the first
    reduce-scatter chunk to the right neighbour): a tensor the others do not expect (another shape,
    larger chunks, another dtype, chunks beyond :data:`ring_ref.distributed.LEAD_BYTES`, or none at
    all) is still refused identically on every rank, and the next call is not disturbed by it."""
    names = list(CARRYING_CASES)
    per_rank = rings(n).run(reject_then_reduce_with, (settings, names), timeout_s=CALL_TIMEOUT_S)
    for k, name in enumerate(names):
        _, kind, text = CARRYING_CASES[name]
        text = text.replace("(N,)", f"({n},)")
        outcomes = {per_rank[rank][k] for rank in range(n)}
        assert len(outcomes) == 1, f"{name}: ranks disagree: {outcomes}"
        exc_name, message, unchanged, next_call_right = outcomes.pop()
        assert (exc_name, text in message, unchanged, next_call_right) == (kind.__name__, True, True, True), (
            name,
            exc_name,
            message,
        )
        assert message.startswith("ring_all_reduce_ rejected the input on every rank")


def reject_then_reduce_with(
    rank: int, world_size: int, payload: tuple[dict[str, object], list[str]]
) -> list[tuple[str, str, bool, bool]]:
    """:func:`reject_then_reduce` with some of the tuning constants (``ring_ref._ranks._plans``) replaced."""
    settings, names = payload
    with contextlib.ExitStack() as stack:
        for name, value in settings.items():
            stack.enter_context(mock.patch.object(_plans, name, value))
        return reject_then_reduce(rank, world_size, names)


def test_without_a_process_group_the_error_says_how_to_start_one() -> None:
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        ring_all_reduce_(torch.zeros(2))


def seed_numbers(rank: int, world_size: int, _: None) -> tuple[float, float]:
    """The seed's example: mean gradients 2 (1 example) and 6 (3 examples); weighted 5, mean of means 4."""
    mean, count = [(2.0, 1.0), (6.0, 3.0)][rank]
    weighted = torch.tensor([mean * count, count])
    ring_all_reduce_(weighted)
    means = torch.tensor([mean, 0.0])
    ring_all_reduce_(means)
    return float(weighted[0] / weighted[1]), float(means[0] / world_size)


@pytest.mark.clause("sum-not-mean")
def test_seed_example_weighting_by_example_count(rings: Rings) -> None:
    assert rings(2).run(seed_numbers, None, timeout_s=CALL_TIMEOUT_S) == [(5.0, 4.0), (5.0, 4.0)]


def simulated_weighted_gradient(sizes: tuple[int, ...]) -> torch.Tensor:
    """The example's weighted gradient, rebuilt in one process: the simulation of the ranks' buckets."""
    dp = data_parallel_step
    model = dp.tiny_model()
    inputs, targets = dp.global_batch(sum(sizes))
    flats = []
    for rank, size in enumerate(sizes):
        local = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
        count = torch.tensor([float(size)], dtype=dp.DTYPE)
        flats.append(torch.cat([dp.mean_loss_gradient(model, inputs[local], targets[local]) * count, count]))
    length = flats[0].numel()  # the parameters, then the example count
    padded = torch.stack([torch.cat([f, f.new_zeros((-length) % len(sizes))]) for f in flats])
    total = ring_all_reduce(padded)
    return total[: length - 1] / total[length - 1]


@pytest.mark.parametrize("sizes", [(2, 2, 2), (1, 3, 4)], ids=["equal", "unequal"])
def test_data_parallel_step_matches_the_large_batch_gradient(rings: Rings, sizes: tuple[int, ...]) -> None:
    per_rank = rings(3).run(data_parallel_step.data_parallel_gradients, list(sizes), timeout_s=CALL_TIMEOUT_S)
    full = per_rank[0]["full_batch"]
    simulated = simulated_weighted_gradient(sizes)
    for grads in per_rank:
        assert same_bits(grads["weighted"], simulated), "the ring's bits are the simulation's"
        assert same_bits(grads["full_batch"], full)
        assert same_bits(grads["weighted"], per_rank[0]["weighted"]), "every rank must hold the same gradient"
        torch.testing.assert_close(grads["weighted"], full, rtol=1e-12, atol=1e-14)
    gap = float((per_rank[0]["mean_of_means"] - full).abs().max())
    if len(set(sizes)) == 1:
        assert gap < 1e-14, "with equal batches the mean of means is the global mean"
    else:
        assert gap > 1e-3, "with unequal batches the mean of means must differ from the global mean"


# The failure cases come last: they tear their world down.


FAILING_RANK = 1
CALL_TIMEOUT = datetime.timedelta(seconds=2)


def fail_in_ring(rank: int, world_size: int, at_add: int) -> tuple[str, bool]:
    """Rank 1 fails; every rank returns what happened to it (and whether its tensor is intact) as text.

    ``at_add = 0``: rank 1 never calls ``ring_all_reduce_`` (it returns at once), so the others wait
    in the check before the ring; ``at_add = k > 0``: rank 1 raises at its ``k``-th reduce-scatter
    addition, so the others wait inside the ring.  The group's own timeout is 120 s; the call's
    ``timeout=`` of 2 s must be what ends the wait.  Rank 0 passes a non-contiguous tensor, which
    the ring reduces in a private copy: it must come back unchanged.
    """
    x = torch.arange(2.0 * world_size * 3).reshape(2 * world_size, 3)
    if rank == 0:
        x = x.T.contiguous().T
    before = x.clone()
    if rank != FAILING_RANK:
        try:
            ring_all_reduce_(x, timeout=CALL_TIMEOUT)
        except RuntimeError as exc:
            return f"RuntimeError: {exc}", same_bits(x, before)
        return "finished", same_bits(x, before)
    if at_add == 0:
        return "did not call", True
    with failing_add(at_add, rank):
        try:
            ring_all_reduce_(x, timeout=CALL_TIMEOUT)
        except OSError as exc:
            return f"OSError: {exc}", True
    return "finished", True


@pytest.mark.parametrize(
    ("at_add", "failed", "where"),
    [
        (0, "did not call", r": checking every rank's tensor before the ring failed or timed out; "),
        (
            1,
            "OSError: planted failure on rank 1",
            r", (reduce-scatter|all-gather) round \d: exchanging chunks with rank \d \(send\) and rank \d "
            r"\(receive\) failed or timed out; ",
        ),
    ],
    ids=["never-calls", "raises-mid-ring"],
)
def test_a_failing_rank_makes_the_others_raise_within_the_calls_timeout(
    rings: Rings, at_add: int, failed: str, where: str
) -> None:
    """The survivors return on their own once the call's 2 s ``timeout`` expires (the group's is 120 s).

    The harness would raise ``TimeoutError`` (and fail this test) if they were still waiting after
    ``timeout_s``; nobody is killed here.  With 3 ranks the two survivors wait on rank 1 directly
    (rank 2 receives from it, rank 0 sends to it) or, in the check, through the collective.
    """
    ring = rings(3)
    start = time.monotonic()
    per_rank = ring.run(fail_in_ring, at_add, timeout_s=30)
    assert time.monotonic() - start < GROUP_TIMEOUT_S / 4, "the call's timeout, not the group's, must apply"
    assert per_rank[FAILING_RANK] == (failed, True)
    for rank in (0, 2):
        outcome, _ = per_rank[rank]
        assert re.match(f"RuntimeError: ring_all_reduce_: rank {rank} of 3{where}", outcome), outcome
        assert "a peer probably raised, exited or did not call ring_all_reduce_" in outcome
    assert per_rank[0][1], "a non-contiguous tensor must be left unchanged by a failed ring"
    ring.close()  # the timed-out group is left broken; the next case respawns a clean world


def raise_before_calling(rank: int, world_size: int, bad: int) -> list[float]:
    """Rank ``bad`` raises instead of calling; the others call and wait for it."""
    if rank == bad:
        raise ValueError(f"planted failure on rank {rank}")
    x = torch.ones(world_size)
    ring_all_reduce_(x)
    return x.tolist()


def test_a_raising_rank_is_reported_and_the_others_are_killed(rings: Rings) -> None:
    ring = rings(2)
    start = time.monotonic()
    with pytest.raises(RankError, match="rank 0 of 2 failed") as info:
        ring.run(raise_before_calling, 0, timeout_s=CALL_TIMEOUT_S)
    assert time.monotonic() - start < GROUP_TIMEOUT_S / 4, "the waiting rank must be killed, not waited out"
    assert "ValueError: planted failure on rank 0" in str(info.value)
    assert not ring.running


def test_torchrun_example_reports_bitwise_equality_on_every_rank() -> None:
    """The documented launcher, run as documented (two ranks here to stay quick), on this machine.

    torchrun's ``--standalone`` rendezvous connects through ``localhost`` and gloo is pinned to the
    loopback interface; torchrun's own store still listens on every interface (not ours to change).
    """
    root = ROOT
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    launcher = subprocess.Popen(
        [*command, str(root / "examples" / "torchrun_ring.py")],
        cwd=root,
        env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, so a timeout can take the ranks down with it
    )
    try:
        stdout, stderr = launcher.communicate(timeout=CALL_TIMEOUT_S * 2)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert launcher.returncode == 0, stdout + stderr
    found = re.findall(
        r"rank (\d)/2 gloo +(torch\.\w+) \(4, 3\): (equals the simulation bit for bit|DIFFERS)", stdout
    )
    expected = {
        (str(rank), str(dtype), "equals the simulation bit for bit") for rank in range(2) for dtype in DTYPES
    }
    assert sorted(found) == sorted(expected), stdout
