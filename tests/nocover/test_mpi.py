"""``ring_ref.mpi``, ``MPI_Allreduce`` and the MPI launcher on real OpenMPI jobs on this machine.

One job of 4 ranks, started once with OpenMPI's ring allreduce algorithm
selected, serves every bit-for-bit test for N = 1 .. 4 through sub-communicators
(``comm.Split``); a job of 2 ranks serves the failure tests, the ones that
kill it last.  Every rank's bits are compared with the simulation
``ring_ref.ring_all_reduce`` *and* with the independent closed-form fold
``tests.common.oracles.ring_fold``.  Each call is bounded by a timeout, and every
job's processes must be gone when its fixture closes it.

Requires OpenMPI and mpi4py (``make test`` installs them: tools/ensure_mpi.sh
and the ``mpi`` extra); without them these tests fail, they are not skipped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._processes._mpi_job import MpiRing, RankFailed
from ring_ref._ranks._mpi import _check_comm, _Waiter
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._mpi import MpiRanks
from ring_ref.mpi import openmpi_allreduce_mca, ring_all_reduce_
from ring_ref.schedule import RingSchedule
from ring_ref.targets import mpi_allreduce
from tests.common import planted_mpi
from tests.common.oracles import ring_fold, same_bits
from tests.common.processes import Jobs, gone

Array = npt.NDArray[Any]
DTYPES = (np.float16, np.float32, np.float64)
CALL_TIMEOUT_S = 60.0
SHAPES = ((1, ()), (3, ()), (2, (3,)), (1, (2, 3)))
"""(rows per chunk, trailing shape) of the bit-for-bit cases."""


@pytest.fixture(scope="module")
def jobs() -> Iterator[Jobs]:
    pool = Jobs()
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def world4(jobs: Jobs) -> MpiRing:
    return jobs.ring(4, mca=openmpi_allreduce_mca("ring"))


@pytest.fixture(scope="module")
def world2(jobs: Jobs) -> MpiRing:
    return jobs.ring(2)


def stacked(n: int, rows_per_chunk: int, trailing: tuple[int, ...], dtype: type, seed: int) -> Array:
    """A seeded ``(N, M, ...)`` input with magnitudes spread over 10**-3 .. 10**3 (order-sensitive sums)."""
    rng = np.random.default_rng(seed)
    shape = (n, n * rows_per_chunk, *trailing)
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)).astype(dtype)


def _sub(comm: Any, n: int) -> Any:
    """The first ``n`` ranks of ``comm`` as a communicator (``COMM_NULL`` on the others); a collective."""
    from mpi4py import MPI

    return comm.Split(0 if comm.Get_rank() < n else MPI.UNDEFINED, comm.Get_rank())


def _layout(row: Array, layout: str) -> Array:
    """This rank's row laid out as asked: ``c`` contiguous, ``f`` column-major, ``strided`` every 2nd row."""
    if layout == "f":
        return np.asfortranarray(row)
    if layout == "strided":
        big = np.zeros((2 * row.shape[0], *row.shape[1:]), dtype=row.dtype)
        big[::2] = row
        return big[::2]
    return row.copy()


def reduce_rows(comm: Any, cases: list[tuple[Array, str]]) -> list[Array | None]:
    """On each rank: ring_all_reduce_ of ``x[rank]`` among the first N ranks; identity and strides kept."""
    return reduce_rows_with(comm, [(x, layout, "spec") for x, layout in cases])


def reduce_rows_with(comm: Any, cases: list[tuple[Array, str, str | RingSchedule]]) -> list[Array | None]:
    """:func:`reduce_rows` with a ``schedule=`` per case."""
    from mpi4py import MPI

    subs: dict[int, Any] = {}
    results: list[Array | None] = []
    for x, layout, schedule in cases:
        n = x.shape[0]
        sub = subs[n] if n in subs else subs.setdefault(n, _sub(comm, n))
        if sub == MPI.COMM_NULL:
            results.append(None)
            continue
        mine = _layout(x[comm.Get_rank()], layout)
        strides = mine.strides
        assert ring_all_reduce_(sub, mine, schedule=schedule) is mine
        assert mine.strides == strides
        results.append(mine)
    return results


def _target_rows(comm: Any, target: Any, xs: list[Array]) -> list[Array | None]:
    """On each rank: per-rank ``target(sub, x[rank])`` for each ``x``, ``sub`` its first N ranks."""
    from mpi4py import MPI

    results: list[Array | None] = []
    for x in xs:
        sub = _sub(comm, x.shape[0])
        if sub == MPI.COMM_NULL:
            results.append(None)
            continue
        mine = x[comm.Get_rank()].copy()
        target(sub, mine)
        results.append(mine)
    return results


def allreduce_rows(comm: Any, xs: list[Array]) -> list[Array | None]:
    """On each rank: ``MPI_Allreduce`` (the bundled target) of ``x[rank]`` among the first N ranks."""
    return _target_rows(comm, mpi_allreduce, xs)


def planted_rows(comm: Any, payload: tuple[str, list[Array]]) -> list[Array | None]:
    """On each rank: the planted per-rank target ``name`` on ``x[rank]`` among the first N ranks."""
    name, xs = payload
    return _target_rows(comm, getattr(planted_mpi, name), xs)


def _bit_cases() -> list[tuple[Array, str]]:
    cases: list[tuple[Array, str]] = []
    for n in (1, 2, 3, 4):
        for d, dtype in enumerate(DTYPES):
            for t, (rows, trailing) in enumerate(SHAPES):
                x = stacked(n, rows, trailing, dtype, seed=100 * n + 10 * d + t)
                cases.append((x, "c"))
                cases.append((x, "f" if trailing else "strided"))
        # Finite inputs whose sum overflows float16: the quick finiteness check (a sum) cannot vouch for
        # them, so the element-wise scan must, and the ring must still run (its sums overflow to inf).
        cases.append((np.full((n, 4 * n), 60000.0, dtype=np.float16), "c"))
    return cases


def _assert_every_rank_has(per_rank: list[list[Array | None]], k: int, expected: Array, what: str) -> None:
    for rank in range(len(per_rank)):
        got = per_rank[rank][k]
        if got is None:
            continue
        assert got.dtype == expected.dtype and got.shape == expected.shape, (what, rank)
        assert same_bits(torch.from_numpy(np.ascontiguousarray(got)), torch.from_numpy(expected)), (
            f"{what}, rank {rank}: {got} != {expected}"
        )


@pytest.mark.clause("fold-order", "chunk-layout", "ag-complete", "supported-dtypes")
def test_ring_all_reduce_gives_the_simulations_bits_on_every_rank(jobs: Jobs, world4: MpiRing) -> None:
    """Every dtype, N = 1 .. 4, contiguous and strided: the same bits as the simulation and the fold."""
    cases = _bit_cases()
    per_rank = jobs.run(world4, reduce_rows, cases)
    order_sensitive = {n: 0 for n in (1, 2, 3, 4)}
    for k, (x, layout) in enumerate(cases):
        n = x.shape[0]
        expected = ring_all_reduce(x)
        assert same_bits(torch.from_numpy(expected), ring_fold(torch.from_numpy(x)))
        assert sum(per_rank[r][k] is not None for r in range(4)) == n
        _assert_every_rank_has(per_rank, k, expected, f"case {k} ({x.dtype}, {x.shape}, {layout})")
        forward = x[0].copy()
        with np.errstate(over="ignore"):
            for i in range(1, n):
                forward = forward + x[i]
        order_sensitive[n] += not np.array_equal(forward, expected)
    # With N >= 3 the inputs make the plain 0..N-1 fold differ, so agreement is a real check of the
    # association order; with N <= 2 every order gives the same bits (IEEE addition commutes).
    assert order_sensitive[1] == order_sensitive[2] == 0
    assert order_sensitive[3] > 0 and order_sensitive[4] > 0


@pytest.mark.clause("fold-order")
def test_openmpi_ring_algorithm_sums_the_specs_fold(jobs: Jobs, world4: MpiRing) -> None:
    """Certification: OpenMPI's ``MPI_Allreduce`` with ``coll_tuned_allreduce_algorithm`` 4 (ring) gives
    the spec's bits for M divisible by N, N = 2 .. 4, float32 and float64 (MPI has no float16)."""
    xs = [
        stacked(n, rows, trailing, dtype, seed=1000 * n + 10 * d + t)
        for n in (2, 3, 4)
        for d, dtype in enumerate((np.float32, np.float64))
        for t, (rows, trailing) in enumerate(SHAPES)
    ]
    per_rank = jobs.run(world4, allreduce_rows, xs)
    for k, x in enumerate(xs):
        _assert_every_rank_has(per_rank, k, ring_all_reduce(x), f"MPI_Allreduce ring, {x.dtype} {x.shape}")
    assert any(not np.array_equal(x.sum(axis=0), ring_all_reduce(x)) for x in xs if x.shape[0] >= 3)


SCHEDULES: tuple[str | RingSchedule, ...] = ("openmpi-ring", "gloo", RingSchedule(-1, 2, "even"))


@pytest.mark.clause("schedule-family")
def test_ring_all_reduce_runs_every_ring_of_the_family_with_the_simulations_bits(
    jobs: Jobs, world4: MpiRing
) -> None:
    """``schedule=``: presets and a hand-made ring, every dtype, N = 1 .. 4, sizes not divisible by N."""
    cases: list[tuple[Array, str, str | RingSchedule]] = []
    for n in (1, 2, 3, 4):
        for d, dtype in enumerate(DTYPES):
            for schedule in SCHEDULES:
                even = isinstance(schedule, RingSchedule) and schedule.layout == "even"
                for t, shape in enumerate(((2 * n,), (n, 3)) if even else ((n + 1,), (3 * n + 2, 2), (1,))):
                    rng = np.random.default_rng(7 * n + 3 * d + t)
                    full = (n, *shape)
                    x = (rng.standard_normal(full) * 10.0 ** rng.integers(-3, 4, full)).astype(dtype)
                    cases.append((x, "f" if len(shape) > 1 else "c", schedule))
    per_rank = jobs.run(world4, reduce_rows_with, cases)
    for k, (x, layout, schedule) in enumerate(cases):
        expected = ring_all_reduce(x, schedule=schedule)
        _assert_every_rank_has(
            per_rank, k, expected, f"case {k} ({x.dtype}, {x.shape}, {layout}, {schedule})"
        )


def openmpi_ring_fold(x: Array) -> Array:
    """OpenMPI's ring allreduce, written from its block layout (independent of ``ring_ref``).

    The buffer of each rank is cut by *elements* (not rows): ``count`` elements
    into ``N`` blocks, the first ``count mod N`` one element longer; block
    ``c`` is the left fold over ranks ``c, c+1, ..., c-1``, as the spec's chunks
    are.  (For ``count < N`` OpenMPI does not run the ring at all.)
    """
    n = x.shape[0]
    flat = x.reshape(n, -1)
    count = flat.shape[1]
    out = np.empty(count, dtype=x.dtype)
    start = 0
    for c in range(n):
        stop = start + count // n + (c < count % n)
        acc = flat[c, start:stop].copy()
        with np.errstate(over="ignore"):
            for k in range(1, n):
                acc = acc + flat[(c + k) % n, start:stop]
        out[start:stop] = acc
        start = stop
    return out.reshape(x.shape[1:])


@pytest.mark.clause("fold-order")
def test_openmpi_ring_algorithm_on_any_size_is_the_fold_of_its_element_blocks(
    jobs: Jobs, world4: MpiRing
) -> None:
    """For ``count`` not divisible by N (and ``count >= N``) OpenMPI's ring folds uneven element blocks:
    the independent fold above, and ``ring_all_reduce(x, schedule="openmpi-ring")``."""
    rng = np.random.default_rng(5)
    xs = []
    for n in (3, 4):
        for shape in ((n + 1,), (3 * n + 2,), (1003 * n + 1,), (n + 1, 3), (2 * n - 1, 2)):
            for dtype in (np.float32, np.float64):
                full = (n, *shape)
                xs.append((rng.standard_normal(full) * 10.0 ** rng.integers(-4, 5, full)).astype(dtype))
    per_rank = jobs.run(world4, allreduce_rows, xs)
    ours = jobs.run(world4, reduce_rows_with, [(x, "c", "openmpi-ring") for x in xs])
    for k, x in enumerate(xs):
        expected = openmpi_ring_fold(x)
        preset = ring_all_reduce(x, schedule="openmpi-ring")
        assert same_bits(torch.from_numpy(preset), torch.from_numpy(expected))
        _assert_every_rank_has(per_rank, k, expected, f"MPI_Allreduce ring, {x.dtype} {x.shape}")
        _assert_every_rank_has(ours, k, expected, f"ring_all_reduce_ openmpi-ring, {x.dtype} {x.shape}")
    assert sum(not np.array_equal(x.sum(axis=0), openmpi_ring_fold(x)) for x in xs) > len(xs) // 2


def test_the_planted_bugs_base_ring_is_the_spec_and_each_bug_changes_it(jobs: Jobs, world4: MpiRing) -> None:
    """``tests/common/planted_mpi.py``: its plain ring gives the spec's bits; each planted bug changes
    them."""
    xs = [stacked(n, 2, (), dtype, seed=50 + n) for n in (2, 3, 4) for dtype in DTYPES]
    per_rank = jobs.run(world4, planted_rows, ("plain_ring", xs))
    for k, x in enumerate(xs):
        _assert_every_rank_has(per_rank, k, ring_all_reduce(x), f"plain_ring, {x.dtype} {x.shape}")
    for name in ("gather_adds", "chunk_off_by_one"):
        per_rank = jobs.run(world4, planted_rows, (name, xs))
        assert all(not np.array_equal(per_rank[0][k], ring_all_reduce(x)) for k, x in enumerate(xs)), name


BAD_CASES: dict[str, tuple[type[Exception], str]] = {
    "indivisible": (ValueError, "M = 5 is not divisible by N = 2"),
    "list-on-rank-1": (TypeError, "rank 1: expects a numpy.ndarray of shape (M, ...); got list."),
    "nan-on-rank-0": (ValueError, "rank 0: inputs must be finite: 1 element(s)"),
    "int-dtype": (TypeError, "unsupported dtype int32"),
    "read-only-on-rank-1": (ValueError, "rank 1: the sum is written in place, but the array is read-only"),
    "different-shapes": (
        ValueError,
        "different arrays (rank 0: shape (4,) float32, schedule direction +1, offset 0, layout even; "
        "rank 1: shape (6,) float32",
    ),
    "different-dtypes": (ValueError, "the ranks passed different arrays"),
    "unknown-schedule-on-rank-0": (ValueError, "rank 0: unknown schedule 'ring'; choose a preset"),
    "different-schedules": (ValueError, "schedule direction +1, offset 0, layout even; rank 1: shape (4,)"),
}


def _bad_argument(name: str, rank: int) -> object:
    base = np.arange(4, dtype=np.float32)
    if name == "indivisible":
        return np.zeros(5, dtype=np.float32)
    if name == "list-on-rank-1" and rank == 1:
        return [0.0, 1.0, 2.0, 3.0]
    if name == "nan-on-rank-0" and rank == 0:
        base[2] = np.nan
    if name == "int-dtype":
        return np.arange(4, dtype=np.int32)
    if name == "read-only-on-rank-1" and rank == 1:
        base.flags.writeable = False
    if name == "different-shapes" and rank == 1:
        return np.zeros(6, dtype=np.float32)
    if name == "different-dtypes" and rank == 1:
        return base.astype(np.float64)
    return base


def _bad_schedule(name: str, rank: int) -> str:
    if name == "unknown-schedule-on-rank-0" and rank == 0:
        return "ring"
    if name == "different-schedules" and rank == 1:
        return "gloo"
    return "spec"


def reject_everywhere(comm: Any, names: list[str]) -> list[tuple[str, str, bool]]:
    """On the first 2 ranks: each bad argument's (exception type, message, argument unchanged)."""
    from mpi4py import MPI

    sub = _sub(comm, 2)
    if sub == MPI.COMM_NULL:
        return []
    out = []
    for name in names:
        argument = _bad_argument(name, comm.Get_rank())
        before = np.array(argument, copy=True) if not isinstance(argument, list) else None
        try:
            ring_all_reduce_(sub, argument, schedule=_bad_schedule(name, comm.Get_rank()))  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            unchanged = before is None or np.array_equal(before, np.asarray(argument), equal_nan=True)
            out.append((type(exc).__name__, str(exc), unchanged))
        else:
            out.append(("accepted", "", True))
    return out


@pytest.mark.clause("bad-input")
def test_bad_input_raises_the_same_error_on_every_rank(jobs: Jobs, world4: MpiRing) -> None:
    names = list(BAD_CASES)
    per_rank = jobs.run(world4, reject_everywhere, names)
    assert per_rank[2] == per_rank[3] == []
    for k, name in enumerate(names):
        kind, fragment = BAD_CASES[name]
        got = [per_rank[r][k] for r in (0, 1)]
        assert got[0] == got[1], f"{name}: the ranks raised different errors: {got}"
        assert got[0][0] == kind.__name__ and fragment in got[0][1], (name, got[0])
        assert got[0][1].startswith("ring_all_reduce_ rejected the input on every rank: "), got[0][1]
        assert got[0][2], f"{name}: the argument was modified"


def test_bad_input_messages_are_the_simulations(jobs: Jobs, world4: MpiRing) -> None:
    """The problems the simulated ring also has are worded as it words them."""
    per_rank = jobs.run(world4, reject_everywhere, ["indivisible", "nan-on-rank-0", "int-dtype"])
    simulated = []
    for bad in (
        np.zeros((2, 5), np.float32),
        np.array([[0, 1, np.nan, 3], [0, 1, 2, 3]], np.float32),
        np.zeros((2, 4), np.int32),
    ):
        with pytest.raises((TypeError, ValueError)) as info:
            ring_all_reduce(bad)
        simulated.append(str(info.value).rstrip("."))
    for (_, message, _), expected in zip(per_rank[0], simulated, strict=True):
        tail = expected.replace("index (0, 2)", "index (2,)")  # the simulation indexes (worker, row)
        assert tail in message, (tail, message)


def plain_or_not(comm: Any, _: None) -> object:
    """Rank 1 returns a numpy array (which an untrusting parent must refuse), the others plain data."""
    return np.zeros(2) if comm.Get_rank() == 1 else ("bits", b"\x00\x01", [1, 2.5])


def test_an_untrusting_caller_accepts_only_plain_data(jobs: Jobs, world4: MpiRing) -> None:
    assert jobs.run(world4, plain_or_not, None)[0] == ("bits", b"\x00\x01", [1, 2.5])
    with pytest.raises(RankFailed) as info:
        world4.run(plain_or_not, None, timeout_s=CALL_TIMEOUT_S, trusted=False)
    assert info.value.ranks == [1] and not info.value.killed
    assert "numpy" in info.value.tracebacks[1] and "only plain data is accepted" in info.value.tracebacks[1]


def peer_never_calls(comm: Any, timeout_s: float) -> str:
    """Rank 0 calls ring_all_reduce_ with a timeout; rank 1 never does. Rank 0's error, or ``"returned"``."""
    if comm.Get_rank() == 1:
        return "did not call"
    try:
        ring_all_reduce_(comm, np.ones(4), timeout=timeout_s)
    except RuntimeError as exc:
        return str(exc)
    return "returned"


def peer_stops_after_the_check(comm: Any, timeout_s: float) -> str:
    """Rank 1 takes part in the check before the ring, then stops; rank 0 must time out in round 0."""
    x = np.ones(4)
    if comm.Get_rank() == 1:
        _check_comm(comm, x, 2, _Waiter(1, 2, None))
        return "stopped"
    try:
        ring_all_reduce_(comm, x, timeout=timeout_s)
    except RuntimeError as exc:
        return str(exc)
    return "returned"


def test_a_peer_that_never_calls_gives_an_error_not_a_hang(jobs: Jobs, world2: MpiRing) -> None:
    start = time.monotonic()
    got = jobs.run(world2, peer_never_calls, 1.0)
    assert got[1] == "did not call"
    assert "rank 0 of 2: checking every rank's array before the ring timed out after 1 s" in got[0], got[0]
    got = jobs.run(world2, peer_stops_after_the_check, 1.0)
    assert got[1] == "stopped"
    assert "rank 0 of 2, reduce-scatter round 0: exchanging chunks with rank 1 (send) and rank 1" in got[0]
    assert "timed out after 1 s" in got[0]
    assert time.monotonic() - start < 30
    assert world2.running, "a call that every rank answered must not cost the job"
    pids = world2.pids
    world2.close()
    deadline = time.monotonic() + 10
    left = [p for p in pids if not gone(p, max(0.0, deadline - time.monotonic()))]
    assert not left, f"close() left {left} behind"
    assert not world2.running and world2.pids == []


def _case(x: Array) -> Case:
    """``x`` (``(N, M)``, float32 or float64) as a difftest case: rank ``r`` gets ``x[r]``."""
    n, m = x.shape
    return Case(
        n,
        m,
        (),
        torch.float32 if x.dtype == np.float32 else torch.float64,
        "contiguous",
        tuple(float(v) for v in x.ravel()),
    )


def test_a_per_rank_target_is_called_on_every_rank_by_name(world4: MpiRing) -> None:
    """``MpiRanks``: each rank's result (returned array, else the argument after the call) comes back."""
    x = stacked(4, 2, (), np.float32, seed=9)
    expected = ring_all_reduce(x)
    for name, returned_none, right in [
        ("ring_ref.mpi:ring_all_reduce_", False, True),
        ("ring_ref.targets:mpi_allreduce", True, True),  # the job runs OpenMPI's ring algorithm
        ("tests.common.planted_mpi:plain_ring", True, True),
        ("tests.common.planted_mpi:gather_adds", True, False),
        ("tests.common.planted_mpi:chunk_off_by_one", True, False),
    ]:
        call = MpiRanks(name, CALL_TIMEOUT_S, rings={4: world4}).call(_case(x))
        assert call.failure is None and len(call.answers) == 4, name
        for rank, answer in enumerate(call.answers):
            assert answer.rank == rank and answer.returned_none == returned_none, (name, answer)
            assert answer.type_name == ("NoneType" if returned_none else "ndarray") and not answer.raised
            assert answer.result is not None and answer.result.values is not None, (name, answer)
            got = answer.result.values.numpy()
            assert np.array_equal(got, expected) == right, (name, rank, got)
            assert answer.argument is not None and answer.argument.values is not None
            assert np.array_equal(answer.argument.values.numpy(), got), "in place: the argument is the result"
    missing = MpiRanks("tests.common.planted_mpi:nothing_here", CALL_TIMEOUT_S, rings={4: world4}).call(
        _case(x)
    )
    assert missing.failure is not None and missing.failure.code == "crashed"
    assert "no attribute 'nothing_here'" in missing.failure.text
    assert world4.running


def test_a_deadlock_times_out_naming_each_rank_and_its_stack(world2: MpiRing) -> None:
    """The planted send-send deadlock (a per-rank target): both ranks named with stacks, nothing left."""
    world2.start()  # a new job after the close() above
    pids = world2.pids
    start = time.monotonic()
    call = MpiRanks("tests.common.planted_mpi:send_send_deadlock", 3.0, rings={2: world2}).call(
        _case(np.ones((2, 4)))
    )
    assert time.monotonic() - start < 20
    assert call.answers == () and call.failure is not None
    assert call.failure.code == "timed-out" and call.failure.ranks == (0, 1)
    assert "rank(s) [0, 1] did not finish" in call.failure.text
    first, second = call.failure.stack.split("rank 1:\n")
    assert first.startswith("rank 0:\n"), call.failure.stack
    assert "in send_send_deadlock" in first and "in send_send_deadlock" in second, call.failure.stack
    assert not world2.running
    assert all(gone(p) for p in pids), "the timed-out job (mpirun and every rank) must be gone"


def raise_while_peers_block(comm: Any, _: None) -> None:
    if comm.Get_rank() == 0:
        raise ValueError("rank 0 gives up")
    comm.Recv(np.zeros(1), source=0)


def test_a_rank_that_raises_while_its_peers_block_is_named_and_the_job_killed(
    jobs: Jobs, world4: MpiRing
) -> None:
    """(Run on the 4-rank job once the bit-for-bit tests are done with it: the kill costs no relaunch.)"""
    with pytest.raises(RankFailed) as info:
        jobs.run(world4, raise_while_peers_block, None, timeout_s=30.0)
    assert info.value.ranks == [0] and "rank 0 gives up" in info.value.tracebacks[0]
    assert info.value.killed and not world4.running
    assert sorted(info.value.stacks) == [1, 2, 3]
    assert all("in raise_while_peers_block" in stack for stack in info.value.stacks.values())


def dies_mid_ring(comm: Any, _: None) -> str:
    """Rank 1's process exits while rank 0 is inside ring_all_reduce_ (no timeout given)."""
    if comm.Get_rank() == 1:
        os._exit(3)
    ring_all_reduce_(comm, np.ones(4))
    return "returned"


def test_a_dead_peer_is_an_error_naming_it_not_a_hang(jobs: Jobs, world2: MpiRing) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        jobs.run(world2, dies_mid_ring, None, timeout_s=30.0)
    assert time.monotonic() - start < 25
    assert info.value.died == {1: "exited with code 3"}, str(info.value)
    assert not world2.running


@pytest.mark.soak
@pytest.mark.clause("fold-order")
@pytest.mark.parametrize("algorithm", ["ring", "segmented_ring"])
def test_openmpi_ring_algorithms_sum_the_specs_fold_on_many_inputs(jobs: Jobs, algorithm: str) -> None:
    """The certification on N = 2 .. 5 and many seeds and sizes, for both of OpenMPI's rings."""
    ring = jobs.ring(5, mca=openmpi_allreduce_mca(algorithm))
    xs = [
        stacked(n, rows, (), dtype, seed=seed)
        for n in (2, 3, 4, 5)
        for dtype in (np.float32, np.float64)
        for rows in (1, 2, 7, 64)
        for seed in range(5)
    ]
    per_rank = jobs.run(ring, allreduce_rows, xs, timeout_s=300)
    for k, x in enumerate(xs):
        _assert_every_rank_has(per_rank, k, ring_all_reduce(x), f"{algorithm}, {x.dtype} {x.shape}")
    ring.close()
