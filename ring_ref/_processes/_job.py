"""Joining a job someone else launched: the rank, the world size and the rendezvous from the environment.

``torchrun``, SLURM's ``srun``, OpenMPI's ``mpirun`` and the ``mpiexec`` of
MPICH and Intel MPI (hydra) each tell a process who it is through environment
variables; :func:`job_environment` reads them, in that order of precedence
(clause ``difftest-job``):

* ``torchrun``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
* SLURM: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, with
  ``MASTER_ADDR`` and ``MASTER_PORT`` given by the batch script;
* OpenMPI: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
  ``OMPI_COMM_WORLD_LOCAL_RANK``, with ``MASTER_ADDR`` and ``MASTER_PORT``
  (``mpirun -x MASTER_ADDR=... -x MASTER_PORT=...``);
* hydra (MPICH's and Intel MPI's ``mpiexec``): ``PMI_RANK``, ``PMI_SIZE``,
  ``MPI_LOCALRANKID``, with ``MASTER_ADDR`` and ``MASTER_PORT`` in the
  environment (hydra passes it whole).

A PMIx launcher gives its rank as ``PMIX_RANK`` and no world size: OpenMPI 5's
``mpirun`` and ``srun --mpi=pmix`` also set their own variables above, which
are read instead; ``PMIX_RANK`` alone is named in the refusal.
:func:`launch_prefix` writes the command of the launcher that started the process, for a replay line.

A missing or inconsistent set is a :class:`JobEnvError` naming the variables.
:func:`join_job` then initialises the default ``torch.distributed`` process
group through ``env://`` (rank 0 hosts the store at ``MASTER_ADDR:MASTER_PORT``
unless ``torchrun``'s agent already does).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import torch.distributed as dist

__all__ = [
    "LAUNCHERS",
    "JobEnv",
    "JobEnvError",
    "job_environment",
    "join_job",
    "launch_prefix",
]

LAUNCHERS: Final = (
    ("torchrun", ("RANK", "WORLD_SIZE", "LOCAL_RANK")),
    ("SLURM", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")),
    ("OpenMPI", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")),
    ("hydra", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")),
)
"""Each launcher's variables for the rank, the world size and the local rank, in order of precedence."""
_RENDEZVOUS: Final = ("MASTER_ADDR", "MASTER_PORT")
_STARTED_BY: Final = (
    ("TORCHELASTIC_RUN_ID", "torchrun --nproc-per-node {n} --no-python"),
    ("SLURM_PROCID", "srun -n {n}"),
    ("OMPI_COMM_WORLD_RANK", "mpirun -n {n}"),
    ("PMI_RANK", "mpiexec -n {n}"),
)
"""Which launcher started this process, by a variable of its own that :func:`join_job` never sets
(it sets torchrun's ``RANK``), and how it starts ``n`` ranks of a command, for the replay line."""


class JobEnvError(ValueError):
    """The environment does not describe a rank of a job (a usage error: exit status 2)."""


@dataclass(frozen=True)
class JobEnv:
    """Who this process is in the job, and where the job's store is."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def _integer(environ: Mapping[str, str], name: str) -> int:
    text = environ[name]
    try:
        return int(text)
    except ValueError:
        raise JobEnvError(f"{name}={text!r} is not an integer") from None


def launch_prefix(size: int, mpi: bool = False, environ: Mapping[str, str] | None = None) -> str:
    """How the launcher that started this process starts ``size`` ranks of a command, for a replay line;
    ``""`` when none is known (ranks started by hand, or by the caller's own code), ``mpiexec -n N`` for an
    MPI job (``mpi``) whose launcher hid its variables.

    >>> launch_prefix(4, environ={"TORCHELASTIC_RUN_ID": "x", "RANK": "0"}), launch_prefix(4, environ={})
    ('torchrun --nproc-per-node 4 --no-python', '')
    >>> launch_prefix(2, mpi=True, environ={"OMPI_COMM_WORLD_RANK": "1"}), launch_prefix(2, True, {})
    ('mpirun -n 2', 'mpiexec -n 2')
    """
    env = os.environ if environ is None else environ
    known = next((command for name, command in _STARTED_BY if name in env), None)
    return (known or ("mpiexec -n {n}" if mpi else "")).format(n=size)


def job_environment(environ: Mapping[str, str] | None = None) -> JobEnv:
    """This process's place in the job, from ``environ`` (default ``os.environ``); see the module docstring.

    >>> job_environment({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1",
    ...                  "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}).rank
    3
    >>> job_environment({"RANK": "0"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ring_ref._processes._job.JobEnvError: torchrun's variables are incomplete: RANK is set but ...
    """
    env = os.environ if environ is None else environ
    for launcher, names in LAUNCHERS:
        if not any(name in env for name in names):
            continue
        missing = [name for name in (*names, *_RENDEZVOUS) if not env.get(name)]
        if missing:
            present = [name for name in (*names, *_RENDEZVOUS) if env.get(name)]
            raise JobEnvError(
                f"{launcher}'s variables are incomplete: {', '.join(present)} "
                f"{'is' if len(present) == 1 else 'are'} set but {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not (--ranks job joins a job through "
                f"{', '.join((*names, *_RENDEZVOUS))}; run under torchrun, srun, mpirun or mpiexec, and "
                "give MASTER_ADDR and MASTER_PORT to srun, mpirun and mpiexec jobs)"
            )
        rank, size, local = (_integer(env, name) for name in names)
        port = _integer(env, "MASTER_PORT")
        if size < 1 or not 0 <= rank < size or not 0 <= local <= rank or not 0 < port < 65536:
            raise JobEnvError(
                f"{launcher}'s variables are inconsistent: {names[0]}={rank}, {names[1]}={size}, "
                f"{names[2]}={local}, MASTER_PORT={port} (need 0 <= local rank <= rank < world size "
                "and a port from 1 to 65535)"
            )
        return JobEnv(launcher, rank, size, local, env["MASTER_ADDR"], port)
    pmix = (
        f" (PMIX_RANK={env['PMIX_RANK']} is set, but a PMIx launcher gives no world size: run under one of "
        "those launchers, whose variables say it)"
        if "PMIX_RANK" in env
        else ""
    )
    raise JobEnvError(
        "--ranks job found no job in the environment: none of "
        f"{', '.join(n for _, names in LAUNCHERS for n in names[:2])} is set{pmix}; start every rank with "
        "torchrun, srun, mpirun or mpiexec (srun, mpirun and mpiexec jobs also need MASTER_ADDR and "
        "MASTER_PORT)"
    )


def join_job(job: JobEnv, backend: str, timeout: datetime.timedelta) -> None:
    """Initialise the default process group of ``job`` with ``backend`` through ``env://``."""
    os.environ.update(
        RANK=str(job.rank),
        WORLD_SIZE=str(job.world_size),
        LOCAL_RANK=str(job.local_rank),
        MASTER_ADDR=job.master_addr,
        MASTER_PORT=str(job.master_port),
    )
    dist.init_process_group(
        backend, init_method="env://", rank=job.rank, world_size=job.world_size, timeout=timeout
    )
