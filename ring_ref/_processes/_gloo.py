"""Run a function on ``world_size`` spawned processes joined by a ``torch.distributed`` group.

A small harness for multi-process tests and tools, loopback only:

* :class:`SpawnedGroup` starts ``world_size`` worker processes once, each of
  which joins one process group (``gloo`` by default) through the loopback
  ``torch.distributed.TCPStore`` that the parent hosts
  (:func:`ring_ref._processes._shared.host_store`), so nothing is reachable from outside.
  Every :meth:`SpawnedGroup.run` then calls ``fn(rank, world_size, payload)`` on all
  ranks of that same group and returns the per-rank results in rank order.

Failure handling, so that a test can never hang:

* a rank whose ``fn`` raises makes :meth:`~SpawnedGroup.run` raise
  :class:`RankError` carrying that rank's formatted traceback; the other ranks
  (which may be blocked waiting for the failed peer) are killed at once;
* a call that has not finished by its deadline kills every rank and raises
  :class:`TimeoutError` naming the ranks that did not finish;
* a rank that dies (signal, ``os._exit``) raises :class:`RankError` too.

After a failure or timeout the ring is torn down, and the next ``run``
respawns a fresh group, so one ``SpawnedGroup`` can outlive a failing case.
Leaving the ``with`` block (or :meth:`~SpawnedGroup.close`) asks each rank to
destroy its process group and exit, joins it, and kills any straggler.

Start methods: ``"forkserver"`` (the default) forks each rank from a clean
server process that was itself spawned and has imported torch once, so a rank
starts in a fraction of a second instead of re-importing torch (seconds per
process); ``"spawn"`` starts every rank as a fresh interpreter.  Neither
inherits the parent's state: both unpickle ``fn`` and ``payload`` in the
child, with the parent's ``sys.path`` at the time of the start.

``fn`` must be a module-level (picklable) function, and ``payload`` and each
result must be picklable.  ``fn`` may use ``torch.distributed`` freely with the
default group, which is the ring's group.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import pickle
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Final, Literal, TypeVar

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported at runtime, not in stubs

from ring_ref._processes._shared import (
    START_TIMEOUT_S,
    STOP,
    STOP_GRACE_S,
    Harness,
    host_store,
    join_group,
    loopback_listener,
    task_name,
)

__all__ = ["RankError", "SpawnedGroup"]

_P = TypeVar("_P")
_R = TypeVar("_R")
StartMethod = Literal["forkserver", "spawn"]

_REPORT_GRACE_S: Final = 1.0
"""How long the other ranks are given to reply or die once one rank has failed."""


class RankError(RuntimeError):
    """One or more ranks failed; ``tracebacks`` maps each failed rank to its formatted traceback."""

    def __init__(self, world_size: int, tracebacks: dict[int, str]) -> None:
        self.tracebacks = dict(sorted(tracebacks.items()))
        self.rank = next(iter(self.tracebacks))
        parts = [f"rank {r} of {world_size} failed:\n{tb.rstrip()}" for r, tb in self.tracebacks.items()]
        super().__init__(
            f"{len(parts)} rank(s) failed; the remaining ranks were killed.\n" + "\n\n".join(parts)
        )


@dataclass(frozen=True)
class _Config:
    world_size: int
    backend: str
    store_port: int
    group_timeout_s: float


def _worker(rank: int, config: _Config, conn: Connection) -> None:
    """Body of one spawned rank: join the group, then serve ``(fn, payload)`` calls until told to stop."""
    timeout = datetime.timedelta(seconds=config.group_timeout_s)
    try:
        if config.backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        join_group(config.backend, config.store_port, rank, config.world_size, timeout)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    try:
        conn.send(("ready", None))
        with contextlib.suppress(EOFError):  # the parent went away: just leave
            while (task := conn.recv_bytes()) != STOP:
                try:
                    fn, payload = pickle.loads(task)
                    conn.send(("ok", pickle.dumps(fn(rank, config.world_size, payload))))
                except BaseException:
                    conn.send(("error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class SpawnedGroup(Harness):
    """``world_size`` spawned processes in one ``torch.distributed`` group, reusable across calls.

    ``backend`` is ``"gloo"`` (CPU) or ``"nccl"`` (rank ``r`` uses CUDA device
    ``r % device_count``); ``start_method`` is ``"forkserver"`` or ``"spawn"``.
    ``group_timeout_s`` bounds each collective and point-to-point wait inside
    the ranks; ``start_timeout_s`` bounds starting the ranks and joining the group.
    Use as a context manager::

        with SpawnedGroup(4) as ring:
            results = ring.run(my_module_level_fn, payload, timeout_s=30)

    ``results[r]`` is ``my_module_level_fn(r, 4, payload)`` evaluated on rank ``r``.
    """

    def __init__(
        self,
        world_size: int,
        *,
        backend: str = "gloo",
        group_timeout_s: float = 30.0,
        start_timeout_s: float = START_TIMEOUT_S,
        start_method: StartMethod = "forkserver",
    ) -> None:
        super().__init__(world_size, start_timeout_s)
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn'; got {start_method!r}.")
        self.start_method = start_method
        self.backend = backend
        self.group_timeout_s = group_timeout_s
        self._procs: list[BaseProcess] = []
        self._store: TCPStore | None = None

    def _start(self, deadline: float) -> None:
        """Spawn the ranks and wait until every one has joined the group."""
        self._store = host_store(loopback_listener(), datetime.timedelta(seconds=self.group_timeout_s))
        config = _Config(self.world_size, self.backend, self._store.port, self.group_timeout_s)
        ctx: multiprocessing.context.SpawnContext | multiprocessing.context.ForkServerContext
        if self.start_method == "forkserver":
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload([__name__])
        else:
            ctx = multiprocessing.get_context("spawn")
        for rank in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_worker, args=(rank, config, child_end), name=f"ring-rank-{rank}")
            proc.daemon = True
            proc.start()
            child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
        self._collect("starting the process group", self.start_timeout_s, deadline)

    def run(self, fn: Callable[[int, int, _P], _R], payload: _P, *, timeout_s: float = 60.0) -> list[_R]:
        """Call ``fn(rank, world_size, payload)`` on every rank; return the results in rank order.

        Raises :class:`RankError` (with the failing ranks' tracebacks) if any rank
        raises or dies, and :class:`TimeoutError` naming the unfinished ranks if
        the call takes longer than ``timeout_s``; in both cases every rank is
        killed first, and the next call respawns the group.
        """
        self._send_task(fn, payload)
        what = f"running {task_name(fn)}"
        return [pickle.loads(blob) for blob in self._collect(what, timeout_s, time.monotonic() + timeout_s)]

    def _wait_stopped(self, deadline: float) -> None:
        """Join the ranks told to stop (each destroys its group and exits), until ``deadline``."""
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))

    def _collect(self, what: str, timeout_s: float, deadline: float) -> list[Any]:
        """Wait for one reply per rank; on error, death or ``deadline`` (``timeout_s`` away) kill all ranks
        and raise."""
        replies: dict[int, Any] = {}
        errors: dict[int, str] = {}
        while len(replies) < self.world_size and not errors:
            pending = [r for r in range(self.world_size) if r not in replies]
            remaining = deadline - time.monotonic()
            if not self._wait_any(pending, remaining):
                self._kill()
                raise TimeoutError(
                    f"{what} on {self.world_size} rank(s) timed out after {timeout_s:g} s; "
                    f"rank(s) {pending} did not finish (all ranks were killed)."
                )
            self._read_ready(pending, replies, errors)
        if errors:
            self._settle(replies, errors)
            self._kill()
            raise RankError(self.world_size, errors)
        return [replies[r] for r in range(self.world_size)]

    def _settle(self, replies: dict[int, Any], errors: dict[int, str]) -> None:
        """After a failure, wait up to :data:`_REPORT_GRACE_S` for the other ranks to reply or die.

        A rank that dies makes its peers fail too, often first ("connection closed by peer"):
        the grace lets the dead rank's own exit be seen and reported with them.
        """
        grace = time.monotonic() + _REPORT_GRACE_S
        pending = [r for r in range(self.world_size) if r not in replies and r not in errors]
        while pending:
            if not self._wait_any(pending, grace - time.monotonic()):
                return
            self._read_ready(pending, replies, errors)
            pending = [r for r in pending if r not in replies and r not in errors]

    def _wait_any(self, ranks: list[int], timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until one of ``ranks`` has replied or died; whether one has."""
        waitables = [self._conns[r] for r in ranks] + [self._procs[r].sentinel for r in ranks]
        return bool(multiprocessing.connection.wait(waitables, timeout=max(0.0, timeout_s)))

    def _read_ready(self, ranks: list[int], replies: dict[int, Any], errors: dict[int, str]) -> None:
        """Move every reply already available from ``ranks`` into ``replies`` or ``errors``."""
        for rank in ranks:
            conn = self._conns[rank]
            try:
                if not conn.poll(0):
                    if not self._procs[rank].is_alive():
                        code = self._procs[rank].exitcode
                        errors[rank] = f"the process exited with code {code} without replying"
                    continue
                kind, value = conn.recv()
            except (EOFError, OSError):
                self._procs[rank].join(STOP_GRACE_S)
                errors[rank] = f"the process exited with code {self._procs[rank].exitcode} without replying"
                continue
            if kind == "error":
                errors[rank] = value
            else:
                replies[rank] = value

    def _kill(self) -> None:
        """Terminate and join every rank, close the pipes and the store."""
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(STOP_GRACE_S)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._store = [], [], None
