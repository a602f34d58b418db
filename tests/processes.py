"""Processes a test started, seen from outside: whether one is gone, and MPI jobs that must leave none.

:func:`gone` reads ``/proc`` (it trusts no harness's own account); :class:`Jobs`
holds the MPI jobs a test module shares and, on :meth:`~Jobs.close`, asserts
that every process any of them ever started (``mpirun`` and each rank) is gone.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from ring_ref._processes._mpi_job import MpiJob, mpirun_path

__all__ = ["Jobs", "gone"]


def gone(pid: int, within_s: float = 0.0) -> bool:
    """Whether process ``pid`` ends within ``within_s`` seconds (a zombie counts, and is reaped if ours)."""
    give_up = time.monotonic() + within_s
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return True
        if time.monotonic() >= give_up:
            return False
        time.sleep(0.01)


class Jobs:
    """The MPI jobs of one test module; on :meth:`close`, every process any of them started must be gone."""

    def __init__(self) -> None:
        mpirun_path()  # fail (not skip) with what to install when OpenMPI or mpi4py is missing
        self.rings: list[MpiJob] = []
        self.pids: set[int] = set()

    def ring(self, n: int, **kwargs: Any) -> MpiJob:
        """A job of ``n`` ranks (``MpiJob(n, **kwargs)``, started on first use), closed by :meth:`close`."""
        ring = MpiJob(n, **kwargs)
        self.rings.append(ring)
        return ring

    def note(self) -> None:
        """Remember the processes of every job now up (a job started again after a kill has new ones)."""
        for ring in self.rings:
            self.pids.update(ring.pids)

    def run(self, ring: MpiJob, fn: Any, payload: Any, timeout_s: float = 60.0) -> list[Any]:
        """``ring.run(fn, payload)``, its processes remembered first."""
        ring.start()
        self.note()
        return ring.run(fn, payload, timeout_s=timeout_s)

    def close(self) -> None:
        """Close every job; assert that within 10 s every process they started is gone."""
        self.note()
        for ring in self.rings:
            ring.close()
        deadline = time.monotonic() + 10
        left = [p for p in sorted(self.pids) if not gone(p, max(0.0, deadline - time.monotonic()))]
        assert not left, f"processes left behind: {left}"
