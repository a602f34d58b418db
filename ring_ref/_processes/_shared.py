"""What every launcher of ranks shares: the loopback store, dying with the parent, the lifecycle.

* :func:`loopback_listener`, :func:`host_store` and :func:`join_group`: a
  ``torch.distributed.TCPStore`` served on ``127.0.0.1`` at a free port chosen
  by the operating system (port 0, so no port race), through which each rank
  joins one process group with gloo's own sockets pinned to the loopback
  interface (``GLOO_SOCKET_IFNAME``), so nothing is reachable from outside;
* :func:`die_with_parent`: a child process asks the kernel to signal it when
  its parent dies;
* :class:`Harness`: the life of ``world_size`` ranks started once and reused
  (the world-size check, ``with``, :attr:`~Harness.running`, sending every rank
  a task, :meth:`~Harness.close`: the stop token :data:`STOP` to each rank, a
  grace period, then a kill).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import pickle
import socket
import time
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Final, Self

import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported at runtime, not in stubs

__all__ = [
    "LOOPBACK",
    "STOP",
    "STOP_GRACE_S",
    "Harness",
    "die_with_parent",
    "host_store",
    "join_group",
    "loopback_listener",
    "task_name",
]

LOOPBACK: Final = "127.0.0.1"
STOP: Final = b"stop"
"""What a launcher sends a rank to make it leave."""
STOP_GRACE_S: Final = 5.0
"""How long ranks told to stop (or killed) are given to end."""
_PR_SET_PDEATHSIG: Final = 1


def _loopback_interface() -> str:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS and the BSDs)."""
    names = [name for _, name in socket.if_nameindex()]
    return next((name for name in ("lo", "lo0") if name in names), "lo")


def loopback_listener() -> socket.socket:
    """A listening socket on ``127.0.0.1`` at a free port, for :func:`host_store`."""
    return socket.create_server((LOOPBACK, 0))


def host_store(listener: socket.socket, timeout: datetime.timedelta) -> TCPStore:
    """Serve the store on ``listener`` (from :func:`loopback_listener`), which it then owns and closes.

    ``TCPStore``'s own server would listen on every interface; handed a socket
    bound to loopback, it listens there only.  On failure ``listener`` is closed.
    """
    try:
        store = TCPStore(
            LOOPBACK,
            listener.getsockname()[1],
            is_master=True,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=listener.fileno(),
        )
    except BaseException:
        listener.close()
        raise
    listener.detach()
    return store


def join_group(backend: str, port: int, rank: int, world_size: int, timeout: datetime.timedelta) -> None:
    """In a rank: join the default process group through the loopback store at ``port`` (gloo on loopback)."""
    os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()
    store = TCPStore(LOOPBACK, port, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def die_with_parent(signum: int, parent: int | None = None) -> None:
    """In a child: ask the kernel to send it ``signum`` when its parent dies (Linux; elsewhere nothing).

    With ``parent`` (the parent's pid, taken before the fork) leave at once,
    by ``os._exit(0)``, if the parent has died already.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum)
    if parent is not None and os.getppid() != parent:
        os._exit(0)


def task_name(fn: object) -> str:
    """How a task is named in messages: its function's qualified name.

    >>> task_name(task_name)
    'task_name'
    """
    return str(getattr(fn, "__qualname__", fn))


class Harness(ABC):
    """``world_size`` ranks started once and reused, each joined to the launcher by a connection.

    A subclass says how the ranks start (:meth:`start`, which fills
    ``_conns`` in rank order), how to wait for ranks told to stop
    (:meth:`_wait_stopped`) and how to kill them (:meth:`_kill`, which empties
    ``_conns``).  Use as a context manager; after a kill the next task starts
    the ranks again.
    """

    def __init__(self, world_size: int, start_timeout_s: float) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int; got {world_size!r}.")
        self.world_size = world_size
        self.start_timeout_s = start_timeout_s
        self._conns: list[Connection] = []

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def running(self) -> bool:
        """Whether the ranks are up (after a failure they are started again by the next task)."""
        return bool(self._conns)

    @abstractmethod
    def start(self) -> None:
        """Start the ranks and wait until each is connected (no-op when already up)."""

    def _send_task(self, fn: object, payload: object) -> None:
        """Start the ranks if need be and send each the task ``(fn, payload)``."""
        try:
            task = pickle.dumps((fn, payload))
        except Exception as exc:
            raise TypeError(
                f"fn and payload must be picklable (fn a module-level function); pickling failed: {exc!r}"
            ) from exc
        self.start()
        for conn in self._conns:
            conn.send_bytes(task)

    def close(self) -> None:
        """Tell every rank to stop, give them :data:`STOP_GRACE_S` to end, then kill what is left."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(STOP)
        self._wait_stopped(time.monotonic() + STOP_GRACE_S)
        self._kill()

    @abstractmethod
    def _wait_stopped(self, deadline: float) -> None:
        """Wait until the ranks told to stop have ended, or until ``deadline``."""

    @abstractmethod
    def _kill(self) -> None:
        """Kill whatever is left of the ranks and release what they held (``_conns`` emptied)."""
