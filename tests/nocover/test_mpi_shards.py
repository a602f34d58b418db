"""``ring_ref.mpi.ring_reduce_scatter_`` and ``ring_all_gather_`` on a real OpenMPI job under ``mpirun``.

One job of 4 ranks serves N = 2 .. 4 through sub-communicators (``comm.Split``), a job of 2 ranks the
timeout.  Every rank's output is compared bit for bit with the independent folds of ``tests.common.oracles``
(``shard_fold``: rank ``r``'s shard is chunk ``r`` folded over the ranks ``r + d, ..., r``) and, for
the all-gather, with every rank's input in rank order.  Requires OpenMPI and mpi4py (not skipped).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from ring_ref._processes._mpi_job import MpiRing
from ring_ref.mpi import ring_all_gather_, ring_reduce_scatter_
from ring_ref.schedule import RingSchedule
from tests.common.oracles import bits, shard_fold, special_values
from tests.common.processes import Jobs

Array = npt.NDArray[Any]
DTYPES = (np.float16, np.float32, np.float64)
SCHEDULES: tuple[tuple[object, int], ...] = (
    (None, 1),
    ("openmpi-ring", 1),
    ("gloo", -1),
    (RingSchedule(-1, -1, "even"), -1),
)
"""``schedule=`` and the direction of its reduce-scatter ring."""


@pytest.fixture(scope="module")
def jobs() -> Iterator[Jobs]:
    pool = Jobs()
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def world4(jobs: Jobs) -> MpiRing:
    return jobs.ring(4)


def _sub(comm: Any, n: int) -> Any:
    """The first ``n`` ranks of ``comm`` as a communicator (``COMM_NULL`` on the others); a collective."""
    from mpi4py import MPI

    return comm.Split(0 if comm.Get_rank() < n else MPI.UNDEFINED, comm.Get_rank())


def stacked(n: int, shape: tuple[int, ...], dtype: type, seed: int) -> Array:
    """A seeded ``(N, *shape)`` input with magnitudes over 10**-3 .. 10**3 (order-sensitive sums)."""
    rng = np.random.default_rng(seed)
    full = (n, *shape)
    return (rng.standard_normal(full) * 10.0 ** rng.integers(-3, 4, full)).astype(dtype)


Case = tuple[Array, object, bool]
"""The stacked input, ``schedule=``, and whether this rank's arrays are column-major."""


def shards_on_ranks(comm: Any, cases: list[Case]) -> list[tuple[Array, Array, Array, bool] | None]:
    """Per case, among its first N ranks: the reduce-scatter shard of ``x[rank]``, its all-gather
    into a fresh output and in place (the input in the output's own slot), and whether the input
    was left unchanged."""
    from mpi4py import MPI

    subs: dict[int, Any] = {}
    results: list[tuple[Array, Array, Array, bool] | None] = []
    for x, schedule, fortran in cases:
        n = x.shape[0]
        sub = subs[n] if n in subs else subs.setdefault(n, _sub(comm, n))
        if sub == MPI.COMM_NULL:
            results.append(None)
            continue
        rank = sub.Get_rank()
        mine = np.asfortranarray(x[rank]) if fortran else x[rank].copy()
        before = mine.copy()
        shard = np.full((x.shape[1] // n, *x.shape[2:]), np.nan, dtype=x.dtype)
        shard = np.asfortranarray(shard) if fortran else shard
        assert ring_reduce_scatter_(sub, shard, mine, schedule=schedule) is shard  # type: ignore[arg-type]
        gathered = np.zeros((n * x.shape[1], *x.shape[2:]), dtype=x.dtype)
        gathered = np.asfortranarray(gathered) if fortran else gathered
        ring_all_gather_(sub, gathered, mine, schedule=schedule)  # type: ignore[arg-type]
        in_place = np.zeros((n * x.shape[1], *x.shape[2:]), dtype=x.dtype)
        slot = in_place.reshape(n, -1)[rank].reshape(x.shape[1:])
        slot[...] = mine
        ring_all_gather_(sub, in_place, slot, schedule=schedule)  # type: ignore[arg-type]
        results.append((shard, gathered, in_place, before.tobytes() == mine.tobytes()))
    return results


def _bits(a: Array) -> torch.Tensor:
    return bits(torch.from_numpy(np.ascontiguousarray(a)))


@pytest.mark.clause("dist-mpi-shards")
def test_reduce_scatter_and_all_gather_give_the_independent_folds_and_copies(
    jobs: Jobs, world4: MpiRing
) -> None:
    cases: list[Case] = []
    for n in (2, 3, 4):
        for d, dtype in enumerate(DTYPES):
            for s, (schedule, _) in enumerate(SCHEDULES):
                shape = (5 * n,) if s == 0 else (3 * n, 2)  # gloo's layout cuts 6n elements evenly
                cases.append((stacked(n, shape, dtype, seed=100 * n + 10 * d + s), schedule, s == 1))
    per_rank = jobs.run(world4, shards_on_ranks, cases)
    order_sensitive = 0
    for k, (x, schedule, _) in enumerate(cases):
        n = x.shape[0]
        direction = dict(((repr(s), d) for s, d in SCHEDULES))[repr(schedule)]
        xt = torch.from_numpy(x)
        for rank in range(n):
            got = per_rank[rank][k]
            assert got is not None
            shard, gathered, in_place, unchanged = got
            expected = shard_fold(xt, rank, direction)
            assert torch.equal(_bits(shard), bits(expected)), (k, rank, x.dtype, schedule)
            every = bits(xt.reshape(n * x.shape[1], *x.shape[2:]))
            assert torch.equal(_bits(gathered), every) and torch.equal(_bits(in_place), every), (k, rank)
            assert unchanged, (k, rank)
            rows = x.shape[1] // n
            in_rank_order = xt[:, rank * rows : (rank + 1) * rows].sum(0, dtype=torch.float64).to(xt.dtype)
            order_sensitive += not torch.equal(bits(in_rank_order), bits(expected))
    assert order_sensitive > 0, "the inputs cannot tell fold orders apart"


@pytest.mark.clause("dist-mpi-shards")
def test_all_gather_copies_nan_payloads_signed_zeros_and_subnormals(jobs: Jobs, world4: MpiRing) -> None:
    cases: list[Case] = [
        (special_values(n, dt).numpy(), None, False) for n in (2, 4) for dt in (torch.float16, torch.float32)
    ]
    per_rank = jobs.run(world4, gather_only, cases)
    for k, (x, _, _) in enumerate(cases):
        n = x.shape[0]
        for rank in range(n):
            got = per_rank[rank][k]
            assert got is not None
            assert torch.equal(_bits(got), bits(torch.from_numpy(x).reshape(n * x.shape[1], *x.shape[2:])))


def gather_only(comm: Any, cases: list[Case]) -> list[Array | None]:
    """Per case: the all-gather of ``x[rank]`` among its first N ranks (values a reduction refuses)."""
    from mpi4py import MPI

    out: list[Array | None] = []
    for x, schedule, _ in cases:
        n = x.shape[0]
        sub = _sub(comm, n)
        if sub == MPI.COMM_NULL:
            out.append(None)
            continue
        gathered = np.zeros((n * x.shape[1], *x.shape[2:]), dtype=x.dtype)
        out.append(ring_all_gather_(sub, gathered, x[sub.Get_rank()].copy(), schedule=schedule))  # type: ignore[arg-type]
    return out


BAD: dict[str, tuple[str, type[Exception], str]] = {
    # name: (collective, exception, part of its message); the arguments are made in bad_arguments
    "rs-output-shape-on-rank-1": ("reduce-scatter", ValueError, "rank 1: the output has shape (3,)"),
    "rs-offset-not-direction": ("reduce-scatter", ValueError, "Use RingSchedule(1, 1, 'even')"),
    "rs-nan-on-rank-0": ("reduce-scatter", ValueError, "rank 0: input: inputs must be finite"),
    "rs-read-only-output": ("reduce-scatter", ValueError, "output: the sum is written in place"),
    "ag-output-dtype": ("all-gather", TypeError, "output: dtype float64, but the input's is float32"),
    "ag-input-differs-on-rank-1": ("all-gather", ValueError, "the ranks passed different arrays"),
}


def bad_arguments(name: str, rank: int) -> tuple[Array, Array, object]:
    """``(output, input, schedule)`` of case ``name`` on ``rank`` of 2."""
    out, inp, schedule = np.zeros(2, np.float32), np.arange(4, dtype=np.float32), None
    if name.startswith("ag-"):
        out, inp = np.zeros(4, np.float32), np.arange(2, dtype=np.float32)
    if name == "rs-output-shape-on-rank-1" and rank == 1:
        out = np.zeros(3, np.float32)
    if name == "rs-offset-not-direction":
        schedule = RingSchedule(1, 0, "even")
    if name == "rs-nan-on-rank-0" and rank == 0:
        inp[1] = np.nan
    if name == "rs-read-only-output":
        out.flags.writeable = False
    if name == "ag-output-dtype":
        out = np.zeros(4, np.float64)
    if name == "ag-input-differs-on-rank-1" and rank == 1:
        out, inp = np.zeros(6, np.float32), np.arange(3, dtype=np.float32)
    return out, inp, schedule


def reject_everywhere(comm: Any, names: list[str]) -> list[tuple[str, str, bool]]:
    """On the first 2 ranks: per case the exception's type and message and whether the arguments
    were left unchanged."""
    from mpi4py import MPI

    sub = _sub(comm, 2)
    if sub == MPI.COMM_NULL:
        return []
    seen = []
    for name in names:
        out, inp, schedule = bad_arguments(name, comm.Get_rank())
        before = (out.copy(), inp.copy())
        call = ring_reduce_scatter_ if name.startswith("rs-") else ring_all_gather_
        try:
            call(sub, out, inp, schedule=schedule)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(before, (out, inp), strict=True))
            seen.append((type(exc).__name__, str(exc), same))
        else:
            seen.append(("accepted", "", True))
    return seen


@pytest.mark.clause("dist-mpi-shards")
def test_bad_input_raises_the_same_error_on_every_rank(jobs: Jobs, world4: MpiRing) -> None:
    names = list(BAD)
    per_rank = jobs.run(world4, reject_everywhere, names)
    for k, name in enumerate(names):
        collective, kind, fragment = BAD[name]
        got = [per_rank[r][k] for r in (0, 1)]
        assert got[0] == got[1], f"{name}: the ranks raised different errors: {got}"
        call = "ring_reduce_scatter_" if collective == "reduce-scatter" else "ring_all_gather_"
        assert got[0][1].startswith(f"{call} rejected the input on every rank: "), got[0][1]
        assert (got[0][0], fragment in got[0][1], got[0][2]) == (kind.__name__, True, True), (name, got[0])


def peer_never_calls(comm: Any, collective: str) -> str:
    """Rank 0 calls with a 1 s timeout; rank 1 never does.  Rank 0's error, or ``"returned"``."""
    if comm.Get_rank() == 1:
        return "did not call"
    try:
        if collective == "reduce-scatter":
            ring_reduce_scatter_(comm, np.zeros(2), np.ones(4), timeout=1.0)
        else:
            ring_all_gather_(comm, np.zeros(4), np.ones(2), timeout=1.0)
    except RuntimeError as exc:
        return str(exc)
    return "returned"


@pytest.mark.clause("dist-mpi-shards")
def test_a_peer_that_never_calls_gives_an_error_not_a_hang(jobs: Jobs) -> None:
    world2 = jobs.ring(2)
    start = time.monotonic()
    for collective, call in (("reduce-scatter", "ring_reduce_scatter_"), ("all-gather", "ring_all_gather_")):
        got = jobs.run(world2, peer_never_calls, collective)
        assert got[1] == "did not call"
        assert got[0].startswith(
            f"{call}: rank 0 of 2: checking every rank's array before the ring timed out"
        )
    assert time.monotonic() - start < 30
    world2.close()
