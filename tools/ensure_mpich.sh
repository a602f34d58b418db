#!/usr/bin/env bash
# Make sure .venv-mpich exists: MPICH and an mpi4py that loads it, from PyPI (`pip install mpich mpi4py`,
# a few seconds), as a user of MPICH installs them, for the MPICH test in tests/nocover/test_difftest_mpi.py
# (--ranks mpi finds MPICH's mpiexec beside that interpreter, not Debian's OpenMPI mpirun on PATH).
# Everything else (torch, numpy, ring-ref) comes from .venv, added after the virtualenv's own packages
# (a .pth file), so that its mpi4py is MPICH's. Used by `make test` (system-tools) and .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
target=.venv-mpich
if [ -x "$target/bin/mpiexec" ] && [ -f "$target/.installed-stamp" ]; then
    exit 0
fi
echo "creating $target (pip install mpich mpi4py; needed by the MPICH test)"
.venv/bin/python -m venv --clear "$target"
"$target/bin/python" -m pip install --quiet -c constraints.txt mpich mpi4py
deps=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
own=$("$target/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "import site; site.addsitedir('$deps')" > "$own/ring_ref_deps.pth"
touch "$target/.installed-stamp"
