"""``--ranks job``: the tester inside jobs started by ``torchrun``, by hand as SLURM would, and by ``mpirun``.

Each test starts a real job (its ranks are processes of the launcher, never of
the tester) and reads what the job printed and its exit status; the planted
per-rank bugs of ``tests/common/planted_rank_impls.py`` must get the codes they get
under ``--ranks gloo`` (``EXPECTED``, checked there by ``test_difftest_ranks.py``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from ring_ref._processes._mpi_job import mpirun_path
from ring_ref.difftest import difftest
from ring_ref.difftest._job import JOB_GRACE_S
from tests.common import job_codes, mpi_job_codes, planted_group_impls, planted_mpi, planted_rank_impls
from tests.common.paths import ROOT

pytestmark = pytest.mark.clause("difftest-job")

SCHEMA = json.loads((ROOT / "spec" / "difftest_report.schema.json").read_text(encoding="utf-8"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
START_ALLOWANCE_S = 90.0
"""What a job may take besides the calls: starting the launcher and importing torch in every rank."""
_QUIET = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _run(
    cmd: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a launcher in a session of its own; kill the whole session if it outlives ``timeout_s``."""
    with subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, **_QUIET, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{cmd} did not end within {timeout_s} s:\n{out}\n{err}")
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _run_together(
    commands: list[tuple[list[str], dict[str, str]]], timeout_s: float
) -> tuple[list[int], list[tuple[str, str]]]:
    """Start every command (with its extra environment) at once; their exit statuses and outputs."""
    procs = [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, **_QUIET, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for cmd, env in commands
    ]
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs], outs


def _torchrun(n: int, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return _run([*TORCHRUN, "--standalone", "--nproc-per-node", str(n), *args], timeout_s)


def _job_cli(command: str, target: str, *options: str) -> list[str]:
    """``-m ring_ref COMMAND --ranks job TARGET OPTIONS...``."""
    return ["-m", "ring_ref", command, "--ranks", "job", target, *options]


def _difftest(target: str, *options: str) -> list[str]:
    return _job_cli("difftest", f"tests.common.planted_rank_impls:{target}", *options)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_planted_codes_in_a_job_of_four_match_gloo_at_four(tmp_path: Path) -> None:
    """The table of the docs page: every planted per-rank bug and correct target, ``gloo`` vs ``job``, N = 4;
    from inside the job, through the Python API, and every rank gets the same report and assertion."""
    done = _torchrun(4, ["-m", "tests.common.job_codes", str(tmp_path)], 400)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert all(r == ranks[0] for r in ranks), ranks
    expected = {
        f"tests.common.planted_rank_impls:{f.__name__}": [code]
        for f, code in planted_rank_impls.EXPECTED.items()
    }
    expected.update({f"tests.common.planted_rank_impls:{name}": [] for name in job_codes.CORRECT})
    for target, codes in ranks[0]["codes"].items():
        assert codes == expected[target], target
        gloo = difftest(
            target, ranks="gloo", modes=("order-free", "bound"), examples=8, seed=1, max_workers=4
        )
        assert gloo.diagnoses == codes, (target, gloo.render())
    assert set(ranks[0]["codes"]) == set(expected) - {
        f"tests.common.planted_rank_impls:{t}" for t in job_codes.ENDS_THE_JOB
    }
    assertion = ranks[0]["assertion"]
    assert assertion.startswith("FAIL: ") and "double-counted" in assertion


@pytest.mark.parametrize("bug", job_codes.ENDS_THE_JOB)
def test_a_hang_a_dead_rank_and_a_raising_rank_end_the_job_with_a_report(bug: str) -> None:
    """Each ends the job, every rank exits 1, within --timeout plus the stated grace (and the start)."""
    timeout = 4.0
    started = time.monotonic()
    done = _torchrun(
        2,
        _difftest(
            bug, "--mode", "bound", "--examples", "5", "--seed", "1", "--timeout", f"{timeout:g}", "--json"
        ),
        300,
    )
    took = time.monotonic() - started
    code = planted_rank_impls.EXPECTED[getattr(planted_rank_impls, bug)]
    doc = json.loads(done.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["diagnoses"] == [code] and doc["ranks"] == "job", done.stdout
    assert done.returncode == 1 and took < timeout + JOB_GRACE_S + START_ALLOWANCE_S, (
        took,
        done.stderr[-3000:],
    )
    assert "ChildFailedError" in done.stderr and "Root Cause" in done.stderr  # torchrun's trailer (the guide)
    cex = doc["modes"]["bound"]["counterexample"]
    if code == "timed-out":  # every rank's stack came through the store, stopped in recv
        assert cex["ranks"] == [0, 1] and cex["stack"].count("in receives_first") == 2, cex
        assert "rank 0:\n" in cex["stack"] and "rank 1:\n" in cex["stack"]
    if code == "crashed":
        assert cex["ranks"] == [1] and "rank 1: its process died" in doc["modes"]["bound"]["explanation"]
    if code == "raised":
        assert "rank(s) [1]: raised RuntimeError: rank 1 gave up" in doc["modes"]["bound"]["explanation"]
        assert (
            "rank(s) [0] were still inside the call 2 s after rank(s) [1] raised"
            in doc["modes"]["bound"]["explanation"]
        )


def test_a_slurm_style_environment_set_by_hand() -> None:
    """No launcher: two processes given SLURM's variables and a rendezvous, as an sbatch script sets them."""
    port = str(_free_port())
    cmd = [sys.executable, *_difftest("gather_adds", "--mode", "bound", "--examples", "8", "--seed", "1")]
    envs = [
        {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank), "MASTER_PORT": port}
        for rank in range(2)
    ]
    codes, outs = _run_together([(cmd, {**env, "MASTER_ADDR": "127.0.0.1"}) for env in envs], 300)
    assert codes == [1, 1], outs
    assert "double-counted" in outs[0][0] and outs[1][0] == ""  # rank 0 prints the report, once


def _mpirun(n: int) -> list[str]:
    cmd = [mpirun_path(), "-n", str(n), "--oversubscribe", "--bind-to", "none"]
    cmd += ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [*cmd, "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]


def test_openmpi_variables_under_mpirun() -> None:
    """``mpirun -n 4`` starting ``--ranks job``: the rank and size from OpenMPI's variables."""
    cmd = _mpirun(4)
    cmd += [
        "-x",
        "MASTER_ADDR=127.0.0.1",
        "-x",
        f"MASTER_PORT={_free_port()}",
        "-x",
        "PYTHONPATH",
        "-x",
        "OMP_NUM_THREADS",
    ]
    done = _run([*cmd, sys.executable, *_difftest("plain_ring", "--examples", "5", "--seed", "2")], 400)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    assert done.stdout.count("PASS: tests.common.planted_rank_impls:plain_ring") == 1
    assert "--max-workers 4" in done.stdout
    assert "Replay: mpirun -n 4 ring-ref difftest --ranks job " in done.stdout  # the job started again


def test_reveal_in_an_mpi_job_prints_the_trees() -> None:
    """``mpirun -n 2 ring-ref reveal --ranks mpi-job``: rank 0 reveals the job's own ``MPI_Allreduce``
    (``TARGET(comm, array)``) and prints its trees, once; every rank exits 0."""
    cmd = [*_mpirun(2), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR=127.0.0.1"]
    reveal = ["-m", "ring_ref", "reveal", "--ranks", "mpi-job", "ring_ref.targets:mpi_allreduce", "-n", "2"]
    done = _run([*cmd, sys.executable, *reveal, "-m", "3"], 300)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    assert done.stdout.count("ring-ref reveal ring_ref.targets:mpi_allreduce  (N = 2, M = 3, float32)") == 1
    assert "classification: ring" in done.stdout and "fold 0,1" in done.stdout, done.stdout


@pytest.mark.clause("invariance-in-job")
def test_invariance_in_an_mpi_job_finds_the_ring_that_mca_picks() -> None:
    """``mpirun -n 3 ring-ref invariance --ranks mpi-job``: rank 0 places the probes in the job's own
    ``MPI_Allreduce`` (OpenMPI's ring, ``-x OMPI_MCA_...``) and prints, once; every rank exits 1 (the order
    moves with the chunks); ``-n`` other than the job's size is refused on every rank (exit 2), rank 0
    saying why."""
    cmd = [*_mpirun(3), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR=127.0.0.1"]
    cmd += [
        "-x",
        "OMPI_MCA_coll_tuned_use_dynamic_rules=1",
        "-x",
        "OMPI_MCA_coll_tuned_allreduce_algorithm=4",
    ]
    invariance = ["-m", "ring_ref", "invariance", "--ranks", "mpi-job", "ring_ref.targets:mpi_allreduce"]
    done = _run([*cmd, sys.executable, *invariance, "-n", "3", "--sizes", "6,9"], 300)
    assert done.returncode == 1, (done.stdout, done.stderr[-3000:])
    assert done.stdout.count("ring-ref invariance ring_ref.targets:mpi_allreduce  (N = 3,") == 1
    assert "NOT invariant: order changes with M: at chunk boundaries" in done.stdout, done.stdout
    assert "the openmpi-ring ring" in done.stdout or "the spec ring" in done.stdout, done.stdout
    refused = _run([*cmd, sys.executable, *invariance, "-n", "4", "--sizes", "6,9"], 300)
    assert refused.returncode == 2, (refused.stdout, refused.stderr[-3000:])
    assert refused.stderr.count("n (-n) must be the job's 3 ranks; got 4") == 1


def test_planted_mpi_codes_in_an_mpi_job_of_four(tmp_path: Path) -> None:
    """``--ranks mpi-job`` under ``mpirun -n 4``: each planted bug's code (``planted_mpi.EXPECTED``, as
    ``test_difftest_mpi.py`` checks under ``--ranks mpi``), the correct ring passing; alike on every rank."""
    cmd = [*_mpirun(4), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR=127.0.0.1"]
    done = _run([*cmd, sys.executable, "-m", "tests.common.mpi_job_codes", str(tmp_path)], 500)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert all(r == ranks[0] for r in ranks), ranks
    expected = {f"tests.common.planted_mpi:{name}": [code] for name, code in planted_mpi.EXPECTED.items()}
    expected["tests.common.planted_mpi:plain_ring"] = []
    assert ranks[0] == {t: expected[t] for t in mpi_job_codes.targets()}


@pytest.mark.parametrize("bug", mpi_job_codes.ENDS_THE_JOB)
def test_an_mpi_job_that_hangs_or_raises_ends_with_a_report(bug: str) -> None:
    timeout = 4.0
    cmd = [*_mpirun(4), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR=127.0.0.1"]
    cmd += [
        sys.executable,
        "-m",
        "ring_ref",
        "difftest",
        "--ranks",
        "mpi-job",
        f"tests.common.planted_mpi:{bug}",
    ]
    started = time.monotonic()
    done = _run(
        [*cmd, "--mode", "bound", "--examples", "3", "--seed", "1", "--timeout", f"{timeout:g}", "--json"],
        300,
    )
    took = time.monotonic() - started
    doc = json.loads(done.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["diagnoses"] == [planted_mpi.EXPECTED[bug]] and doc["ranks"] == "mpi-job", done.stdout
    assert done.returncode != 0 and took < timeout + JOB_GRACE_S + START_ALLOWANCE_S, (
        took,
        done.stderr[-3000:],
    )
    cex = doc["modes"]["bound"]["counterexample"]
    if bug == "send_send_deadlock":
        assert cex["ranks"] == [0, 1, 2, 3] and cex["stack"].count("in send_send_deadlock") == 4, cex


def test_an_mpi_job_of_one_rank_ends_a_call_at_the_time_limit_asked() -> None:
    """``--ranks mpi-job`` under ``mpirun -n 1``: a call that never returns is ``timed-out`` after the
    ``--timeout`` asked (3 s), not the default 60 s, and the job ends with status 1."""
    timeout = 3.0
    target = "tests.common.planted_mpi:never_returns"
    cmd = [*_mpirun(1), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", sys.executable, "-m", "ring_ref"]
    cmd += ["difftest", "--ranks", "mpi-job", target, "--mode", "bound", "--examples", "1", "--seed", "0"]
    started = time.monotonic()
    done = _run([*cmd, "--timeout", f"{timeout:g}", "--json"], 300)
    took = time.monotonic() - started
    doc = json.loads(done.stdout)
    assert doc["diagnoses"] == ["timed-out"] and doc["target"] == target, done.stdout
    assert doc["replay"].startswith(f"mpirun -n 1 ring-ref difftest --ranks mpi-job {target} ")
    # one rank starts in seconds: well under the 60 s a lost --timeout would take
    assert done.returncode == 1 and took < timeout + JOB_GRACE_S + 30, (took, done.stderr[-3000:])
    # from Python, a target the ranks cannot import by name is refused before any call
    code = "from ring_ref.difftest import difftest; difftest(lambda comm, array: None, ranks='mpi-job')"
    refused = _run([*cmd[: cmd.index(sys.executable) + 1], "-c", code], 120)
    assert (
        refused.returncode != 0
        and (
            "ValueError: --ranks mpi-job loads the target by name on every rank: '<lambda>' must be a "
            "module-level function or a TARGET string"
        )
        in refused.stderr
    ), refused.stderr[-3000:]


@pytest.mark.clause("difftest-job-mpirun-death")
@pytest.mark.parametrize(
    "ranks",
    ["mpi-job", pytest.param("job", marks=pytest.mark.soak)],  # one mpirun job in make verify
)
def test_a_rank_that_dies_under_mpirun_is_reported_crashed(ranks: str) -> None:
    """``mpirun -n 4``, rank 1 ends its process (status 3) while the others wait for it: OpenMPI kills the
    other ranks within about 2 s, and rank 0 has printed the ``crashed`` report, rank 1 named, by then;
    with mpirun's own options only (no option of the user's keeps the ranks alive)."""
    cmd = [*_mpirun(4), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR=127.0.0.1"]
    module = "tests.common.planted_mpi" if ranks == "mpi-job" else "tests.common.planted_rank_impls"
    cmd += ["-x", f"MASTER_PORT={_free_port()}", sys.executable, "-m", "ring_ref", "difftest", "--ranks"]
    done = _run([*cmd, ranks, f"{module}:exits_mid_call", "--examples", "5", "--seed", "1", "--json"], 300)
    assert done.stdout, f"no report; mpirun said:\n{done.stderr[-3000:]}"
    doc = json.loads(done.stdout)
    jsonschema.validate(doc, SCHEMA)
    assert doc["verdict"] == "fail" and doc["diagnoses"] == ["crashed"], done.stdout
    assert done.returncode == 3, done.stderr[-3000:]  # mpirun's status: rank 1's, the first to fail
    failed = [mode for mode in doc["modes"].values() if mode["verdict"] == "fail"]
    assert len(failed) == 1 and failed[0]["counterexample"]["ranks"] == [1], doc["modes"]
    assert "rank(s) [1] of 4 died during the call (rank 1: its process died" in failed[0]["explanation"]


def test_reveal_in_the_job_then_difftest_pins_its_order(tmp_path: Path) -> None:
    """``reveal --ranks job`` gives gloo's own order at the job's N; ``difftest --order`` then passes exact
    in a job of that N, where the spec's ring order fails it (``not-ring-order``)."""
    order = tmp_path / "order.json"
    cli = ("torch.distributed:all_reduce", "-n", "3", "-m", "6", "--json")
    revealed = _torchrun(3, _job_cli("reveal", *cli), 300)
    assert revealed.returncode == 0, revealed.stderr[-3000:]
    doc = json.loads(revealed.stdout)
    # at N = 3, M = 6 gloo's cut and trees are MPICH's ring's too
    assert doc["n"] == 3 and doc["classification"] == "ring" and doc["matches"] == ["gloo", "mpich-ring"], doc
    order.write_text(revealed.stdout, encoding="utf-8")
    exact = _job_cli("difftest", "torch.distributed:all_reduce", "--mode", "exact")
    pinned = _torchrun(3, [*exact, "--order", str(order), "--examples", "5", "--seed", "1"], 300)
    assert pinned.returncode == 0 and "PASS" in pinned.stdout, (pinned.stdout, pinned.stderr[-3000:])
    spec = _torchrun(3, [*exact, "--examples", "5", "--seed", "1"], 300)
    assert spec.returncode == 1 and "not-ring-order" in spec.stdout, (spec.stdout, spec.stderr[-3000:])


def _odd_group_bug_found_at_three(doc: dict[str, object]) -> None:
    """The odd-group bug's report: its code, on rank 2 of the subgroup of 3 (the only odd size above 1)."""
    jsonschema.validate(doc, SCHEMA)
    bound = doc["modes"]["bound"]  # type: ignore[index]
    assert doc["diagnoses"] == [planted_group_impls.ODD_GROUP_CODE], doc
    assert bound["counterexample"]["n"] == 3 and bound["counterexample"]["ranks"] == [2], bound
    assert 3 in doc["tested_n"] and str(doc["replay"]).endswith(" --subgroups"), doc  # type: ignore[operator]


def test_subgroups_find_a_bug_that_only_a_subgroup_of_three_shows() -> None:
    """``torchrun`` N = 4 with ``--subgroups``: the bug of odd group sizes is found at N = 3, on a
    ``new_group`` subgroup; the report says which N were tested."""
    bug = "tests.common.planted_group_impls:odd_group_last_rank_keeps_input"
    options = ("--subgroups", "--mode", "bound", "--examples", "20", "--seed", "1", "--json")
    done = _torchrun(4, _job_cli("difftest", bug, *options), 300)
    assert done.returncode == 1, done.stderr[-3000:]
    _odd_group_bug_found_at_three(json.loads(done.stdout))


def test_a_hang_in_a_subgroup_ends_the_job_with_a_report() -> None:
    """A fault in a subgroup case is reported like any other: rank 1 of the pair left waiting is
    ``timed-out`` with its stack, the ranks outside the pair are let go too, and every rank exits 1."""
    timeout = 4.0
    bug = "tests.common.planted_group_impls:pair_rank_0_skips_the_call"
    options = ("--subgroups", "--mode", "bound", "--examples", "20", "--seed", "1", "--json")
    started = time.monotonic()
    done = _torchrun(4, _job_cli("difftest", bug, *options, "--timeout", f"{timeout:g}"), 300)
    took = time.monotonic() - started
    doc = json.loads(done.stdout)
    jsonschema.validate(doc, SCHEMA)
    cex = doc["modes"]["bound"]["counterexample"]
    assert doc["diagnoses"] == ["timed-out"] and cex["n"] == 2 and cex["ranks"] == [1], doc
    assert "in pair_rank_0_skips_the_call" in cex["stack"] and 2 in doc["tested_n"], cex
    assert done.returncode == 1 and took < timeout + JOB_GRACE_S + START_ALLOWANCE_S, (took, done.stderr)


def test_subgroups_from_every_rank_through_the_python_api(tmp_path: Path) -> None:
    """Inside a job of 4 (``tests/common/subgroup_codes.py``): the bug passes at N = 4 alone and fails with
    ``subgroups=True``; the correct target passes at every N; a group of 2 of the 4 ranks is refused."""
    done = _torchrun(4, ["-m", "tests.common.subgroup_codes", str(tmp_path)], 400)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [{k: v for k, v in r.items() if k != "pair"} for r in ranks[1:]] == [
        {k: v for k, v in ranks[0].items() if k != "pair"}
    ] * 3
    assert ranks[0]["without"] == ["pass", [4]] and ranks[0]["correct"] == ["pass", [1, 2, 3, 4]], ranks[0]
    failed = ranks[0]["with"]
    assert failed.startswith("FAIL: ") and "counterexample: N = 3," in failed and "N tested: " in failed
    assert [r.get("pair", "") for r in ranks[2:]] == ["", ""]
    assert all("group has 2 of the job's 4 ranks" in r["pair"] for r in ranks[:2]), ranks


def test_subgroups_refuse_a_target_without_group_on_every_rank() -> None:
    """A target that cannot take ``group=`` is a usage error: exit 2 on every rank, the reason named."""
    port = str(_free_port())
    target = "tests.common.planted_group_impls:takes_no_group"
    cmd = [sys.executable, *_job_cli("difftest", target, "--subgroups", "--examples", "3")]
    envs = [
        {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank), "MASTER_PORT": port}
        for rank in range(2)
    ]
    codes, outs = _run_together([(cmd, {**env, "MASTER_ADDR": "127.0.0.1"}) for env in envs], 300)
    assert codes == [2, 2], outs
    assert "'takes_no_group' does not take group=: --subgroups calls" in outs[0][1], outs
    assert outs[0][0] == outs[1][0] == "", outs


@pytest.mark.parametrize(
    ("target", "status"),
    [
        ("tests.common.planted_group_impls:mpi_odd_group_last_rank_keeps_input", 1),
        ("tests.common.planted_mpi:plain_ring", 0),
    ],
)
def test_subgroups_in_an_mpi_job_of_four(target: str, status: int) -> None:
    """``--ranks mpi-job --subgroups`` under ``mpirun -n 4``: smaller N on ``Split`` communicators; the
    odd-group bug is found at N = 3, the correct ring passes at every N."""
    cmd = [*_mpirun(4), "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR=127.0.0.1"]
    cmd += [sys.executable, "-m", "ring_ref", "difftest", "--ranks", "mpi-job", target, "--subgroups"]
    done = _run([*cmd, "--mode", "bound", "--examples", "20", "--seed", "1", "--json"], 300)
    assert (done.returncode != 0) == bool(status), (done.stdout, done.stderr[-3000:])
    doc = json.loads(done.stdout)
    if status:
        _odd_group_bug_found_at_three(doc)
    else:
        jsonschema.validate(doc, SCHEMA)
        assert doc["verdict"] == "pass" and doc["tested_n"] == [1, 2, 3, 4], doc


@pytest.mark.soak
def test_soak_eight_ranks_under_torchrun() -> None:
    done = _torchrun(8, _difftest("plain_ring", "--examples", "20", "--seed", "3"), 600)
    assert done.returncode == 0 and "PASS" in done.stdout, done.stderr[-3000:]


@pytest.mark.soak
def test_soak_two_simulated_nodes_of_two_ranks() -> None:
    """Two ``torchrun`` agents on 127.0.0.1 rendezvousing through c10d: 2 x 2 ranks, one report."""
    port = _free_port()
    common = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
    ]
    args = _difftest("constant_on_last_rank", "--mode", "bound", "--examples", "8", "--seed", "1")
    _, outs = _run_together(
        [([*TORCHRUN, *common, "--node-rank", str(node), *args], {}) for node in range(2)], 500
    )
    report = "".join(out for out, _ in outs)
    assert report.count("FAIL: ") == 1 and "ranks-disagree" in report and "--max-workers 4" in report, outs
    assert "rank(s) [3]" in report


@pytest.mark.gpu
def test_gpu_nccl_job_on_every_visible_device() -> None:
    """``--device cuda`` (backend nccl by default) on one rank per GPU: the correct ring passes."""
    import torch

    n = torch.cuda.device_count()
    assert n >= 1, "make gpu-check needs a CUDA device"
    options = ("--device", "cuda", "--mode", "bound", "--examples", "20", "--seed", "1")
    done = _torchrun(n, _job_cli("difftest", "torch.distributed:all_reduce", *options), 600)
    assert done.returncode == 0 and "PASS" in done.stdout, (done.stdout, done.stderr[-3000:])


def _every_mode_fails_at_three(doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, SCHEMA)
    for mode, result in doc["modes"].items():
        assert result["verdict"] == "fail" and result["counterexample"]["n"] == 3, (mode, doc)


@pytest.mark.clause("difftest-every-n", "difftest-job")
def test_a_bug_at_three_only_fails_every_mode_under_subgroups() -> None:
    """Issue #40 item 1: ``torchrun`` N = 4 with ``--subgroups``: a bug of the group of three alone (the
    ranks agree; zeros pass) fails every mode at ``--examples 20`` (the 20 seeds: the soak test)."""
    bug = "tests.common.planted_group_impls:chunks_rotated_at_three"
    options = ("--subgroups", "--examples", "20", "--seed", "4", "--json")  # before: bound passed it
    done = _torchrun(4, _job_cli("difftest", bug, *options), 300)
    assert done.returncode == 1, done.stderr[-3000:]
    _every_mode_fails_at_three(json.loads(done.stdout))


@pytest.mark.soak
@pytest.mark.clause("difftest-every-n", "difftest-job")
@pytest.mark.parametrize("seed", [s for s in range(20) if s != 4])
def test_soak_a_bug_at_three_only_fails_every_mode_under_subgroups_at_every_seed(seed: int) -> None:
    bug = "tests.common.planted_group_impls:chunks_rotated_at_three"
    options = ("--subgroups", "--examples", "20", "--seed", str(seed), "--json")
    done = _torchrun(4, _job_cli("difftest", bug, *options), 300)
    assert done.returncode == 1, done.stderr[-3000:]
    _every_mode_fails_at_three(json.loads(done.stdout))
