"""What every launcher of ranks shares: the loopback store, dying with the parent, the lifecycle, stacks.

* :func:`loopback_listener`, :func:`host_store` and :func:`join_group`: a
  ``torch.distributed.TCPStore`` served on ``127.0.0.1`` at a free port chosen
  by the operating system (port 0, so no port race), through which each rank
  joins one process group with gloo's own sockets pinned to the loopback
  interface (``GLOO_SOCKET_IFNAME``), so nothing is reachable from outside;
* :func:`die_with_parent`: a child process asks the kernel to signal it when
  its parent dies;
* :class:`Harness`: the one lifecycle of ``world_size`` rank processes started
  once and reused, whoever starts them (spawned gloo ranks, an ``mpirun`` job,
  difftest's forked ranks): the world-size check, ``with``,
  :attr:`~Harness.running`, :meth:`~Harness.start` within
  :attr:`~Harness.start_timeout_s` (what a failed start began is killed),
  sending every rank a task, :meth:`~Harness.close` (the stop token
  :data:`STOP` to each rank, a grace period, then a kill), and the times the
  harnesses share (:data:`START_TIMEOUT_S`, :data:`FAILURE_GRACE_S`,
  :data:`STACK_WAIT_S`); :class:`PerSize`: one harness per world size, made on
  first use and reused, all closed at once;
* :func:`ask_for_stack` and :func:`wait_for_stacks`: the Python stacks of a
  rank that has not answered by its deadline, which its ``faulthandler`` writes
  to a file on ``SIGUSR1``; :func:`kill_session`: a process and its process
  group killed at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import pickle
import signal
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Final, Generic, Self, TypeVar

import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported at runtime, not in stubs

__all__ = [
    "FAILURE_GRACE_S",
    "LOOPBACK",
    "STACK_WAIT_S",
    "START_TIMEOUT_S",
    "STOP",
    "STOP_GRACE_S",
    "Harness",
    "PerSize",
    "ask_for_stack",
    "die_with_parent",
    "host_store",
    "join_group",
    "kill_session",
    "loopback_listener",
    "task_name",
    "wait_for_stacks",
]

LOOPBACK: Final = "127.0.0.1"
STOP: Final = b"stop"
"""What a launcher sends a rank to make it leave."""
STOP_GRACE_S: Final = 5.0
"""How long ranks told to stop (or killed) are given to end."""
START_TIMEOUT_S: Final = 120.0
"""How long ranks may take to start and join, unless a harness is told otherwise."""
FAILURE_GRACE_S: Final = 2.0
"""After a rank raised or died, how long the other ranks get to finish before they are stopped."""
STACK_WAIT_S: Final = 2.0
"""How long the ranks asked for their stacks get to write them."""
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


def ask_for_stack(pid: int) -> None:
    """Ask process ``pid`` for its threads' Python stacks (``SIGUSR1``: its ``faulthandler`` writes them)."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGUSR1)


def wait_for_stacks(sizes: Callable[[], Sequence[int]], give_up: float) -> None:
    """Wait until the stacks asked for are written, or until ``give_up``.

    ``sizes`` gives the size of each stack file; they are written once every
    one is non-empty and none has grown between two looks.
    """
    last: Sequence[int] | None = None
    while time.monotonic() < give_up:
        time.sleep(0.05)
        now = sizes()
        if all(now) and now == last:
            return
        last = now


def kill_session(pid: int) -> None:
    """Kill process ``pid`` and every process of its process group (``SIGKILL``), without reaping them."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


def task_name(fn: object) -> str:
    """How a task is named in messages: its function's qualified name.

    >>> task_name(task_name)
    'task_name'
    """
    return str(getattr(fn, "__qualname__", fn))


class Harness(ABC):
    """``world_size`` rank processes started once and reused: the one lifecycle of every harness.

    A subclass says how the ranks start (:meth:`_start`, by a deadline; it
    fills ``_conns`` in rank order where the ranks are reached by
    connections, else says when they are :attr:`running`), how to wait for
    ranks told to stop (:meth:`_wait_stopped`) and how to kill them
    (:meth:`_kill`, which empties ``_conns``).
    Use as a context manager; after a kill the next task (or :meth:`start`)
    starts the ranks again.
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

    def start(self) -> None:
        """Start the ranks and wait, at most :attr:`start_timeout_s`, until each is ready (no-op when
        already up); if they cannot start, kill what was started and raise why."""
        if self.running:
            return
        try:
            self._start(time.monotonic() + self.start_timeout_s)
        except BaseException:
            self._kill()
            raise

    @abstractmethod
    def _start(self, deadline: float) -> None:
        """Start the ranks and wait until each is ready, or raise why not by ``deadline``."""

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


_H = TypeVar("_H", bound=Harness)


class PerSize(Generic[_H]):
    """One harness per world size ``n``, made by ``make(n)`` on first use and reused (``made``: some
    made already); :meth:`drop` closes one, :meth:`close` every one."""

    def __init__(self, make: Callable[[int], _H], made: Mapping[int, _H] | None = None) -> None:
        self.make = make
        self._made: dict[int, _H] = dict(made or {})

    def __contains__(self, n: object) -> bool:
        return n in self._made

    def __getitem__(self, n: int) -> _H:
        if n not in self._made:
            self._made[n] = self.make(n)
        return self._made[n]

    def drop(self, n: int) -> None:
        """Close the harness of ``n`` and forget it (the next use makes a new one)."""
        self._made.pop(n).close()

    def close(self) -> None:
        """Close every harness."""
        while self._made:
            self._made.popitem()[1].close()
