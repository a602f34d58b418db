"""difftest and reveal ``--collective`` on real process groups, and the findings about real engines.

Per-rank targets are ``TARGET(output, input)`` on gloo ranks (so torch's own
``reduce_scatter_tensor`` and ``all_gather_into_tensor`` are targets as they
are) and ``TARGET(comm, sendbuf, recvbuf)`` on MPI ranks.  The findings
(docs/guide/testing-collectives.md) are measured here: gloo's reduce-scatter
is its all-reduce's order, its all-gather after its reduce-scatter is its
all-reduce bit for bit, ``all_gather_single`` and ``reduce_scatter_single`` are
the same collectives; OpenMPI's ``Reduce_scatter_block`` sums every shard in
one tree, not a ring's fold, and its ``Allgather`` copies every bit.
Requires OpenMPI and mpi4py for the MPI part (they fail, not skip, without them).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from ring_ref import ring_all_reduce
from ring_ref._cli import main
from ring_ref._order import format_tree
from ring_ref._processes._gloo import SpawnedGroup
from ring_ref._reveal import reveal
from ring_ref.difftest import difftest
from ring_ref.difftest._mpi import MpiRanks
from ring_ref.difftest._orders import per_rank_target
from ring_ref.difftest._search import run_mode
from ring_ref.difftest._vocabulary import Collective, Mode
from tests.common import planted_mpi, planted_rank_impls
from tests.common.oracles import same_bits
from tests.common.planted_rank_impls import RankImpl
from tests.common.processes import Jobs

pytestmark = pytest.mark.clause("difftest-collectives")

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@pytest.mark.parametrize("bug", list(planted_rank_impls.COLLECTIVE_EXPECTED), ids=lambda f: f.__name__)
def test_planted_per_rank_bug_gets_its_code(bug: RankImpl) -> None:
    collective, code = planted_rank_impls.COLLECTIVE_EXPECTED[bug]
    mode = "order-free" if collective == "reduce-scatter" else "exact"
    report = difftest(bug, ranks="gloo", collective=collective, modes=mode, examples=6, seed=2, max_workers=3)  # type: ignore[arg-type]
    finding = report.modes[mode].finding
    assert finding is not None and finding.codes == [code], report.render()
    assert finding.ranks  # the ranks holding the wrong chunk / slot are named


def test_torch_reduce_scatter_is_the_gloo_ring_and_all_gathers_copy() -> None:
    rs = "torch.distributed:reduce_scatter_tensor"
    common = {"ranks": "gloo", "modes": "exact", "examples": 12, "seed": 3, "max_workers": 4}
    assert difftest(rs, collective="reduce-scatter", schedule="gloo", **common).verdict == "pass"  # type: ignore[arg-type]
    spec = difftest(rs, collective="reduce-scatter", **common)  # type: ignore[arg-type]
    finding = spec.modes["exact"].finding
    assert finding is not None and finding.codes == ["not-ring-order"], spec.render()
    for gather in ("torch.distributed:all_gather_into_tensor", "torch.distributed:all_gather_single"):
        report = difftest(gather, collective="all-gather", **common)  # type: ignore[arg-type]
        assert report.verdict == "pass", report.render()


def _rank_collectives(rank: int, n: int, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """On one gloo rank: all_reduce, reduce_scatter_tensor, all_gather_into_tensor of that shard,
    all_gather_single of it and reduce_scatter_single (torch 2.13 deprecates the ``_tensor`` names)."""
    warnings.simplefilter("ignore", FutureWarning)
    mine = x[rank].clone()
    reduced = mine.clone()
    dist.all_reduce(reduced)
    shard = torch.empty((x.shape[1] // n, *x.shape[2:]), dtype=x.dtype)
    dist.reduce_scatter_tensor(shard, mine)
    gathered, single = torch.empty_like(mine), torch.empty_like(mine)
    dist.all_gather_into_tensor(gathered, shard)
    dist.all_gather_single(single, shard)
    shard_single = torch.empty_like(shard)
    dist.reduce_scatter_single(shard_single, mine)
    return reduced, shard, gathered, single, shard_single


@pytest.mark.parametrize("n", [2, 3, 4])
def test_gloo_reduce_scatter_then_all_gather_is_its_all_reduce_bit_for_bit(n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    tried = 0
    with SpawnedGroup(n) as ring:
        for m in (n, 2 * n, 3 * n, 7 * n):  # M = N and 3N: gloo's segments cut the rows unevenly
            for dtype in DTYPES:
                scale = torch.exp2(torch.randint(-8, 8, (n, m, 2), generator=gen).double())
                x = (torch.randn(n, m, 2, generator=gen, dtype=torch.float64) * scale).to(dtype)
                gloo = ring_all_reduce(x, schedule="gloo")
                rows = m // n
                for r, (reduced, shard, gathered, single, shard_single) in enumerate(
                    ring.run(_rank_collectives, x, timeout_s=60)
                ):
                    assert same_bits(reduced, gloo), (n, m, dtype, r)
                    # the shard is rows r of gloo's all-reduce, in gloo's order, whatever the layout's cut
                    assert same_bits(shard, gloo[r * rows : (r + 1) * rows]), (n, m, dtype, r)
                    assert same_bits(gathered, reduced) and same_bits(single, reduced), (n, m, dtype, r)
                    assert same_bits(shard_single, shard), (n, m, dtype, r)
                    tried += 1
    assert tried == n * 4 * len(DTYPES)


def test_reveal_names_each_shard_of_the_gloo_reduce_scatter(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["reveal", "torch.distributed:reduce_scatter_tensor", "--ranks", "gloo", "-n", "4", "-m", "8"]
    assert main([*args, "--collective", "reduce-scatter"]) == 0
    out = capsys.readouterr().out
    # by hand: shard r folds r - 1, r - 2, ..., r (gloo's ring runs the other way, offset -1)
    for line in (
        "shard 0 (rank 0): fold 3,2,1,0",
        "shard 1 (rank 1): fold 0,3,2,1",
        "shard 2 (rank 2): fold 1,0,3,2",
        "shard 3 (rank 3): fold 2,1,0,3",
        "the reduce-scatter ring of preset(s): gloo",
    ):
        assert line in out, out
    assert main([*args[:-1], "6", "--collective", "reduce-scatter"]) == 2  # M = 6 is no multiple of N = 4
    assert "M a multiple of N" in capsys.readouterr().err


@pytest.fixture(scope="module")
def jobs() -> Iterator[Jobs]:
    pool = Jobs()
    for n in (1, 2, 4):
        pool.ring(n)
    yield pool
    pool.close()


def _run(
    jobs: Jobs, target: str, collective: Collective, mode: Mode, *, dtypes: tuple[torch.dtype, ...]
) -> str:
    launcher = MpiRanks(
        f"tests.common.planted_mpi:{target}", 60.0, rings={r.world_size: r for r in jobs.rings}
    )
    try:
        result = run_mode(
            launcher, mode, examples=4, seed=1, max_workers=2, dtypes=dtypes, collective=collective
        )
    finally:
        jobs.note()
    return "pass" if result.finding is None else ",".join(result.finding.codes)


@pytest.mark.parametrize("name", list(planted_mpi.COLLECTIVE_EXPECTED))
def test_planted_mpi_collectives_get_their_codes(jobs: Jobs, name: str) -> None:
    collective, code = planted_mpi.COLLECTIVE_EXPECTED[name]
    mode: Mode = "exact" if code is None or collective == "all-gather" else "order-free"
    got = _run(jobs, name, Collective(collective), mode, dtypes=(torch.float16, torch.float32))
    assert got == (code or "pass")


def test_openmpi_allgather_copies_and_reduce_scatter_block_sums_one_tree(jobs: Jobs) -> None:
    # MPI has no float16 type: OpenMPI's own collectives take float32 and float64
    wide = (torch.float32, torch.float64)
    assert _run(jobs, "openmpi_allgather", Collective.ALL_GATHER, "exact", dtypes=wide) == "pass"
    scatter = Collective.REDUCE_SCATTER
    assert _run(jobs, "openmpi_reduce_scatter_block", scatter, "order-free", dtypes=wide) == "pass"
    launcher = MpiRanks(
        "tests.common.planted_mpi:openmpi_reduce_scatter_block",
        60.0,
        rings={r.world_size: r for r in jobs.rings},
    )
    try:
        found = reveal(per_rank_target(launcher, Collective.REDUCE_SCATTER), 4, 8, "float32")
    finally:
        jobs.note()
    # every shard summed as one balanced tree, the same for every rank: no ring's fold, recursive doubling's
    assert {format_tree(t) for t in found.trees if t is not None} == {"((0+1)+(2+3))"}
    assert found.classification == "trees" and found.matches == ["recursive-doubling"]
