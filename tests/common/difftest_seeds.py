"""``difftest --mode exact --schedule PRESET`` at several seeds in one process: ``python -m
tests.common.difftest_seeds RANKS SEEDS DTYPES PRESET...`` (``RANKS``: ``mpi-job``, run under ``mpiexec -n
N``, or ``mlx``; ``SEEDS``: how many, from 0; ``DTYPES``: comma-separated, or ``all``).

It runs :func:`ring_ref.difftest.difftest` on the library's bundled target (``ring_ref.targets:
mpi_allreduce`` on every rank of the MPI job, or ``mlx_all_sum`` on MLX ranks the tester forks, ``N`` up
to 4) once per (seed, preset), so that ten seeds of every preset cost one job's (one process's) start;
rank 0 (the process, under ``mlx``) prints one JSON line per run: ``{"seed", "schedule", "verdict",
"codes", "counterexample"}``, the last ``[N, M, dtype]`` of exact's counterexample (``null`` on a
pass).  Under ``mlx`` this process must not import MLX (the ranks are forked from it).
"""

from __future__ import annotations

import json
import sys

TARGETS = {"mpi-job": "ring_ref.targets:mpi_allreduce", "mlx": "ring_ref.targets:mlx_all_sum"}


def main(ranks: str, seeds: int, dtypes: str, presets: list[str]) -> None:
    from ring_ref.difftest import DTYPES, difftest

    rank = 0
    if ranks == "mpi-job":
        from mpi4py import MPI  # imported under mpiexec only: an import initialises MPI

        rank = MPI.COMM_WORLD.Get_rank()
    chosen = None if dtypes == "all" else [DTYPES[name] for name in dtypes.split(",")]
    for seed in range(seeds):
        for preset in presets:
            report = difftest(
                TARGETS[ranks],
                ranks=ranks,  # type: ignore[arg-type]
                modes="exact",
                examples=30,
                seed=seed,
                max_workers=4 if ranks == "mlx" else None,
                schedule=preset,
                dtypes=chosen,
            )
            if rank == 0:
                line = {
                    "seed": seed,
                    "schedule": preset,
                    "verdict": report.verdict,
                    "codes": report.diagnoses,
                }
                case = report.modes["exact"].counterexample
                shown = None if case is None else [case.n, case.m, str(case.dtype).removeprefix("torch.")]
                print(json.dumps({**line, "counterexample": shown}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:])
