"""``ring_ref.distributed.ring_reduce_scatter_`` and ``ring_all_gather_`` on real gloo processes on 127.0.0.1.

One process group per world size (2, 3 and 4 processes) is spawned once per
module and reused.  Every rank's output is compared bit for bit with a fold
written here, independent of ``ring_ref``: rank ``r``'s reduce-scatter shard is
chunk ``r`` folded left over the ranks ``r + d, r + 2d, ..., r`` (the ring's
direction ``d``), every combine rounded to the dtype; its all-gather output is
every rank's shard in rank order, every bit copied.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import re
import time
from collections.abc import Iterator
from typing import Any, cast
from unittest import mock

import pytest
import torch

from ring_ref._ranks import _plans, _transport
from ring_ref.distributed import ring_all_gather_, ring_all_reduce_, ring_reduce_scatter_
from ring_ref.schedule import RingSchedule
from tests.common.faults import failing_add
from tests.common.oracles import bits, same_bits, shard_fold, special_values
from tests.common.processes import Rings

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
GROUP_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 90.0
SCHEDULES: dict[str, tuple[object, int]] = {
    # name: (schedule=, the direction of its ring); presets take k = d (RS_CONVENTION)
    "default": (None, 1),
    "spec": ("spec", 1),
    "openmpi-ring": ("openmpi-ring", 1),
    "gloo": ("gloo", -1),
    "minus-even": (RingSchedule(-1, -1, "even"), -1),
}


def stacked(n: int, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A seeded ``(N, *shape)`` input with magnitudes over 10**-3 .. 10**3, so that sums depend on order."""
    gen = torch.Generator().manual_seed(seed)
    full = (n, *shape)
    scale = torch.pow(10.0, torch.randint(-3, 4, full, generator=gen).to(torch.float64))
    return (torch.randn(full, generator=gen, dtype=torch.float64) * scale).to(dtype)


@pytest.fixture(scope="module")
def rings() -> Iterator[Rings]:
    pool = Rings(GROUP_TIMEOUT_S)
    yield pool
    pool.close()


def _column_major(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout (a 1-d tensor stays as it is)."""
    if t.dim() < 2:
        return t
    out = t.transpose(0, -1).contiguous().transpose(0, -1)
    assert not out.is_contiguous()
    return out


@contextlib.contextmanager
def tuned(settings: dict[str, object]) -> Iterator[None]:
    """The tuning constants (``ring_ref._ranks._plans``) replaced by ``settings`` (on this rank)."""
    with contextlib.ExitStack() as stack:
        for name, value in settings.items():
            stack.enter_context(mock.patch.object(_plans, name, value))
        yield


Case = tuple[torch.Tensor, object, str, bool]
"""The stacked input, ``schedule=``, ``op=`` and whether the rank's tensors are non-contiguous."""


def reduce_scatter_rows(
    rank: int, world_size: int, payload: tuple[dict[str, object], list[Case]]
) -> list[tuple[torch.Tensor, bool]]:
    """On each rank: reduce-scatter ``x[rank]``; return the shard and whether the input was left
    unchanged and the output kept its identity (``settings`` replace tuning constants)."""
    settings, cases = payload
    results = []
    with tuned(settings):
        for x, schedule, op, strided in cases:
            mine = x[rank].clone()
            out = torch.full((x.shape[1] // world_size, *x.shape[2:]), float("nan"), dtype=x.dtype)
            if strided:
                mine, out = _column_major(mine), _column_major(out)
            before, ptr = mine.clone(), out.data_ptr()
            returned = ring_reduce_scatter_(out, mine, schedule=cast(Any, schedule), op=op)
            kept = returned is out and out.data_ptr() == ptr and same_bits(mine, before)
            results.append((out, kept))
    return results


SMALL_SEGMENTS: dict[str, object] = {"SEGMENT_BYTES": 8, "MAX_SEGMENTS": 1 << 30}
EXCHANGE_SEGMENTS: dict[str, object] = {"EXCHANGE_SEGMENT_BYTES": 8, "MAX_SEGMENTS": 4}
AFTER_THE_CHECK: dict[str, object] = {"LEAD_BYTES": 0}
PER_ROUND: dict[str, object] = {"_PIPELINED_BACKENDS": frozenset()}  # one batch per round, as for NCCL


@pytest.mark.clause("dist-reduce-scatter")
@pytest.mark.parametrize(
    ("n", "settings"),
    [
        (2, {}),
        (3, {}),
        (4, {}),
        (2, EXCHANGE_SEGMENTS | AFTER_THE_CHECK),
        (3, SMALL_SEGMENTS),
        (4, SMALL_SEGMENTS | AFTER_THE_CHECK),
        (3, PER_ROUND),
    ],
    ids=["n2", "n3", "n4", "n2-segments", "n3-segments", "n4-segments-after-check", "n3-per-round"],
)
def test_reduce_scatter_shard_is_the_independent_fold_on_every_rank(
    rings: Rings, n: int, settings: dict[str, object]
) -> None:
    """Every dtype, ring and layout (contiguous and not), and every op on float32: rank ``r`` holds
    chunk ``r`` folded over ``r + d, ..., r``; the input is unchanged.  The inputs make another
    fold order give other bits (checked), so this pins the order."""
    cases: list[Case] = []
    for d, dtype in enumerate(DTYPES):
        for s, (schedule, _) in enumerate(SCHEDULES.values()):
            shape = (3 * n, 2) if s % 2 else (5 * n,)
            cases.append((stacked(n, shape, dtype, seed=100 * n + 10 * d + s), schedule, "sum", s % 2 == 1))
    for o, op in enumerate(("prod", "max", "min", "avg")):
        cases.append(
            (stacked(n, (2 * n, 3), torch.float32, seed=7 + o), "gloo" if o % 2 else None, op, o < 2)
        )
    per_rank = rings(n).run(reduce_scatter_rows, (settings, cases), timeout_s=CALL_TIMEOUT_S)
    order_sensitive = 0
    directions = {repr(s): d for s, d in SCHEDULES.values()}
    for k, (x, schedule, op, _) in enumerate(cases):
        direction = directions[repr(schedule)]
        for rank in range(n):
            got, kept = per_rank[rank][k]
            expected = shard_fold(x, rank, direction, op)
            assert kept, (rank, k)
            assert same_bits(got, expected), f"rank {rank}, case {k} ({x.dtype}, {schedule}, {op})"
            rows = x.shape[1] // n
            in_rank_order = x[0, rank * rows : (rank + 1) * rows].clone()
            for other in range(1, n):
                in_rank_order = in_rank_order + x[other, rank * rows : (rank + 1) * rows]
            order_sensitive += op == "sum" and not same_bits(in_rank_order, expected)
    # N = 2 has one order up to commutation; from 3 on, the fold in rank order gives other bits somewhere.
    assert order_sensitive > 0 if n >= 3 else order_sensitive == 0


def gather_rows(
    rank: int, world_size: int, payload: tuple[dict[str, object], list[Case]]
) -> list[tuple[torch.Tensor, torch.Tensor, bool]]:
    """On each rank: all-gather ``x[rank]`` into a fresh output, and into an output whose own slot
    holds the input (FSDP2's in-place gather); return both and whether the input was unchanged."""
    settings, cases = payload
    results = []
    with tuned(settings):
        for x, schedule, _, strided in cases:
            mine = x[rank].clone()
            out = torch.full((world_size * x.shape[1], *x.shape[2:]), 7.0, dtype=x.dtype)
            if strided:
                mine, out = _column_major(mine), _column_major(out)
            before = mine.clone()
            assert ring_all_gather_(out, mine, schedule=cast(Any, schedule)) is out
            in_place = torch.zeros((world_size * x.shape[1], *x.shape[2:]), dtype=x.dtype)
            slot = in_place.view(world_size, -1)[rank].view(x.shape[1:])
            slot.copy_(mine)
            ring_all_gather_(in_place, slot, schedule=cast(Any, schedule))
            results.append((out, in_place, same_bits(mine, before)))
    return results


@pytest.mark.clause("dist-all-gather")
@pytest.mark.parametrize(
    ("n", "settings"),
    [
        (2, {}),
        (3, {}),
        (4, {}),
        (2, EXCHANGE_SEGMENTS | AFTER_THE_CHECK),
        (4, SMALL_SEGMENTS),
        (3, AFTER_THE_CHECK),
        (3, PER_ROUND),
    ],
    ids=["n2", "n3", "n4", "n2-segments-after-check", "n4-segments", "n3-after-check", "n3-per-round"],
)
def test_all_gather_copies_every_bit_into_rank_order_on_every_rank(
    rings: Rings, n: int, settings: dict[str, object]
) -> None:
    """NaN payloads, signed zeros, infinities and subnormals (which an all-reduce refuses) come back
    bit for bit, shard ``r`` in rows ``r*S ...``, for every ring, contiguous or not, in place or not."""
    cases: list[Case] = []
    for d, dtype in enumerate(DTYPES):
        cases.append((special_values(n, dtype), None, "sum", False))
        for s, (schedule, _) in enumerate(SCHEDULES.values()):
            cases.append((stacked(n, (3, 2), dtype, seed=50 * n + 10 * d + s), schedule, "sum", s % 2 == 1))
    per_rank = rings(n).run(gather_rows, (settings, cases), timeout_s=CALL_TIMEOUT_S)
    for k, (x, schedule, _, _) in enumerate(cases):
        expected = bits(torch.cat(list(x.unbind(0))))
        for rank in range(n):
            out, in_place, unchanged = per_rank[rank][k]
            assert unchanged, (rank, k)
            assert torch.equal(bits(out), expected), f"rank {rank}, case {k} ({x.dtype}, {schedule})"
            assert torch.equal(bits(in_place), expected), f"rank {rank}, case {k} in place"


def count_gather_exchanges(rank: int, world_size: int, settings: dict[str, object]) -> tuple[list[int], int]:
    """On each rank: one all-gather of 1024 float32; the bytes each ``alltoall`` sent and the
    point-to-point sends made."""
    sizes: list[int] = []
    sends = 0
    real_all_to_all = _transport._all_to_all

    def all_to_all(*args: Any, **kwargs: Any) -> Any:
        sizes.append(args[2].numel() * args[2].element_size())
        return real_all_to_all(*args, **kwargs)

    def counting_send(real: Any) -> Any:
        def send(*args: Any, **kwargs: Any) -> Any:
            nonlocal sends
            sends += 1
            return real(*args, **kwargs)

        return send

    group = torch.distributed.group.WORLD
    assert group is not None
    shard = torch.arange(1024, dtype=torch.float32) + rank
    out = torch.empty(world_size * 1024)
    with (
        tuned(settings),
        mock.patch.object(_transport, "_all_to_all", all_to_all),
        mock.patch.object(type(group), "send", counting_send(type(group).send)),
    ):
        ring_all_gather_(out, shard)
    expected = torch.cat([torch.arange(1024, dtype=torch.float32) + r for r in range(world_size)])
    assert torch.equal(out, expected)
    return sizes, sends


@pytest.mark.parametrize("n", [2, 3])
def test_all_gathers_first_round_travels_with_the_check(rings: Rings, n: int) -> None:
    """A shard within :data:`ring_ref.distributed.LEAD_BYTES` rides in the check's message to the
    right neighbour, as reduce-scatter's first chunk does: on two ranks the whole all-gather is
    that one exchange; on three, one point-to-point round remains.  With the lead turned off the
    first round costs an exchange of its own (two ``alltoall`` calls on two ranks, two sends on
    three)."""
    shard_bytes = 1024 * 4
    for settings, rounds_after in [({}, n - 2), (AFTER_THE_CHECK, n - 1)]:
        for sizes, sends in rings(n).run(count_gather_exchanges, settings, timeout_s=CALL_TIMEOUT_S):
            check, *others = sizes
            carried = check >= shard_bytes
            assert carried == (not settings), (settings, sizes)
            if n == 2:
                assert (len(others), sends) == (rounds_after, 0), (settings, sizes, sends)
            else:
                assert (others, sends) == ([], rounds_after), (settings, sizes, sends)


# --- bad input ----------------------------------------------------------------------------------

BadCase = tuple[str, Any, type[Exception], str]
"""Which call, ``f(rank, n) -> (output, input, schedule)``, the exception and a part of its message."""


def _rs(out: Any, inp: Any, schedule: object = None) -> tuple[Any, Any, object]:
    return out, inp, schedule


BAD_CASES: dict[str, BadCase] = {
    "rs-output-shape-on-one-rank": (
        "reduce-scatter",
        lambda r, n: _rs(torch.zeros(2 if r == 1 else 1), torch.zeros(n)),
        ValueError,
        "rank 1: the output has shape (2,); a reduce-scatter of an input of shape (N,) over N = N ranks",
    ),
    "rs-input-rows-not-divisible": (
        "reduce-scatter",
        lambda r, n: _rs(torch.zeros(1), torch.zeros(n + 1)),
        ValueError,
        "reduce-scatter gives every rank M / N rows, but M = N+1 is not divisible by N = N",
    ),
    "rs-offset-not-direction": (
        "reduce-scatter",
        lambda r, n: _rs(torch.zeros(1), torch.zeros(n), RingSchedule(1, 0, "even")),
        ValueError,
        "Use RingSchedule(1, 1, 'even') or a preset name",
    ),
    "rs-gloo-layout-unequal": (  # gloo's layout cuts 3 float32 elements of 3 ranks into 2, 1, 0
        "reduce-scatter",
        lambda r, n: _rs(torch.zeros(1), torch.zeros(n), "gloo"),
        ValueError,
        "layout cuts the",
    ),
    "rs-nan-on-one-rank": (
        "reduce-scatter",
        lambda r, n: _rs(torch.zeros(1), torch.tensor([float("nan") if r == 2 else 1.0] * n)),
        ValueError,
        "rank 2: input: inputs must be finite",
    ),
    "rs-output-dtype": (
        "reduce-scatter",
        lambda r, n: _rs(torch.zeros(1, dtype=torch.float64), torch.zeros(n)),
        TypeError,
        "output: a torch.strided torch.float64 tensor on cpu, but the input is a torch.strided torch.float32",
    ),
    "rs-output-not-a-tensor": (
        "reduce-scatter",
        lambda r, n: _rs([0.0] if r == 0 else torch.zeros(1), torch.zeros(n)),
        TypeError,
        "rank 0: output: expects a torch.Tensor; got list",
    ),
    "rs-input-differs": (
        "reduce-scatter",
        lambda r, n: _rs(torch.zeros(2 if r == 0 else 1), torch.zeros(2 * n if r == 0 else n)),
        ValueError,
        "the ranks passed different tensors",
    ),
    "rs-schedule-differs": (
        "reduce-scatter",
        lambda r, n: _rs(torch.zeros(2), torch.zeros(2 * n), "gloo" if r == 1 else None),
        ValueError,
        "the ranks passed different tensors, ops or schedules",
    ),
    "ag-output-shape": (
        "all-gather",
        lambda r, n: _rs(torch.zeros(n + 1), torch.zeros(1)),
        ValueError,
        "the output has shape (N+1,); an all-gather of an input of shape (1,) over N = N ranks gives shape",
    ),
    "ag-output-expanded": (
        "all-gather",
        lambda r, n: _rs(torch.zeros(1, 2).expand(n, 2), torch.zeros(1, 2)),
        ValueError,
        "the layout (strides (0, 1)) lets elements share memory",
    ),
    "ag-input-not-a-tensor": (
        "all-gather",
        lambda r, n: _rs(torch.zeros(n), 1.0 if r == 1 else torch.zeros(1)),
        TypeError,
        "rank 1: input: expects a torch.Tensor of shape (M, ...); got float",
    ),
    "ag-int-input": (
        "all-gather",
        lambda r, n: _rs(torch.zeros(n, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)),
        TypeError,
        "unsupported dtype torch.int32",
    ),
}


def reject_bad_inputs(rank: int, world_size: int, names: list[str]) -> list[tuple[str, str, bool]]:
    """Call with each bad input; record the exception and whether the arguments were left unchanged;
    then a good call of each (the group is still usable and nothing was left pending)."""
    seen = []
    for name in names:
        collective, make, _, _ = BAD_CASES[name]
        out, inp, schedule = make(rank, world_size)
        before = copy.deepcopy((out, inp))
        call = ring_reduce_scatter_ if collective == "reduce-scatter" else ring_all_gather_
        try:
            call(out, inp, schedule=schedule)
        except (TypeError, ValueError) as exc:
            unchanged = all(
                same_bits(a, b) if isinstance(a, torch.Tensor) else a == b
                for a, b in zip(before, (out, inp), strict=True)
            )
            seen.append((type(exc).__name__, str(exc), unchanged))
        else:
            seen.append(("no exception", "", False))
    shard = torch.zeros(1)
    ring_reduce_scatter_(shard, torch.ones(world_size) * (rank + 1))
    gathered = torch.zeros(world_size)
    ring_all_gather_(gathered, torch.tensor([float(rank)]))
    seen.append(("ok", str((shard.tolist(), gathered.tolist())), True))
    return seen


@pytest.mark.clause("dist-shards-bad-input")
def test_bad_input_is_rejected_identically_on_every_rank_and_nothing_is_written(rings: Rings) -> None:
    n = 3
    names = list(BAD_CASES)
    per_rank = rings(n).run(reject_bad_inputs, names, timeout_s=CALL_TIMEOUT_S)
    for k, name in enumerate(names):
        collective, _, kind, text = BAD_CASES[name]
        text = text.replace("N+1", str(n + 1)).replace("(N,)", f"({n},)").replace("N = N", f"N = {n}")
        outcomes = {per_rank[rank][k] for rank in range(n)}
        assert len(outcomes) == 1, f"{name}: ranks disagree: {outcomes}"
        exc_name, message, unchanged = outcomes.pop()
        call = "ring_reduce_scatter_" if collective == "reduce-scatter" else "ring_all_gather_"
        assert (exc_name, text in message) == (kind.__name__, True), (name, message)
        assert message.startswith(f"{call} rejected the input on every rank"), message
        assert unchanged, name
    for rank in range(n):
        assert per_rank[rank][-1] == ("ok", str(([6.0], [0.0, 1.0, 2.0])), True)


def mismatched_collectives(rank: int, world_size: int, _: None) -> str:
    """Rank 0 calls an all-reduce, the others a reduce-scatter of the same input: all must refuse."""
    try:
        if rank == 0:
            ring_all_reduce_(torch.ones(world_size))
        else:
            ring_reduce_scatter_(torch.zeros(1), torch.ones(world_size))
    except ValueError as exc:
        return str(exc)
    return "accepted"


@pytest.mark.clause("dist-shards-bad-input")
def test_ranks_calling_different_collectives_are_refused_on_every_rank(rings: Rings) -> None:
    per_rank = rings(2).run(mismatched_collectives, None, timeout_s=CALL_TIMEOUT_S)
    for message in per_rank:
        assert "the ranks passed different tensors, ops or schedules" in message, message
        assert "reduce-scatter schedule direction +1, offset 1" in message, message


# --- timeouts -----------------------------------------------------------------------------------

FAILING_RANK = 1
CALL_TIMEOUT = datetime.timedelta(seconds=2)


def fail_in_shards(rank: int, world_size: int, payload: tuple[str, int]) -> tuple[str, bool]:
    """Rank 1 fails: never calls (``at_add = 0``) or raises at its ``at_add``-th reduce-scatter
    addition; the others report what they raised and whether their output is unchanged."""
    collective, at_add = payload
    x = torch.arange(4.0 * world_size) + rank
    out = torch.full((4,) if collective == "reduce-scatter" else (4 * world_size,), -1.0)
    if collective == "all-gather":
        x = x[:4].clone()
    call = ring_reduce_scatter_ if collective == "reduce-scatter" else ring_all_gather_
    if rank != FAILING_RANK:
        try:
            call(out, x, timeout=CALL_TIMEOUT)
        except RuntimeError as exc:
            return f"RuntimeError: {exc}", bool((out == -1.0).all())
        return "finished", False
    if at_add == 0:
        return "did not call", True
    with failing_add(at_add, rank):
        try:
            call(out, x, timeout=CALL_TIMEOUT)
        except OSError as exc:
            return f"OSError: {exc}", True
    return "finished", True


@pytest.mark.clause("dist-shards-timeout")
@pytest.mark.parametrize(
    ("collective", "at_add", "where"),
    [
        ("reduce-scatter", 0, r": checking every rank's tensor before the ring failed or timed out; "),
        (
            "reduce-scatter",
            1,
            r", reduce-scatter round \d: exchanging chunks with rank \d \(send\) and rank \d "
            r"\(receive\) failed or timed out; ",
        ),
        ("all-gather", 0, r": checking every rank's tensor before the ring failed or timed out; "),
    ],
    ids=["rs-never-calls", "rs-raises-mid-ring", "ag-never-calls"],
)
def test_a_failing_rank_makes_the_others_raise_within_the_calls_timeout(
    rings: Rings, collective: str, at_add: int, where: str
) -> None:
    """The ranks waiting on rank 1 return once the call's 2 s ``timeout`` expires (the group's is
    120 s), naming the call, the round and the neighbours; their output is still unwritten."""
    ring = rings(3)
    start = time.monotonic()
    per_rank = ring.run(fail_in_shards, (collective, at_add), timeout_s=60)
    assert time.monotonic() - start < GROUP_TIMEOUT_S / 4, "the call's timeout, not the group's, must apply"
    call = "ring_reduce_scatter_" if collective == "reduce-scatter" else "ring_all_gather_"
    # Mid-ring, only rank 2 waits on rank 1 (three ranks, two rounds: rank 0 gets its last chunk
    # from rank 2, who had it from rank 1 with the check); before the ring, everyone waits on it.
    for rank in (0, 2) if at_add == 0 else (2,):
        outcome, unwritten = per_rank[rank]
        assert re.match(f"RuntimeError: {call}: rank {rank} of 3{where}", outcome), outcome
        assert f"a peer probably raised, exited or did not call {call}" in outcome
        assert unwritten, "nothing is written before the check, nor a shard before the ring's end"
    ring.close()  # the timed-out group is left broken; the next case respawns a clean world
