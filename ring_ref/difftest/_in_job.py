"""The command line inside a job (``--ranks job``, ``mpi-job``): join the job from its environment, run on
every rank, let rank 0 show the outcome before the others may leave, and give every rank its exit status.

What is run and how it is printed are the command's (:mod:`ring_ref._cli`); the job's side channel and
the serving loop are :mod:`ring_ref.difftest._job`'s.  Clause ``difftest-job``.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable

import torch
import torch.distributed

from ring_ref._processes._job import JobEnvError, job_environment, join_job
from ring_ref.difftest._job import SHOW, job_size, run_in_job, run_in_mpi_job
from ring_ref.difftest._launch import Launcher

__all__ = ["command_in_job", "job_rank", "join", "reveal_in_job"]


def join(
    command: str, ranks: str, backend: str | None, device: str | None, timeout: float
) -> tuple[str, bool] | None:
    """With ``--ranks job``: find the job in the environment and join it; the device and whether a group
    was joined.  ``None`` after a usage error (printed).  ``--ranks mpi-job`` joins nothing here."""
    device = device or "cpu"
    if ranks != "job":
        return device, False
    backend = backend or ("nccl" if device == "cuda" else "gloo")
    try:
        job = job_environment()
        if device == "cuda" and not torch.cuda.is_available():
            raise JobEnvError("--device cuda: torch sees no CUDA device on this node")
    except JobEnvError as exc:
        print(f"ring-ref {command}: error: {exc}", file=sys.stderr)
        return None
    if device == "cuda":
        torch.cuda.set_device(job.local_rank)
    join_job(job, backend, datetime.timedelta(seconds=2 * timeout + 30))
    return device, True


def command_in_job(
    command: str,
    ranks: str,
    *,
    backend: str | None,
    device: str | None,
    timeout: float,
    show: Callable[[object], None],
    body: Callable[[str], int],
    errors: tuple[type[BaseException], ...],
) -> int:
    """Join the job (:func:`join`), then ``body(device)`` on this rank with ``show`` as how rank 0 shows
    the outcome (:data:`~ring_ref.difftest._job.SHOW`); its status, or 2 for a usage error or one of
    ``errors`` (rank 0 has shown it).  The group joined here is left at the end.

    A missing or inconsistent environment, or a device that is not there, is a usage error (2) on every
    rank.
    """
    joined = join(command, ranks, backend, device, timeout)
    if joined is None:
        return 2
    device, group = joined
    token = SHOW.set(show)
    try:
        return body(device)
    except errors:
        return 2  # rank 0 has shown it
    finally:
        SHOW.reset(token)
        if group:
            torch.distributed.destroy_process_group()


def reveal_in_job(
    target: str,
    run: Callable[[Launcher], object],
    *,
    n: int,
    checks: int,
    device: str,
    timeout: float,
    ranks: str = "job",
) -> int:
    """``reveal --ranks job`` (or ``mpi-job``: ``TARGET(comm, array)`` on every rank of the MPI job) on this
    rank (in :func:`command_in_job`): every rank serves, rank 0 runs ``run`` (the reveal); 2 when ``n`` is
    not the job's size or ``checks`` is negative (rank 0 says so)."""
    size = job_size(ranks, None, None)
    if n != size or checks < 0:
        if job_rank(ranks) == 0:
            print(
                f"ring-ref reveal: error: -n must be the job's {size} ranks (got {n}) and --checks "
                f"0 or more (got {checks})",
                file=sys.stderr,
            )
        return 2
    if ranks == "mpi-job":
        run_in_mpi_job(target, run, timeout_s=timeout)
    else:
        run_in_job(target, run, device=device, timeout_s=timeout)
    return 0


def job_rank(ranks: str) -> int:
    """This process's rank in the job (``COMM_WORLD``'s for ``mpi-job``)."""
    if ranks == "mpi-job":
        from mpi4py import MPI

        return int(MPI.COMM_WORLD.Get_rank())
    return int(torch.distributed.get_rank())
