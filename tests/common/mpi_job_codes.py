"""Run under ``mpirun``: ``difftest(ranks="mpi-job")`` from inside the job, on the planted ``mpi4py`` targets.

``mpirun -n N python -m tests.common.mpi_job_codes OUT_DIR``: every rank calls
:func:`ring_ref.difftest.difftest` with ``ranks="mpi-job"`` on the correct ring
and on each planted bug of ``tests/common/planted_mpi.py`` that leaves no rank inside
the target, and writes ``OUT_DIR/rank-R.json`` (the codes per target).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ring_ref.difftest import difftest
from tests.common import planted_mpi

ENDS_THE_JOB = ("send_send_deadlock", "rank_1_raises")
"""Planted bugs that leave ranks inside the target: the job ends after their report."""
KILLS_A_RANK = ("exits_mid_call",)
"""Planted bugs that end a rank's process: ``mpirun`` ends the job (after rank 0's report)."""


def targets() -> list[str]:
    """The targets run in one job, by name: the correct ring first."""
    bugs = [name for name in planted_mpi.EXPECTED if name not in (*ENDS_THE_JOB, *KILLS_A_RANK)]
    return [f"tests.common.planted_mpi:{name}" for name in ("plain_ring", *bugs)]


def main(out: Path) -> None:
    """Every target on this rank; the rank's file."""
    from mpi4py import MPI  # here: the test imports this module outside MPI

    codes = {}
    for target in targets():
        report = difftest(
            target, ranks="mpi-job", modes=("order-free", "bound"), examples=8, seed=1, timeout=30
        )
        codes[target] = report.diagnoses
    (out / f"rank-{MPI.COMM_WORLD.Get_rank()}.json").write_text(json.dumps(codes))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
