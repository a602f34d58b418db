"""``difftest --ranks mpi``: per-rank ``mpi4py`` targets checked on every rank of real OpenMPI jobs.

To keep ``make verify`` short, the fast tests share two jobs (``N = 1`` and
``N = 2``, each started once: every rank imports torch) through
``MpiRanks(rings=...)``; the deadlock test and the raising rank's run last, as
they kill the ``N = 2`` job.  Every process the jobs started must be gone when the module ends.
Requires OpenMPI and mpi4py (``make test`` installs them); without them these
tests fail, they are not skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch

from ring_ref._cli import main
from ring_ref.difftest import Mode, difftest
from ring_ref.difftest._mpi import MPI_DTYPES, MpiRanks
from ring_ref.difftest._report import ModeResult
from ring_ref.difftest._search import run_mode
from ring_ref.difftest._vocabulary import MODES, Op
from ring_ref.mpi import openmpi_allreduce_mca
from tests import planted_hints, planted_mpi
from tests.processes import Jobs

pytestmark = pytest.mark.clause("difftest-ranks")

_DTYPES = MPI_DTYPES


def run(
    jobs: Jobs,
    target: str,
    mode: Mode,
    *,
    examples: int,
    seed: int,
    timeout_s: float = 60.0,
    op: Op | None = None,
    dtypes: tuple[torch.dtype, ...] = _DTYPES,
) -> ModeResult:
    """One mode of the tester on ``target`` over the module's jobs (``N`` up to 2; the jobs stay open)."""
    launcher = MpiRanks(target, timeout_s, rings={ring.world_size: ring for ring in jobs.rings})
    try:
        return run_mode(launcher, mode, examples=examples, seed=seed, max_workers=2, dtypes=dtypes, op=op)
    finally:
        jobs.note()


@pytest.fixture(scope="module")
def jobs() -> Iterator[Jobs]:
    pool = Jobs()
    for n in (1, 2):
        pool.ring(n)
    yield pool
    pool.close()


@pytest.mark.clause("difftest-oracles", "fold-order")
def test_ring_all_reduce_underscore_passes_every_mode(jobs: Jobs) -> None:
    for mode in MODES:
        result = run(jobs, "ring_ref.mpi:ring_all_reduce_", mode, examples=4, seed=3)
        assert result.verdict == "pass", (mode, result.finding)
        assert result.examples >= 4


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.parametrize(
    ("bug", "mode"),
    [("gather_adds", "order-free"), ("chunk_off_by_one", "bound"), ("gather_drops_last_chunk", "exact")],
)
def test_planted_mpi_bug_gets_its_code(jobs: Jobs, bug: str, mode: Mode) -> None:
    result = run(jobs, f"tests.planted_mpi:{bug}", mode, examples=10, seed=1)
    finding, cex = result.finding, result.counterexample
    assert result.verdict == "fail" and finding is not None and cex is not None
    assert finding.codes == [planted_mpi.EXPECTED[bug]], finding.explanation
    assert cex.n == 2 and finding.ranks, finding.explanation
    if bug == "gather_adds":
        assert "counted more than once" in finding.explanation
    if bug == "gather_drops_last_chunk":  # the stacked twin's code and counts
        assert "Contributions missing: with only worker j holding ones" in finding.explanation
        assert re.search(r"is worker 0: \d, worker 1: \d, so worker\(s\) \[\d\] lost", finding.explanation)


@pytest.mark.clause("difftest-ops")
@pytest.mark.parametrize("op", ["prod", "max", "min"])
def test_mpi_allreduce_passes_order_free_and_bound_per_op(jobs: Jobs, op: Op) -> None:
    # MPI has no float16 type: MPI_Allreduce refuses it, so float32 and float64 only.
    for mode in ("order-free", "bound"):
        result = run(
            jobs, "ring_ref.targets:mpi_allreduce", mode, examples=6, seed=2, op=op, dtypes=_DTYPES[1:]
        )
        assert result.verdict == "pass", (op, mode, result.finding)


@pytest.mark.clause("difftest-ops")
def test_mpi_has_no_average_and_says_so(jobs: Jobs) -> None:
    result = run(
        jobs, "ring_ref.targets:mpi_allreduce", "bound", examples=1, seed=0, op="avg", dtypes=_DTYPES[1:]
    )
    assert result.finding is not None and result.finding.codes == ["raised"], result.finding
    assert "MPI (MPI_Op) has no op 'avg'" in result.finding.explanation


@pytest.mark.clause("difftest-diagnoses")
def test_send_send_deadlock_is_timed_out_with_every_ranks_stack(jobs: Jobs) -> None:
    result = run(jobs, "tests.planted_mpi:send_send_deadlock", "order-free", examples=5, seed=1, timeout_s=3)
    finding, cex = result.finding, result.counterexample
    assert finding is not None and cex is not None and finding.codes == ["timed-out"], finding
    assert cex.n == 2 and finding.ranks == [0, 1], finding.explanation
    for rank in (0, 1):
        assert f"rank {rank}:\n" in finding.stack
    assert finding.stack.count("in _exchange") == 2, finding.stack


@pytest.mark.clause("difftest-diagnoses")
@pytest.mark.timeout(60)  # far below the 120 s limit per call: the grace, not the time limit, ends it
def test_a_rank_that_raises_while_the_others_wait_is_raised_after_the_grace(jobs: Jobs) -> None:
    result = run(jobs, "tests.planted_mpi:rank_1_raises", "order-free", examples=5, seed=1, timeout_s=120)
    finding, cex = result.finding, result.counterexample
    assert finding is not None and cex is not None and finding.codes == ["raised"], finding
    assert cex.n == 2
    assert finding.explanation.startswith("raised: rank(s) [1]: raised RuntimeError: planted: rank 1 gives")
    assert "rank(s) [0] were still inside the call 2 s after rank(s) [1] raised" in finding.explanation
    assert "rank 1 raised:\nTraceback" in finding.stack and "in rank_1_raises" in finding.stack
    assert "rank 0:\n" in finding.stack  # where the stopped rank was waiting


def test_cli_refuses_mca_without_mpi_bad_mca_and_bfloat16(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["difftest", "ring_ref.mpi:ring_all_reduce_", "--examples", "1"]
    assert main([*base, "--ranks", "gloo", "--mca", "btl=self"]) == 2
    assert (
        "mca (--mca) options are passed to mpirun: they need ranks='mpi' (--ranks mpi)"
        in capsys.readouterr().err
    )
    assert main([*base, "--ranks", "mpi", "--mca", "btl"]) == 2
    assert "--mca takes KEY=VALUE" in capsys.readouterr().err
    assert main([*base, "--ranks", "mpi", "--dtypes", "bfloat16"]) == 2
    assert "numpy has no bfloat16" in capsys.readouterr().err
    with pytest.raises(ValueError, match="numpy has no bfloat16"):
        difftest("ring_ref.mpi:ring_all_reduce_", ranks="mpi", dtypes=[torch.bfloat16])


@pytest.mark.soak
@pytest.mark.clause("difftest-oracles")
def test_soak_openmpi_default_allreduce_passes_order_free_and_bound() -> None:
    report = difftest(
        "ring_ref.targets:mpi_allreduce", ranks="mpi", dtypes=_DTYPES[1:], examples=60, seed=5, max_workers=4
    )
    assert report.modes["order-free"].verdict == "pass", report.render()
    assert report.modes["bound"].verdict == "pass", report.render()
    # Its default is not the spec's ring order (recursive doubling and other trees for N >= 3).
    assert report.diagnoses == ["not-ring-order"], report.render()


@pytest.mark.soak
@pytest.mark.clause("difftest-oracles", "fold-order")
def test_soak_openmpi_ring_algorithm_passes_exact() -> None:
    report = difftest(
        "ring_ref.targets:mpi_allreduce",
        ranks="mpi",
        mca=openmpi_allreduce_mca("ring"),
        dtypes=_DTYPES[1:],
        examples=60,
        seed=6,
        max_workers=4,
    )
    assert report.verdict == "pass", report.render()
    assert "--mca coll_tuned_allreduce_algorithm=4" in report.replay


@pytest.mark.clause("difftest-raised-at")
def test_raised_on_mpi_ranks_names_the_target_s_line(jobs: Jobs) -> None:
    line, source = planted_hints.marked_line("mpi")
    result = run(jobs, f"{planted_hints.FILE}:mpi_raises", "bound", examples=2, seed=1)
    assert result.finding is not None and result.finding.codes == ["raised"]
    frame = result.to_json(1)["counterexample"].get("raised_at")
    assert frame == {"file": planted_hints.FILE, "line": line, "source": source}
    assert f" at {planted_hints.FILE}:{line}: {source}" in result.finding.explanation
