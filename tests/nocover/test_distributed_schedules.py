"""``ring_all_reduce_(tensor, schedule=...)`` on real gloo processes: every ring of the family.

One process group per world size (2, 3 and 4 processes) runs many cases in one
call.  Each rank reduces its own row of a stacked input; the parent compares
every rank's bits with the simulation ``ring_all_reduce(x, schedule=...)`` and
with ``tests.common.oracles.schedule_fold`` on layouts typed in from the spec
(``blocks_bounds``, ``gloo_bounds``).  ``schedule="gloo"`` is also compared with
``torch.distributed.all_reduce`` itself on the same ranks.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import time
from collections.abc import Iterator
from typing import Any, cast
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # dist.GradBucket, which the stubs do not export

from ring_ref import ring_all_reduce
from ring_ref._processes._gloo import SpawnedGroup
from ring_ref._ranks import _plans, _torch
from ring_ref.distributed import RingHookState, ring_all_reduce_, ring_hook
from ring_ref.schedule import RingSchedule
from tests.common.oracles import blocks_bounds, gloo_bounds, pairwise_tree, same_bits, schedule_fold

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
CALL_TIMEOUT_S = 120.0
# (direction, offset, layout) of each ring tried, typed in: the presets and rings of other directions
# and offsets on every layout.
SCHEDULES: dict[str, tuple[int, int, str]] = {
    "spec": (1, 0, "even"),
    "openmpi-ring": (1, 0, "blocks"),
    "gloo": (-1, -1, "gloo"),
    "minus-1-offset-1-even": (-1, 1, "even"),
    "plus-1-offset-2-blocks": (1, 2, "blocks"),
    "minus-1-offset-0-blocks": (-1, 0, "blocks"),
    "plus-1-offset-minus-1-gloo": (1, -1, "gloo"),
}
PRESETS = ("spec", "openmpi-ring", "gloo")

Case = tuple[torch.Tensor, str, str, bool]  # stacked input, schedule, op, column-major per-rank tensor


def schedule_arg(name: str) -> str | RingSchedule:
    """The ``schedule=`` argument for a case: the preset's name, or a ``RingSchedule``."""
    return name if name in PRESETS else RingSchedule(*SCHEDULES[name])  # type: ignore[arg-type]


def stacked(n: int, m: int, trailing: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A seeded ``(N, M, ...)`` input with magnitudes spread over 2**-8 .. 2**8 (order-sensitive sums)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n, m, *trailing)
    scale = torch.exp2(torch.randint(-8, 9, shape, generator=gen).to(torch.float64))
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def shapes_for(n: int, layout: str) -> list[tuple[int, tuple[int, ...]]]:
    """``(M, trailing)``: ``M`` divisible by ``N`` for ``even``; any ``M`` (empty gloo chunks too) else."""
    if layout == "even":
        return [(2 * n, (3,)), (n, ())]
    # M = 1: every chunk but the first is empty under gloo's layout and all but one under blocks;
    # M = N (gloo, N = 4: chunks 2, 2, 0, 0), N + 1, 2N - 1 rows of 3, and 37 rows of 2.
    return [(1, ()), (n, ()), (n + 1, ()), (2 * n - 1, (3,)), (37, (2,))]


def cases_for(n: int) -> list[Case]:
    """Every ring x dtype x shape (sum), a few column-major tensors, and other ops on other rings."""
    cases: list[Case] = []
    for k, (name, (_, _, layout)) in enumerate(SCHEDULES.items()):
        for d, dtype in enumerate(DTYPES):
            for j, (m, trailing) in enumerate(shapes_for(n, layout)):
                x = stacked(n, m, trailing, dtype, seed=1000 * n + 100 * k + 10 * d + j)
                cases.append((x, name, "sum", bool(trailing) and d == 0))
    x = stacked(n, 2 * n + 1, (2,), torch.float32, seed=n)
    x[0, 0, 0], x[1, 0, 0] = -0.0, 0.0  # the signed-zero rule of max and min, in the first chunk
    x[0, -1, 1], x[1, -1, 1] = 0.0, -0.0  # and in the last, made on another rank
    if n == 4:  # one element: (x0 + x1) + (x2 + x3) = 0, where the ring's ((x0 + x1) + x2) + x3 = 1
        cases.append((torch.tensor([[1.0], [1e8], [-1e8], [1.0]]), "openmpi-ring", "sum", False))
    cases += [
        (x, "gloo", "max", False),
        (x, "plus-1-offset-2-blocks", "prod", True),
        (x, "gloo", "avg", False),
    ]
    return cases


def reduce_cases(
    rank: int, world_size: int, payload: tuple[dict[str, object], list[Case]]
) -> list[torch.Tensor]:
    """On each rank: reduce ``x[rank]`` in place with each case's ring and op (tuning constants patched)."""
    settings, cases = payload
    results = []
    with contextlib.ExitStack() as stack:
        for name, value in settings.items():
            stack.enter_context(mock.patch.object(_plans, name, value))
        for x, name, op, column_major in cases:
            mine = x[rank].clone()
            if column_major:
                mine = mine.transpose(0, -1).contiguous().transpose(0, -1)
                assert not mine.is_contiguous()
            ptr, strides = mine.data_ptr(), mine.stride()
            assert ring_all_reduce_(mine, schedule=schedule_arg(name), op=op) is mine
            assert (mine.data_ptr(), mine.stride()) == (ptr, strides)
            results.append(mine)
    return results


def oracle(x: torch.Tensor, name: str) -> torch.Tensor:
    """The ring's sum from the spec's fold order on layouts typed in from the spec (no ring_ref)."""
    n = x.shape[0]
    s = x[0].numel()
    if name == "openmpi-ring" and s < n:  # the name runs recursive doubling there (schedule-below-n),
        assert n <= 4  # whose tree is the pairwise one up to N = 4: (x0 + x1) + x2, (x0 + x1) + (x2 + x3)
        return pairwise_tree(list(x))
    direction, offset, layout = SCHEDULES[name]
    if layout == "even":
        bounds = [(c * s // n, (c + 1) * s // n) for c in range(n)]
    elif layout == "blocks":
        bounds = blocks_bounds(n, s)
    else:
        bounds = gloo_bounds(n, s, x.element_size())
    return schedule_fold(x, direction, offset, bounds)


@pytest.fixture(scope="module")
def rings() -> Iterator[dict[int, SpawnedGroup]]:
    pool: dict[int, SpawnedGroup] = {}
    with contextlib.ExitStack() as stack:
        for n in (2, 3, 4):
            pool[n] = stack.enter_context(SpawnedGroup(n, group_timeout_s=CALL_TIMEOUT_S))
        yield pool


SMALL_SEGMENTS: dict[str, object] = {"SEGMENT_BYTES": 8, "EXCHANGE_SEGMENT_BYTES": 8, "MAX_SEGMENTS": 1 << 30}
AFTER_THE_CHECK: dict[str, object] = {"LEAD_BYTES": 0}  # reduce-scatter's first step does not ride with it
PER_ROUND: dict[str, object] = {"_PIPELINED_BACKENDS": frozenset()}  # batch_isend_irecv (as for NCCL)
ROUNDS: dict[str, object] = {"SWAP_BYTES": 0}  # two ranks run rounds, not one swap
POINT_TO_POINT: dict[str, object] = ROUNDS | {"_EXCHANGE_RANKS": 1}  # two ranks on point-to-point sends too
EXCHANGES: dict[str, object] = {"_EXCHANGE_RANKS": 4}  # three ranks on alltoall rounds too
SETTINGS: dict[int, list[dict[str, object]]] = {
    2: [
        {},
        ROUNDS | SMALL_SEGMENTS,
        ROUNDS | SMALL_SEGMENTS | AFTER_THE_CHECK,
        POINT_TO_POINT | SMALL_SEGMENTS,
    ],
    3: [SMALL_SEGMENTS, SMALL_SEGMENTS | AFTER_THE_CHECK, PER_ROUND, EXCHANGES | SMALL_SEGMENTS],
    4: [{}, SMALL_SEGMENTS | {"SEGMENT_BYTES": 6}, SMALL_SEGMENTS | AFTER_THE_CHECK],
}


@pytest.mark.clause("schedule-family", "schedule-fold-order", "schedule-layouts", "schedule-below-n")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_ring_on_every_rank_equals_the_simulation(rings: dict[int, SpawnedGroup], n: int) -> None:
    """Whole chunks and segments of 1 to 4 elements (short chunks cut into empty segments), on
    ``alltoall`` rounds and on point-to-point sends, with reduce-scatter's first round carried by
    the check or sent after it, the per-round path, and two ranks swapping whole tensors: the
    simulation's bits on every rank."""
    cases = cases_for(n)
    expected = []
    order_sensitive = 0
    for x, name, op, _ in cases:
        want = ring_all_reduce(x, schedule=schedule_arg(name), op=op)
        if op == "sum":
            assert same_bits(want, oracle(x, name)), f"the simulation disagrees with the fold ({name})"
            forward = x[0]
            for i in range(1, n):
                forward = forward + x[i]
            order_sensitive += not same_bits(want, forward)
        expected.append(want)
    if n >= 3:
        assert order_sensitive > 0, "the inputs must tell the rings apart"
    for settings in SETTINGS[n]:
        per_rank = rings[n].run(reduce_cases, (settings, cases), timeout_s=CALL_TIMEOUT_S)
        for k, (x, name, op, _) in enumerate(cases):
            for rank in range(n):
                assert same_bits(per_rank[rank][k], expected[k]), (settings, name, op, x.dtype, x.shape, rank)


InputSpec = tuple[int, int, int, tuple[int, ...]]  # seed, N, M, trailing


def random_input(spec: InputSpec) -> torch.Tensor:
    """Seeded float32 ``(N, M, ...)`` with magnitudes over 2**-8 .. 2**8, the same in every process."""
    seed, n, m, trailing = spec
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-8, 9, (n, m, *trailing), generator=gen).float())
    return torch.randn(n, m, *trailing, generator=gen) * scale


def gloo_against_all_reduce(
    rank: int, world_size: int, specs: list[InputSpec]
) -> list[tuple[bool, torch.Tensor | None]]:
    """On each rank: whether ``ring_all_reduce_(schedule="gloo")`` gave ``dist.all_reduce``'s bits.

    The inputs are rebuilt from their seeds on every rank (the large one is not shipped); the
    ring's result comes back for the small ones.
    """
    out = []
    for spec in specs:
        x = random_input(spec)
        theirs, ours = x[rank].clone(), x[rank].clone()
        dist.all_reduce(theirs)
        ring_all_reduce_(ours, schedule="gloo")
        out.append((same_bits(ours, theirs), ours if ours.numel() < 1000 else None))
    return out


@pytest.mark.clause("schedule-presets")
@pytest.mark.parametrize("n", [2, 3, 4])
def test_gloo_schedule_equals_torch_distributed_all_reduce(rings: dict[int, SpawnedGroup], n: int) -> None:
    """Random float32, ``M`` not divisible by ``N``, and one input past gloo's ``2N`` segments of 1 MiB
    (more segments per chunk; chunks large enough to travel in several segments of the ring)."""
    shapes: list[tuple[int, tuple[int, ...]]] = [(n + 1, ()), (2 * n + 3, (3,)), (37, (2,))]
    shapes.append((((2 * n + 1) << 18) + 5, ()))
    specs = [(10 * n + k, n, m, trailing) for k, (m, trailing) in enumerate(shapes)]
    per_rank = rings[n].run(gloo_against_all_reduce, specs, timeout_s=CALL_TIMEOUT_S)
    differs = 0
    for k, spec in enumerate(specs):
        for rank in range(n):
            assert per_rank[rank][k][0], (spec, rank)
        ours = per_rank[0][k][1]
        if ours is not None:
            x = random_input(spec)
            assert same_bits(ours, ring_all_reduce(x, schedule="gloo"))
            differs += not same_bits(ours, ring_all_reduce(x, schedule="openmpi-ring"))
    assert differs > 0 or n == 2  # for N = 2 every order of one addition is the same


BadCase = tuple[Any, Any, type[Exception] | None, str]  # tensor maker, schedule maker, error, text


def bad_cases(n: int) -> dict[str, BadCase]:
    """Per case: each rank's tensor and ``schedule=`` (functions of the rank), the error and its text."""
    even = lambda r: torch.ones(2 * n)  # noqa: E731
    odd = lambda r: torch.ones(n + 1)  # noqa: E731
    return {
        "unknown-name": (even, lambda r: "ring", ValueError, "unknown schedule 'ring'"),
        "unknown-on-rank-1": (
            even,
            lambda r: "rings" if r == 1 else "spec",
            ValueError,
            "rank 1: unknown schedule 'rings'",
        ),
        "wrong-type-on-rank-0": (
            even,
            lambda r: 3 if r == 0 else "gloo",
            TypeError,
            "rank 0: schedule must be a preset name or a RingSchedule; got int",
        ),
        "direction-2": (
            even,
            lambda r: RingSchedule(2, 0, "even"),
            ValueError,
            "schedule direction must be +1",
        ),
        "unknown-layout": (
            even,
            lambda r: RingSchedule(1, 0, "diagonal"),  # type: ignore[arg-type]
            ValueError,
            "unknown schedule layout 'diagonal'",
        ),
        "even-layout-indivisible": (
            odd,
            lambda r: RingSchedule(-1, 1, "even"),
            ValueError,
            f"M = {n + 1} is not divisible by N = {n}",
        ),
        "spec-indivisible": (odd, lambda r: "spec", ValueError, f"M = {n + 1} is not divisible by N = {n}"),
        "differing-rings": (
            even,
            lambda r: "gloo" if r == n - 1 else "spec",
            ValueError,
            f"rank {n - 1}: shape ({2 * n},) torch.float32 on cpu, schedule direction -1, offset {n - 1}, "
            "layout gloo)",
        ),
        "differing-layouts": (
            odd,
            lambda r: "gloo" if r == 0 else "openmpi-ring",
            ValueError,
            "the ranks passed different tensors, ops or schedules",
        ),
        "nan-with-gloo": (
            lambda r: torch.tensor([float("nan") if r == 1 else 1.0] * (n + 1)),
            lambda r: "gloo",
            ValueError,
            "rank 1: inputs must be finite",
        ),
        "same-ring-written-twice": (
            even,
            lambda r: RingSchedule(1, n * r, "even") if r else "spec",
            None,
            "",
        ),
        "blocks-any-m": (odd, lambda r: "openmpi-ring", None, ""),
    }


def reject_bad(rank: int, world_size: int, names: list[str]) -> list[tuple[str, str, bool]]:
    """Call with each case; record the exception (or the result) and whether the input was unchanged."""
    cases = bad_cases(world_size)
    seen = []
    for name in names:
        make, ring, _, _ = cases[name]
        arg = make(rank)
        before = copy.deepcopy(arg)
        try:
            ring_all_reduce_(arg, schedule=ring(rank))
        except (TypeError, ValueError) as exc:
            seen.append((type(exc).__name__, str(exc), same_bits(arg, before)))
        else:
            seen.append(("ok", str(arg.tolist()), True))
    good = torch.ones(world_size)
    ring_all_reduce_(good, schedule="gloo")  # the group is still usable afterwards
    seen.append(("ok", str(good.tolist()), True))
    return seen


@pytest.mark.clause("schedule-bad-input")
@pytest.mark.parametrize("n", [2, 3])
def test_a_bad_or_differing_schedule_is_refused_identically_on_every_rank(
    rings: dict[int, SpawnedGroup], n: int
) -> None:
    """Every group size checks with one ``alltoall`` of signatures (carrying data too): the same errors."""
    cases = bad_cases(n)
    names = list(cases)
    per_rank = rings[n].run(reject_bad, names, timeout_s=CALL_TIMEOUT_S)
    for k, name in enumerate(names):
        _, _, kind, text = cases[name]
        outcomes = {per_rank[rank][k] for rank in range(n)}
        assert len(outcomes) == 1, f"{name}: ranks disagree: {outcomes}"
        exc_name, message, unchanged = outcomes.pop()
        if kind is None:
            assert exc_name == "ok", (name, message)
            assert message == str([float(n)] * len(cases[name][0](0))), (name, message)
            continue
        assert exc_name == kind.__name__, (name, exc_name, message)
        assert message.startswith("ring_all_reduce_ rejected the input on every rank: "), message
        assert text in message, (name, message)
        assert unchanged, name
    assert {per_rank[rank][-1] for rank in range(n)} == {("ok", str([float(n)] * n), True)}


class Bucket:
    """What ``ring_hook`` reads of DDP's ``GradBucket``: its flat buffer."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer


def hook_rows(rank: int, world_size: int, payload: tuple[torch.Tensor, list[str]]) -> list[torch.Tensor]:
    """On each rank: ``ring_hook`` on a bucket holding ``x[rank]``, once per schedule."""
    x, names = payload
    out = []
    for name in names:
        buffer = x[rank].clone()
        state = RingHookState(schedule=name)
        future = ring_hook(state, cast(GradBucket, Bucket(buffer)))
        assert future.wait() is buffer
        out.append(buffer)
    return out


@pytest.mark.clause("schedule-layouts")
def test_the_hook_pads_for_the_even_layout_only(rings: dict[int, SpawnedGroup]) -> None:
    """A bucket of 37 elements on 4 ranks: the spec's ring sums it zero-padded to 40; openmpi-ring and
    gloo sum it as it is (padding would move three elements into other blocks, and other bits)."""
    n = 4
    x = stacked(n, 37, (), torch.float32, seed=5)
    names = ["spec", "openmpi-ring", "gloo"]
    per_rank = rings[n].run(hook_rows, (x, names), timeout_s=CALL_TIMEOUT_S)
    padded = torch.cat([x, x.new_zeros(n, 3)], dim=1)
    expected = {
        "spec": ring_all_reduce(padded)[:37] / n,
        "openmpi-ring": ring_all_reduce(x, schedule="openmpi-ring") / n,
        "gloo": ring_all_reduce(x, schedule="gloo") / n,
    }
    assert not same_bits(expected["openmpi-ring"], ring_all_reduce(padded, schedule="openmpi-ring")[:37] / n)
    for k, name in enumerate(names):
        for rank in range(n):
            assert same_bits(per_rank[rank][k], expected[name]), (name, rank)


def fail_on_rank_1(rank: int, world_size: int, at: str) -> str:
    """Rank 1 never calls, raises at its first addition of the rounds, or raises instead of
    swapping; rank 0 calls with a 2 s ``timeout`` (the group's is 120 s) and reports how its call
    ended.

    Failing at the first addition needs the rounds, not the two-rank swap: a swap's only exchange
    (which is also the check) is over before the first addition, so a peer failing there cannot
    hold anybody up, and one that never swaps leaves the other waiting in the check, its tensor
    unchanged.
    """
    if rank == 1 and at == "never":
        return "did not call"
    planted = mock.Mock(side_effect=OSError("planted failure"))
    with contextlib.ExitStack() as stack:
        if at == "add":
            stack.enter_context(mock.patch.object(_plans, "SWAP_BYTES", 0))
        if rank == 1:
            stack.enter_context(
                mock.patch.object(*((torch, "add") if at == "add" else (_torch, "check_gloo")), planted)
            )
            try:
                ring_all_reduce_(torch.ones(4), timeout=datetime.timedelta(seconds=2))
            except OSError as exc:
                return f"OSError: {exc}"
            return "finished"
        mine = torch.ones(4)
        try:
            ring_all_reduce_(mine, timeout=datetime.timedelta(seconds=2))
        except RuntimeError as exc:
            return f"{exc} [tensor {'unchanged' if torch.equal(mine, torch.ones(4)) else 'changed'}]"
        return "finished"


@pytest.mark.parametrize(
    ("at", "where"),
    [
        ("never", ": checking every rank's tensor before the ring"),
        ("add", ", all-gather round 0: exchanging chunks"),
        ("swap", ": checking every rank's tensor before the ring"),
    ],
    ids=["never-calls", "raises-mid-ring", "raises-instead-of-swapping"],
)
def test_two_ranks_a_failing_peer_ends_the_call_within_its_timeout(
    rings: dict[int, SpawnedGroup], at: str, where: str
) -> None:
    """Two ranks check, and swap or run the ring, on ``alltoall`` collectives: their ``timeout``
    still ends the wait for a peer that never calls or fails mid-ring (each case tears the two-rank
    group down)."""
    start = time.monotonic()
    outcome = rings[2].run(fail_on_rank_1, at, timeout_s=60)
    assert time.monotonic() - start < CALL_TIMEOUT_S / 4
    assert outcome[1] == ("did not call" if at == "never" else "OSError: planted failure"), outcome
    assert outcome[0].startswith(f"ring_all_reduce_: rank 0 of 2{where}"), outcome[0]
    assert "failed or timed out; a peer probably raised, exited or did not call" in outcome[0]
    if at != "add":  # the swap writes only after its one exchange: nothing was written
        assert outcome[0].endswith("[tensor unchanged]"), outcome[0]
    rings[2].close()
