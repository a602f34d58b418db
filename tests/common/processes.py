"""Processes a test started, seen from outside: whether one is gone, MPI jobs that must leave none, the
gloo groups a test module shares, and the ``ring-ref`` command's JSON from a fresh process.

:func:`gone` reads ``/proc`` (it trusts no harness's own account); :class:`Jobs`
holds the MPI jobs a test module shares and, on :meth:`~Jobs.close`, asserts
that every process any of them ever started (``mpirun`` and each rank) is gone;
:class:`Rings` holds a module's gloo groups, one per world size, and on
:meth:`~Rings.close` asserts that every rank exited on its own with status 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ring_ref._processes._gloo import SpawnedGroup
from ring_ref._processes._mpi_job import MpiJob, mpirun_path
from tests.common.paths import ROOT

__all__ = ["Jobs", "Rings", "environ_of", "gone", "ring_ref_json"]


def ring_ref_json(*args: str, status: int) -> Any:
    """``ring-ref ARGS --json`` in a fresh process, from the repository root (a tester that forks its ranks
    must not have imported their library); its JSON, once the exit status is ``status``."""
    done = subprocess.run(
        [sys.executable, "-m", "ring_ref", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=500,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == status, done.stderr[-3000:]
    return json.loads(done.stdout)


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


class Rings:
    """One lazily spawned, reused :class:`SpawnedGroup` per world size, all closed by :meth:`close`."""

    def __init__(self, group_timeout_s: float) -> None:
        self._group_timeout_s = group_timeout_s
        self._rings: dict[int, SpawnedGroup] = {}

    def __call__(self, n: int) -> SpawnedGroup:
        if n not in self._rings:
            self._rings[n] = SpawnedGroup(n, group_timeout_s=self._group_timeout_s)
        return self._rings[n]

    def close(self) -> None:
        """Close every ring; each rank still running must exit on its own with status 0 (no kill)."""
        procs = [proc for ring in self._rings.values() for proc in ring._procs]
        for ring in self._rings.values():
            ring.close()
        assert [proc.exitcode for proc in procs] == [0] * len(procs), "a rank did not shut down cleanly"


def environ_of(_comm: object, names: list[str]) -> list[str | None]:
    """On a rank of an MPI job: the values of the environment variables ``names`` (``None``: unset)."""
    return [os.environ.get(name) for name in names]
