#!/usr/bin/env bash
# Make sure OpenMPI (mpirun and libmpi, which the mpi4py wheel loads) is installed: used by
# `make test` (the MPI tests in tests/nocover/test_mpi.py) and .ci/run. Installs Debian's
# packages when missing, as root or through passwordless sudo; otherwise says what to install.
# MPICH is not installed: the mpi4py wheel does not load Debian's MPICH (libmpi.so.12).
set -euo pipefail
if command -v mpirun >/dev/null && [ -n "$(ldconfig -p | grep -F 'libmpi.so.40')" ]; then
    exit 0
fi
as_root=(env DEBIAN_FRONTEND=noninteractive)
if [ "$(id -u)" -ne 0 ]; then
    if ! sudo -n true 2>/dev/null; then
        echo "the MPI tests need OpenMPI: run 'sudo apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev'" >&2
        exit 1
    fi
    as_root=(sudo -n "${as_root[@]}")
fi
echo "installing OpenMPI with apt-get (needed by the MPI tests)"
"${as_root[@]}" apt-get update </dev/null
"${as_root[@]}" apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev </dev/null
