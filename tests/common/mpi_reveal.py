"""Reveal ``MPI_Allreduce`` under an MPI library's own ``mpiexec``: ``mpiexec -n N python -m
tests.common.mpi_reveal M``.

Rank 0 runs :func:`ring_ref._reveal.reveal` on a stacked target that hands each rank its row, calls
``MPI_Allreduce`` (sum) on every rank and checks that every rank got the same bits; the other ranks
serve until rank 0 is done.  Rank 0 prints one JSON line: ``{"n", "m", "matches", "ring"}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import torch


def _call(comm: Any, rows: Any) -> list[Any] | None:
    """One all-reduce of ``rows`` (rank 0's ``(N, M)`` array, broadcast); ``None`` once rank 0 is done."""
    rows = comm.bcast(rows, root=0)
    if rows is None:
        return None
    mine = np.ascontiguousarray(rows[comm.Get_rank()])
    out = np.empty_like(mine)
    from mpi4py import MPI  # here: pytest imports this module for its doctests, outside any MPI job

    comm.Allreduce(mine, out, op=MPI.SUM)
    gathered: list[Any] | None = comm.gather(out, root=0)
    return gathered if comm.Get_rank() == 0 else []


def main(m: int) -> None:
    from mpi4py import MPI  # imported under mpiexec only: an import initialises MPI (a singleton's orted)

    comm = MPI.COMM_WORLD
    if comm.Get_rank() != 0:
        while _call(comm, None) is not None:
            pass
        return
    from ring_ref._reveal import reveal

    def target(x: torch.Tensor) -> torch.Tensor:
        outs = _call(comm, x.numpy())
        assert outs is not None
        assert all(o.tobytes() == outs[0].tobytes() for o in outs), "the ranks disagree"
        return torch.from_numpy(outs[0].copy())

    found = reveal(target, comm.Get_size(), m, name="MPI_Allreduce")
    _call(comm, None)
    ring = None if found.ring is None else found.ring._asdict()
    print(json.dumps({"n": found.n, "m": m, "matches": found.matches, "ring": ring}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
