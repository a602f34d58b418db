"""Bring up the loopback interface of a fresh network namespace, then run a command in it.

Run by path (standard library only, nothing else imported) as the first step
inside ``unshare --net``: a new network namespace has only ``lo``, and it is
down.  :mod:`ring_ref._processes._mpi_job` starts ``mpirun`` this way, so that every
socket OpenMPI opens (its daemon's, its PMIx server's, the ranks') exists in a
namespace where loopback is the only network there is.

    unshare --net -- python -I ring_ref/_processes/_netns.py mpirun ...
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in a 24-byte union


def loopback_up() -> None:
    """Set ``IFF_UP`` on ``lo`` (needs ``CAP_NET_ADMIN`` in this namespace, which ``unshare`` gives root)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack(_IFREQ, fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0)))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def main(argv: list[str]) -> None:
    """``loopback_up()``, then replace this process with ``argv``."""
    if not argv:
        raise SystemExit("usage: python -I _netns.py COMMAND [ARG ...]")
    loopback_up()
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
