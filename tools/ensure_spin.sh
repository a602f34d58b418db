#!/usr/bin/env bash
# Make sure SPIN and a C compiler (for its verifiers) are installed: used by
# `make model-check` and .ci/run. Installs Debian's packages when missing, as root
# or through passwordless sudo; otherwise says what to install.
set -euo pipefail
if command -v spin >/dev/null && command -v cc >/dev/null; then
    exit 0
fi
as_root=(env DEBIAN_FRONTEND=noninteractive)
if [ "$(id -u)" -ne 0 ]; then
    if ! sudo -n true 2>/dev/null; then
        echo "model-check needs spin and a C compiler: run 'sudo apt-get install -y spin gcc libc6-dev'" >&2
        exit 1
    fi
    as_root=(sudo -n "${as_root[@]}")
fi
echo "installing spin and gcc with apt-get (needed by make model-check)"
"${as_root[@]}" apt-get update </dev/null
"${as_root[@]}" apt-get install -y spin gcc libc6-dev </dev/null
