"""One MPI rank of :class:`~ring_ref._processes._mpi_job.MpiJob`, run under ``mpirun``.

``mpirun ... python -m ring_ref._processes._mpi_rank`` (the environment
variables below reach the rank through ``mpirun -x``).

The rank joins ``MPI.COMM_WORLD``, connects to the parent's Unix socket (path
in ``RING_REF_MPI_CONTROL``), proves itself with the token in
``RING_REF_MPI_TOKEN``, says hello (its rank and pid), takes the parent's
``sys.path``, then serves tasks until told to stop
(:data:`~ring_ref._processes._shared.STOP`) or the parent goes away.

A task is a pickle of ``(fn, payload)``; ``fn`` (a module-level function,
pickled by name) is called as ``fn(comm, payload)`` where ``comm`` is a fresh
duplicate of ``COMM_WORLD``, so that messages a failed task left behind can
never match a later task's receives.  The reply is a pickle of
``("ok", pickled result)`` or ``("error", formatted traceback)``: plain data,
which the parent reads without building any other object.

``faulthandler`` writes the Python stack of every thread to
``<control dir>/stack-<rank>.txt`` on ``SIGUSR1``: the parent takes it from a
rank that has not answered by its deadline.  A rank leaves by ``MPI.Finalize()``
and ``os._exit(0)``, skipping the interpreter's teardown.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import signal
import socket
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Final

from ring_ref._processes._shared import STOP

__all__ = ["CONTROL_ENV", "TOKEN_ENV", "main", "stack_path"]

CONTROL_ENV: Final = "RING_REF_MPI_CONTROL"
TOKEN_ENV: Final = "RING_REF_MPI_TOKEN"


def stack_path(control: str, rank: int) -> str:
    """Where rank ``rank`` writes its stacks on ``SIGUSR1``.

    >>> stack_path("/tmp/x/control.sock", 3)
    '/tmp/x/stack-3.txt'
    """
    return os.path.join(os.path.dirname(control), f"stack-{rank}.txt")


def _serve(conn: Connection) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    while (task := conn.recv_bytes()) != STOP:
        reply: tuple[str, object]
        try:
            fn, payload = pickle.loads(task)
            comm = world.Dup()
            result = fn(comm, payload)
            reply = ("ok", pickle.dumps(result))
            comm.Free()
        except BaseException:
            reply = ("error", traceback.format_exc())
        conn.send_bytes(pickle.dumps(reply))


def main() -> None:
    """Join the world, connect to the parent and serve its tasks (see the module docstring)."""
    from mpi4py import MPI

    control, token = os.environ[CONTROL_ENV], os.environ[TOKEN_ENV]
    rank = MPI.COMM_WORLD.Get_rank()
    with open(stack_path(control, rank), "w") as stacks:
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(control)
        with Connection(sock.detach()) as conn:
            conn.send_bytes(bytes.fromhex(token))
            conn.send_bytes(pickle.dumps(("hello", rank, os.getpid())))
            sys.path[:] = conn.recv()
            with contextlib.suppress(EOFError, OSError):  # the parent went away: just leave
                _serve(conn)
    # Leave without the interpreter's teardown (torch's thread pools and atexit hooks take seconds).
    sys.stdout.flush()
    sys.stderr.flush()
    MPI.Finalize()
    os._exit(0)


if __name__ == "__main__":
    main()
