"""Where ``--ranks job`` finds the job: torchrun's, SLURM's and OpenMPI's variables, and the usage errors."""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import time

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch
import torch.distributed

from ring_ref._cli import main
from ring_ref._processes._job import JobEnv, JobEnvError, job_environment, join_job, launch_prefix
from ring_ref._processes._shared import FAILURE_GRACE_S
from ring_ref.difftest import difftest
from ring_ref.difftest._job import BYE_WAIT_S, MPIRUN_BYE_WAIT_S, JobRanks, _Terminate, takes_group
from ring_ref.difftest._report import ModeResult, Report
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))

pytestmark = pytest.mark.clause("difftest-job")

RENDEZVOUS = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", **RENDEZVOUS}
SLURM = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", **RENDEZVOUS}
OMPI = {
    "OMPI_COMM_WORLD_RANK": "7",
    "OMPI_COMM_WORLD_SIZE": "8",
    "OMPI_COMM_WORLD_LOCAL_RANK": "3",
    **RENDEZVOUS,
}
HYDRA = {"PMI_RANK": "4", "PMI_SIZE": "8", "MPI_LOCALRANKID": "0", "PMI_FD": "9", **RENDEZVOUS}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (TORCHRUN, JobEnv("torchrun", 5, 8, 1, "node0", 29500)),
        (SLURM, JobEnv("SLURM", 6, 8, 2, "node0", 29500)),
        (OMPI, JobEnv("OpenMPI", 7, 8, 3, "node0", 29500)),
        ({**OMPI, **SLURM}, JobEnv("SLURM", 6, 8, 2, "node0", 29500)),  # srun's tasks before mpirun's
        ({**SLURM, **TORCHRUN}, JobEnv("torchrun", 5, 8, 1, "node0", 29500)),  # torchrun inside srun
        (HYDRA, JobEnv("hydra", 4, 8, 0, "node0", 29500)),  # MPICH's and Intel MPI's mpiexec
        ({**HYDRA, **OMPI}, JobEnv("OpenMPI", 7, 8, 3, "node0", 29500)),
    ],
    ids=["torchrun", "slurm", "openmpi", "slurm-over-openmpi", "torchrun-over-slurm", "hydra", "ompi-hydra"],
)
def test_each_launchers_variables_give_the_rank(env: dict[str, str], expected: JobEnv) -> None:
    assert job_environment(env) == expected


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, "none of RANK, WORLD_SIZE, SLURM_PROCID, SLURM_NTASKS, OMPI_COMM_WORLD_RANK"),
        (
            {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"},
            "but MASTER_ADDR, MASTER_PORT are not",
        ),
        ({**TORCHRUN, "LOCAL_RANK": ""}, "but LOCAL_RANK is not"),
        ({**TORCHRUN, "RANK": "8"}, "inconsistent: RANK=8, WORLD_SIZE=8"),
        ({**TORCHRUN, "LOCAL_RANK": "6"}, "inconsistent"),
        ({**TORCHRUN, "WORLD_SIZE": "0", "RANK": "0", "LOCAL_RANK": "0"}, "inconsistent"),
        ({**SLURM, "MASTER_PORT": "70000"}, "MASTER_PORT=70000"),
        ({**OMPI, "OMPI_COMM_WORLD_SIZE": "eight"}, "OMPI_COMM_WORLD_SIZE='eight' is not an integer"),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, "but MPI_LOCALRANKID, MASTER_ADDR, MASTER_PORT are not"),
        ({"PMIX_RANK": "1"}, "PMIX_RANK=1 is set, but a PMIx launcher gives no world size"),
    ],
    ids=[
        "nothing",
        "slurm-no-rendezvous",
        "torchrun-empty",
        "rank-too-big",
        "local-above-rank",
        "no-ranks",
        "port",
        "not-int",
        "hydra-no-rendezvous",
        "pmix-alone",
    ],
)
def test_a_missing_or_inconsistent_environment_names_the_variables(env: dict[str, str], words: str) -> None:
    with pytest.raises(JobEnvError) as raised:
        job_environment(env)
    assert words in str(raised.value)


@pytest.mark.parametrize(
    ("env", "prefix"),
    [
        ({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"}, "torchrun --nproc-per-node 4 --no-python"),
        (SLURM, "srun -n 4"),
        ({**OMPI, **TORCHRUN}, "mpirun -n 4"),  # joining the job sets torchrun's RANK: not its launcher
        (HYDRA, "mpiexec -n 4"),
        (TORCHRUN, ""),  # set by hand, or by the caller's own code: no launcher to name
    ],
    ids=["torchrun", "slurm", "openmpi", "hydra", "by-hand"],
)
def test_a_replay_line_in_a_job_starts_the_job_again(env: dict[str, str], prefix: str) -> None:
    assert launch_prefix(4, environ=env) == prefix
    assert launch_prefix(4, mpi=True, environ={}) == "mpiexec -n 4"  # an MPI job that hid its variables


def test_the_command_line_exits_2_outside_a_job(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "PMIX_RANK",
    ):
        monkeypatch.delenv(name, raising=False)
    assert main(["difftest", "--ranks", "job", "torch.distributed:all_reduce"]) == 2
    assert "found no job in the environment: none of RANK, WORLD_SIZE" in capsys.readouterr().err
    monkeypatch.setenv("SLURM_PROCID", "1")
    assert main(["difftest", "--ranks", "job", "torch.distributed:all_reduce"]) == 2
    assert "SLURM's variables are incomplete: SLURM_PROCID is set" in capsys.readouterr().err
    assert main(["difftest", "--ranks", "gloo", "--device", "cuda", "torch.distributed:all_reduce"]) == 2
    assert (
        "--backend and --device choose the job's process group and device: they need --ranks job"
        in capsys.readouterr().err
    )


def test_ranks_job_outside_a_process_group_is_refused() -> None:
    with pytest.raises(ValueError, match=r"none is initialised: call torch\.distributed\.init_process_group"):
        difftest("torch.distributed:all_reduce", ranks="job")


def test_subgroups_need_a_job_and_a_boolean(capsys: pytest.CaptureFixture[str]) -> None:
    """``--subgroups`` is for ``--ranks job`` / ``mpi-job`` only: a usage error (exit 2) elsewhere."""
    for ranks in (None, "gloo", "mpi"):
        with pytest.raises(ValueError, match=r"subgroups \(--subgroups\) tests every smaller N inside a job"):
            difftest("tests.common.planted_rank_impls:plain_ring", ranks=ranks, subgroups=True)
    with pytest.raises(ValueError, match=r"must be True or False; got 'yes'"):
        difftest("torch.distributed:all_reduce", ranks="job", subgroups="yes")  # type: ignore[arg-type]
    assert (
        main(["difftest", "--ranks", "gloo", "--subgroups", "tests.common.planted_rank_impls:plain_ring"])
        == 2
    )
    assert "it needs ranks='job' or 'mpi-job'" in capsys.readouterr().err


def _keyword_only(tensor: object, *, group: object = None) -> None: ...
def _any_keyword(tensor: object, **options: object) -> None: ...
def _positional_only(tensor: object, group: object = None, /) -> None: ...
def _other_name(tensor: object, process_group: object = None) -> None: ...


@pytest.mark.parametrize(
    ("fn", "takes"),
    [(_keyword_only, True), (_any_keyword, True), (_positional_only, False), (_other_name, False)],
)
def test_a_target_takes_group_by_that_keyword(fn: object, takes: bool) -> None:
    assert takes_group(fn) is takes


def test_a_job_report_says_which_n_were_tested() -> None:
    """``tested_n`` in the JSON (valid against the schema) and in the text; absent outside a job."""
    report = Report("t:f", 1, "replay", isolated=True, ranks="job", timeout_s=60.0, tested_n=[1, 2, 3, 4])
    report.modes["bound"] = ModeResult("bound", "pass", 5)
    doc = report.to_json()
    jsonschema.validate(doc, SCHEMA)
    assert doc["tested_n"] == [1, 2, 3, 4]
    assert "at most 60 s per call; N tested: 1, 2, 3, 4)" in report.render()
    plain = Report("t:f", 1, "replay", isolated=True, ranks="gloo", timeout_s=60.0)
    assert "tested_n" not in plain.to_json() and "N tested" not in plain.render()


@pytest.mark.clause("difftest-job-mpirun-death")
@pytest.mark.parametrize("mpirun", [True, False])
def test_under_mpirun_sigcont_says_bye_and_the_silent_rank_is_dead_at_once(
    monkeypatch: pytest.MonkeyPatch, mpirun: bool
) -> None:
    """In-process, on a local store: under ``mpirun`` (OpenMPI's variables set) ``SIGCONT`` writes this
    rank's ``bye`` and starts the count; a rank without one is dead ``MPIRUN_BYE_WAIT_S`` later, and the
    others of the call get no grace.  Elsewhere ``SIGCONT`` is not noted and the grace is gloo's."""
    if mpirun:
        monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    else:
        monkeypatch.delenv("OMPI_COMM_WORLD_RANK", raising=False)
    store = torch.distributed.HashStore()  # type: ignore[attr-defined]  # re-exported at runtime, not in stubs
    terminate = _Terminate(store, 0)
    try:
        os.kill(os.getpid(), signal.SIGCONT)
        noted = terminate.event.wait(2.0)
    finally:
        terminate.restore()
    assert noted is mpirun and store.check(["bye/0"]) is mpirun
    launcher = JobRanks(store, 2, 60.0, terminate.event, mpirun=mpirun)
    assert launcher.death_grace_s == (0.0 if mpirun else FAILURE_GRACE_S)
    if mpirun:
        started = time.monotonic()
        while not launcher.watch.dead(1):
            time.sleep(0.01)
        assert MPIRUN_BYE_WAIT_S <= time.monotonic() - started < BYE_WAIT_S
        assert launcher.watch.dead(1).startswith("its process died") and launcher.watch.dead(0) == ""


def test_an_incomplete_environment_is_refused_in_full_words() -> None:
    with pytest.raises(JobEnvError) as one:
        job_environment({"RANK": "0"})
    assert str(one.value) == (
        "torchrun's variables are incomplete: RANK is set but WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
        "MASTER_PORT are not (--ranks job joins a job through RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, "
        "MASTER_PORT; run under torchrun, srun, mpirun or mpiexec, and give MASTER_ADDR and MASTER_PORT to "
        "srun, mpirun and mpiexec jobs)"
    )
    with pytest.raises(JobEnvError) as two:
        job_environment({**TORCHRUN, "MASTER_PORT": ""})
    assert "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR are set but MASTER_PORT is not" in str(two.value)


def test_outside_any_job_the_refusal_names_every_launcher_and_pmix_only_when_set() -> None:
    launchers = (
        "--ranks job found no job in the environment: none of RANK, WORLD_SIZE, SLURM_PROCID, SLURM_NTASKS, "
        "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, PMI_RANK, PMI_SIZE is set"
    )
    fix = (
        "; start every rank with torchrun, srun, mpirun or mpiexec (srun, mpirun and mpiexec jobs also need "
        "MASTER_ADDR and MASTER_PORT)"
    )
    with pytest.raises(JobEnvError) as plain:
        job_environment({})
    assert str(plain.value) == launchers + fix
    with pytest.raises(JobEnvError) as pmix:
        job_environment({"PMIX_RANK": "2"})
    assert str(pmix.value) == (
        f"{launchers} (PMIX_RANK=2 is set, but a PMIx launcher gives no world size: run under one of those "
        f"launchers, whose variables say it){fix}"
    )


def _ranked(rank: int, size: int, local: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local), "MASTER_ADDR": "h",
            "MASTER_PORT": str(port)}  # fmt: skip


@pytest.mark.parametrize(
    ("rank", "size", "local", "port"),
    [(0, 1, 0, 1), (0, 1, 0, 65535), (3, 4, 3, 29500), (3, 4, 0, 29500)],
    ids=["one-rank-port-1", "last-port", "local-is-rank", "local-zero"],
)
def test_the_edges_of_a_consistent_environment_are_accepted(
    rank: int, size: int, local: int, port: int
) -> None:
    assert job_environment(_ranked(rank, size, local, port)) == JobEnv(
        "torchrun", rank, size, local, "h", port
    )


@pytest.mark.parametrize(
    ("rank", "size", "local", "port"),
    [(0, 0, 0, 29500), (-1, 4, 0, 29500), (4, 4, 0, 29500), (2, 4, 3, 29500), (1, 4, -1, 29500),
     (0, 4, 0, 0), (0, 4, 0, 65536)],
    ids=["no-ranks", "negative-rank", "rank-is-size", "local-above-rank", "negative-local", "port-0",
         "port-65536"],
)  # fmt: skip
def test_just_past_each_edge_the_environment_is_inconsistent(
    rank: int, size: int, local: int, port: int
) -> None:
    with pytest.raises(JobEnvError) as raised:
        job_environment(_ranked(rank, size, local, port))
    assert str(raised.value) == (
        f"torchrun's variables are inconsistent: RANK={rank}, WORLD_SIZE={size}, LOCAL_RANK={local}, "
        f"MASTER_PORT={port} (need 0 <= local rank <= rank < world size and a port from 1 to 65535)"
    )


def test_the_launcher_is_read_from_this_processs_environment_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("TORCHELASTIC_RUN_ID", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PMI_RANK", "0")
    assert launch_prefix(3) == "mpiexec -n 3"
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert launch_prefix(3) == "srun -n 3"


def test_joining_a_job_makes_its_default_group_with_the_rank_size_and_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "unset")  # restored after the test: join_job writes them
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    join_job(JobEnv("hydra", 0, 1, 0, "127.0.0.1", port), "gloo", datetime.timedelta(seconds=77))
    try:
        assert (torch.distributed.get_rank(), torch.distributed.get_world_size()) == (0, 1)
        assert torch.distributed.get_backend() == "gloo"
        world = torch.distributed.group.WORLD
        assert world is not None
        assert world._get_backend(torch.device("cpu")).options._timeout == datetime.timedelta(seconds=77)
        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        assert [os.environ[n] for n in names] == ["0", "1", "0", "127.0.0.1", str(port)]
    finally:
        torch.distributed.destroy_process_group()
