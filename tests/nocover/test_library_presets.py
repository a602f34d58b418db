"""The libraries' presets against the libraries themselves (issue #41): MPICH and Intel MPI, each run
under its own ``mpiexec`` from the virtualenv this suite runs in (``pip install mpich mpi4py`` or
``pip install impi-rt mpi4py`` beside ring-ref), and MLX's ring backend under ``mlx.launch``
(``pip install 'mlx[cpu]'``: reveal only, at ``M >= N``).

``reveal`` (``tests/common/mpi_reveal.py``) names the preset of each algorithm at ``N = 3, 4`` and at
``M`` multiple and not multiple of ``N``; ``difftest --ranks mpi-job --mode exact --schedule PRESET``
passes that preset and fails the other libraries' presets.  Every test is ``soak`` (several MPI jobs
each) and is skipped only when the library is not the one ``mpi4py`` loads, the skip naming the pip
command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.common.paths import ROOT

pytestmark = pytest.mark.soak

BIN: Final = Path(sys.executable).parent
LIBRARY_PRESETS: Final = ("mpich-ring", "intel-ring", "recursive-doubling")


def _library() -> str:
    """``MPI.Get_library_version()`` of the ``mpi4py`` this suite imports, or ``""`` without one."""
    try:
        import mpi4py
    except ImportError:
        return ""
    mpi4py.rc.initialize = False  # never MPI_Init here: OpenMPI would start a singleton's orted (a leftover)
    from mpi4py import MPI

    return str(MPI.Get_library_version())


def _needs(name: str, pip: str) -> None:
    if not _library().startswith(name) or not (BIN / "mpiexec").exists():
        pytest.skip(f"{name} is not the MPI library here: pip install {pip} mpi4py (beside ring-ref)")


# (library, its mpiexec's loopback flags, algorithm variable, preset): what reveal found, the file's claims
MPICH: Final = ("MPICH", "mpich", ("-iface", "lo"))
INTEL: Final = ("Intel(R) MPI", "impi-rt", ())
CASES: Final = [
    (MPICH, {}, "recursive-doubling"),  # MPICH's default at every size
    (MPICH, {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "recursive_doubling"}, "recursive-doubling"),
    (MPICH, {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring"}, "mpich-ring"),
    (INTEL, {"I_MPI_ADJUST_ALLREDUCE": "8"}, "intel-ring"),
    (INTEL, {"I_MPI_ADJUST_ALLREDUCE": "1"}, "recursive-doubling"),
]


def _run(
    library: tuple[str, str, tuple[str, ...]], env: dict[str, str], n: int, *args: str
) -> subprocess.CompletedProcess[str]:
    _needs(library[0], library[1])
    environment = {**os.environ, **env, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    environment["PYTHONPATH"] = f"{ROOT}{os.pathsep}{environment.get('PYTHONPATH', '')}"
    command = [str(BIN / "mpiexec"), *library[2], "-n", str(n), sys.executable, *args]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.clause("schedule-presets", "doubling-tools")
@pytest.mark.parametrize(("library", "env", "preset"), CASES)
@pytest.mark.parametrize("n", [3, 4])
def test_reveal_names_the_librarys_preset(
    library: tuple[str, str, tuple[str, ...]], env: dict[str, str], preset: str, n: int
) -> None:
    for m in (2 * n + 1, 2 * n + 2, 64, 4096):
        done = _run(library, env, n, "-m", "tests.common.mpi_reveal", str(m))
        assert done.returncode == 0, done.stdout + done.stderr
        found = json.loads(done.stdout.strip().splitlines()[-1])
        assert preset in found["matches"], (m, found)


@pytest.mark.clause("schedule-presets", "doubling-tools")
@pytest.mark.parametrize(("library", "env", "preset"), CASES)
@pytest.mark.parametrize("n", [3, 4])
def test_difftest_passes_the_librarys_preset_and_fails_the_others(
    library: tuple[str, str, tuple[str, ...]], env: dict[str, str], preset: str, n: int
) -> None:
    for schedule in LIBRARY_PRESETS:
        done = _run(
            library,
            env,
            n,
            "-m",
            "ring_ref",
            "difftest",
            "--ranks",
            "mpi-job",
            "ring_ref.targets:mpi_allreduce",
            "--mode",
            "exact",
            "--examples",
            "30",
            "--schedule",
            schedule,
        )
        if schedule == preset:
            assert done.returncode == 0 and "PASS" in done.stdout, done.stdout + done.stderr
        else:
            assert done.returncode == 1 and "not-ring-order" in done.stdout, (
                schedule,
                done.stdout + done.stderr,
            )


@pytest.mark.clause("schedule-presets")
@pytest.mark.parametrize("n", [3, 4])
def test_reveal_names_mlx_ring(n: int) -> None:
    launcher = BIN / "mlx.launch"
    try:
        import mlx.core  # noqa: F401
    except ImportError:
        launcher = Path("/nonexistent")
    if not launcher.exists():
        pytest.skip("MLX is not installed here: pip install 'mlx[cpu]' (beside ring-ref)")
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for m in (n, 2 * n + 1, 2 * n + 2, 64, 4096):
        command = [str(launcher), "-n", str(n), "--backend", "ring", "--python", sys.executable]
        done = subprocess.run(
            [*command, str(ROOT / "tests" / "common" / "mlx_reveal.py"), str(m)],
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        found = json.loads(done.stdout.strip().splitlines()[-1])
        assert "mlx-ring" in found["matches"], (m, found)
