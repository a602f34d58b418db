"""N MPI ranks on this machine, started once and reused: the harness behind the MPI targets and tests.

:class:`MpiJob` runs ``mpirun -n N python -m ring_ref._processes._mpi_rank`` once; every
rank connects back to the parent over a Unix socket in a private temporary
directory, and each :meth:`MpiJob.run` sends all ranks one task,
``fn(comm, payload)`` (``fn`` a module-level function, pickled by name), and
returns the per-rank results in rank order.  So a run pays ``mpirun``'s start
(about 2-4 s here) once per ``N``, not per call.

The launcher is the one of the MPI ``mpi4py`` uses, found and identified by
:func:`~ring_ref._processes._launchers.find_launcher` (``mpiexec`` names it:
``None`` looks beside the interpreter, then on ``PATH``), and given that
implementation's own flags (:meth:`~ring_ref._processes._launchers.MpiLauncher.command`):
OpenMPI's ``--oversubscribe``, shared memory and loopback, hydra's ``-iface lo``.
``mca`` adds ``--mca`` options under OpenMPI (e.g.
``{"coll_tuned_use_dynamic_rules": "1", "coll_tuned_allreduce_algorithm": "4"}``;
the second is silently ignored without the first); ``env`` sets the ranks'
environment variables (``MPIR_CVAR_*``, ``I_MPI_ADJUST_*``, ``OMPI_MCA_*``),
passed by name, as the launcher's own variables are.

**Loopback only.**  Where ``unshare --net`` works (root, as on CI), the launcher
runs in a network namespace of its own whose only interface is loopback
(:mod:`ring_ref._processes._netns` brings it up), so none of OpenMPI's sockets, including
its PMIx server's (which listens on every interface otherwise), can be reached
from outside.  Elsewhere the options above keep OpenMPI's traffic on ``lo``.
The parent itself uses no network at all: the control channel is a Unix
socket in a directory only this user can enter, and a rank must present a
random token before anything else is read from it.

**Failures** never hang a caller:

* a call not finished by ``timeout_s`` raises :class:`RanksTimedOut` naming the
  ranks still inside it, with each one's Python stack at that moment
  (``faulthandler``), and kills the job;
* a rank process that dies raises :class:`RankFailed` naming it (with
  ``mpirun``'s account: exit code or signal), after OpenMPI has aborted the job;
* a rank whose ``fn`` raises gives :class:`RankFailed` with its traceback; if
  every rank answered, the job stays up (each task runs on a fresh
  duplicate communicator), else the ranks still inside the call are given
  :data:`FAILURE_GRACE_S` to finish and then killed;
* a rank whose reply says it gave up (``run(gave_up=...)``: the target under
  test raised, and the rank answered that) gives the others the same grace;
  if some are still inside the call then, the job is killed and
  :class:`RanksStopped` carries the replies that came and the stopped ranks'
  stacks.

After a kill the next :meth:`~MpiJob.run` starts a fresh job.  :meth:`~MpiJob.close`
(or leaving the ``with`` block) stops the ranks and ``mpirun`` and kills
whatever is left of its session; ``mpirun`` also dies with the parent
(``PR_SET_PDEATHSIG``), and a rank leaves when the parent's socket closes.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import os
import pickle
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache, partial
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Final, TypeVar

from ring_ref._processes import _netns
from ring_ref._processes._launchers import MpiLauncher, MpiUnavailable, find_launcher
from ring_ref._processes._mpi_rank import CONTROL_ENV, TOKEN_ENV, stack_path
from ring_ref._processes._shared import (
    FAILURE_GRACE_S,
    STACK_WAIT_S,
    START_TIMEOUT_S,
    STOP_GRACE_S,
    Harness,
    ask_for_stack,
    die_with_parent,
    kill_session,
    task_name,
    wait_for_stacks,
)

__all__ = [
    "MpiJob",
    "MpiUnavailable",
    "RankFailed",
    "RanksStopped",
    "RanksTimedOut",
    "StartFailed",
    "mpirun_path",
    "plain_loads",
]

_P = TypeVar("_P")
_R = TypeVar("_R")

_POLL_S: Final = 0.25
_LOG_TAIL: Final = 3000
_PASSED: Final = (CONTROL_ENV, TOKEN_ENV, "PYTHONPATH")
"""The variables every rank is handed: the control socket, the token, the parent's ``PYTHONPATH``."""


class StartFailed(RuntimeError):
    """The ranks did not all connect: the launcher exited or the start timed out; the message names the
    launcher, its command line and its output, and points to ``--ranks mpi-job``."""


@dataclass
class RankFailed(RuntimeError):
    """Ranks failed: ``tracebacks`` of those whose ``fn`` raised, ``died`` for processes that ended.

    ``stacks`` holds the stacks of ranks still inside the call when the job was
    killed; ``killed`` says whether it was (else it is still up for the next call).
    """

    world_size: int
    tracebacks: dict[int, str] = field(default_factory=dict)
    died: dict[int, str] = field(default_factory=dict)
    stacks: dict[int, str] = field(default_factory=dict)
    killed: bool = True
    log: str = ""

    def __post_init__(self) -> None:
        parts = [
            f"rank {r} of {self.world_size} raised:\n{tb.rstrip()}"
            for r, tb in sorted(self.tracebacks.items())
        ]
        parts += [f"rank {r} of {self.world_size} died: {how}" for r, how in sorted(self.died.items())]
        parts += [
            f"rank {r} was still inside the call, at:\n{stack.rstrip()}"
            for r, stack in sorted(self.stacks.items())
        ]
        if self.log:
            parts.append(f"mpirun's output (end):\n{self.log.rstrip()}")
        ranks = sorted({*self.tracebacks, *self.died})
        fate = "the job was killed" if self.killed else "the job is still up"
        super().__init__(f"rank(s) {ranks} failed; {fate}.\n" + "\n\n".join(parts))

    @property
    def ranks(self) -> list[int]:
        """The failed ranks (raised or died), in order."""
        return sorted({*self.tracebacks, *self.died})


@dataclass
class RanksTimedOut(TimeoutError):
    """``pending`` ranks had not finished within ``timeout_s``; ``stacks`` is where each one was."""

    world_size: int
    timeout_s: float
    what: str
    pending: list[int]
    stacks: dict[int, str]

    def __post_init__(self) -> None:
        super().__init__(
            f"{self.what} on {self.world_size} MPI rank(s) timed out after {self.timeout_s:g} s; rank(s) "
            f"{self.pending} did not finish (the job was killed).\n{_shown(self.pending, self.stacks)}"
        )


@dataclass
class RanksStopped(RuntimeError):
    """Ranks ``stopped`` were still inside the call :data:`FAILURE_GRACE_S` after ranks ``gave_up``
    answered that they had given up; the job was killed.

    ``replies`` holds the replies that came, by rank; ``stacks`` where each stopped rank was.
    """

    world_size: int
    replies: dict[int, Any]
    gave_up: list[int]
    stopped: list[int]
    stacks: dict[int, str]

    def __post_init__(self) -> None:
        super().__init__(
            f"rank(s) {self.stopped} of {self.world_size} were still inside the call {FAILURE_GRACE_S:g} s "
            f"after rank(s) {self.gave_up} gave up (the job was killed).\n{_shown(self.stopped, self.stacks)}"
        )


def _shown(ranks: list[int], stacks: dict[int, str]) -> str:
    """Where each of ``ranks`` was, from ``stacks``, for an exception's message."""
    return "\n\n".join(f"rank {r} at:\n{stacks.get(r, '(no stack could be taken)').rstrip()}" for r in ranks)


def mpirun_path(mpiexec: str | None = None) -> str:
    """The launcher to use (:func:`~ring_ref._processes._launchers.find_launcher`'s path);
    :class:`MpiUnavailable` if there is none of ``mpi4py``'s MPI, or no ``mpi4py``."""
    return find_launcher(mpiexec, os.environ.get("PATH")).path


@cache
def _netns_works() -> bool:
    """Whether ``unshare --net`` may be used here (root, or a kernel that lets this user)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = [unshare, "--net", "--", sys.executable, "-I", _netns.__file__, "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


_EXIT = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s+Exit code:\s+(-?\d+)")
_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)(?: \(([^)]*)\))?")
_HYDRA_CODES = re.compile(r"Exit codes: \[[^\]]*\] (\d+(?:,\d+)*)")
"""Hydra's ``-print-all-exitcodes`` line: every rank's wait status, in rank order (MPICH, Intel MPI)."""
_HYDRA = re.compile(
    r"RANK (\d+) PID \d+ RUNNING AT \S+\s*=\s*(?:KILLED BY SIGNAL: (\d+) \(([^)]*)\)|EXIT CODE: (\d+))"
)


def _mpirun_account(log: str) -> dict[int, str]:
    """The rank ``mpirun`` says failed first, and how.

    >>> _mpirun_account("Process name: [[9232,1],1]\\n  Exit code:    3\\n")
    {1: 'exited with code 3'}
    >>> _mpirun_account("process rank 2 with PID 0 on node vm exited on signal 9 (Killed).")
    {2: 'killed by signal 9 (Killed)'}
    >>> _mpirun_account("=   RANK 1 PID 7 RUNNING AT vm\\n=   KILLED BY SIGNAL: 9 (Killed)")
    {1: 'killed by signal 9 (Killed)'}
    >>> _mpirun_account("=   RANK 0 PID 7 RUNNING AT vm\\n=   KILLED BY SIGNAL: 9 (Killed)\\n"
    ...                 "[mpiexec@vm] Exit codes: [vm:0] 9,768,9")
    {1: 'exited with code 3'}
    """
    if m := _HYDRA_CODES.search(log):
        return _hydra_statuses([int(status) for status in m[1].split(",")])
    if m := _EXIT.search(log):
        return {int(m[1]): f"exited with code {m[2]}"}
    if m := _SIGNAL.search(log):
        return {int(m[1]): f"killed by signal {m[2]}" + (f" ({m[3]})" if m[3] else "")}
    if m := _HYDRA.search(log):
        return {int(m[1]): f"killed by signal {m[2]} ({m[3]})" if m[2] else f"exited with code {m[4]}"}
    return {}


def _hydra_statuses(statuses: list[int]) -> dict[int, str]:
    """The ranks that ended on their own, from hydra's wait statuses: an exit code, or a signal other than
    the ``SIGKILL`` with which hydra ends the others once one has ended (every one that ended otherwise
    when all were killed).

    >>> _hydra_statuses([0, 768, 0]), _hydra_statuses([9, 11, 9])
    ({1: 'exited with code 3'}, {1: 'killed by signal 11'})
    >>> _hydra_statuses([9, 9])
    {0: 'killed by signal 9', 1: 'killed by signal 9'}
    """
    ended = {
        r: f"killed by signal {status & 0x7F}" if status & 0x7F else f"exited with code {status >> 8}"
        for r, status in enumerate(statuses)
        if status
    }
    first = {r: how for r, how in ended.items() if how != "killed by signal 9"}
    return first or ended


class MpiJob(Harness):
    """``world_size`` MPI ranks under one ``mpirun``, reusable across calls (see the module docstring).

    Use as a context manager::

        with MpiJob(4) as ring:
            results = ring.run(my_module_level_fn, payload, timeout_s=30)

    ``results[r]`` is ``my_module_level_fn(comm, payload)`` evaluated on rank
    ``r``, ``comm`` a duplicate of its ``COMM_WORLD``.
    """

    def __init__(
        self,
        world_size: int,
        *,
        mca: Mapping[str, str] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        isolate: bool | None = None,
        env: Mapping[str, str] | None = None,
        mpiexec: str | None = None,
    ) -> None:
        super().__init__(world_size, start_timeout_s)
        self.mca = dict(mca or {})
        self.env = dict(env or {})
        self.mpiexec = mpiexec
        self.isolate = isolate
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._pids: list[int] = []

    @property
    def pids(self) -> list[int]:
        """The process ids: ``mpirun``'s, then each rank's (empty when no job is up)."""
        return [self._proc.pid, *self._pids] if self._proc is not None else []

    @property
    def launcher(self) -> MpiLauncher:
        """The launcher of the MPI ``mpi4py`` uses (:class:`MpiUnavailable` when there is none)."""
        return find_launcher(self.mpiexec, os.environ.get("PATH"))

    def command(self) -> list[str]:
        """The command line that starts the job (without the network-namespace prefix);
        :class:`MpiUnavailable` for ``mca`` options under a launcher that is not OpenMPI's."""
        launcher = self.launcher
        if self.mca and launcher.hydra:
            raise MpiUnavailable(
                f"--mca options are OpenMPI's, and mpi4py's MPI is {launcher.implementation} ({launcher}): "
                "set its variables with --env NAME=VALUE instead (MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring "
                "under MPICH, I_MPI_ADJUST_ALLREDUCE=8 under Intel MPI)"
            )
        cmd = launcher.command(self.world_size, [*_PASSED, *self.env], self.mca)
        return [*cmd, sys.executable, "-m", "ring_ref._processes._mpi_rank"]

    def _start(self, deadline: float) -> None:
        """Start ``mpirun`` and wait until every rank has connected."""
        command = self.command()
        isolate = _netns_works() if self.isolate is None else self.isolate
        if isolate:
            unshare = shutil.which("unshare") or "unshare"
            command = [unshare, "--net", "--", sys.executable, "-I", _netns.__file__, *command]
        self._dir = Path(tempfile.mkdtemp(prefix="ring-ref-mpi-"))
        control = str(self._dir / "control.sock")
        token = secrets.token_bytes(16)
        package_root = str(Path(__file__).resolve().parents[2])
        env = {
            **os.environ,
            **self.env,
            CONTROL_ENV: control,
            TOKEN_ENV: token.hex(),
            "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
        }
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(control)
            listener.listen(self.world_size)
            with open(self._dir / "mpirun.log", "wb") as log:
                self._proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=partial(die_with_parent, signal.SIGTERM),  # noqa: PLW1509  (one prctl call; no locks)
                )
            self._accept(listener, token, deadline)
        finally:
            listener.close()

    def _accept(self, listener: socket.socket, token: bytes, deadline: float) -> None:
        """Take one connection per rank; on a wrong token, ``mpirun`` exiting or ``deadline``, raise."""
        by_rank: dict[int, tuple[Connection, int]] = {}
        listener.settimeout(_POLL_S)
        while len(by_rank) < self.world_size:
            if time.monotonic() > deadline or self._exited():
                self._conns = [c for c, _ in by_rank.values()]
                raise StartFailed(self._start_failure(len(by_rank)))
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            conn = Connection(sock.detach())
            hello = _hello(conn, token, deadline)
            if hello is None:
                conn.close()
                continue
            conn.send(list(sys.path))
            by_rank[hello[0]] = (conn, hello[1])
        self._conns = [by_rank[r][0] for r in range(self.world_size)]
        self._pids = [by_rank[r][1] for r in range(self.world_size)]

    def _start_failure(self, connected: int) -> str:
        """Why the start failed, naming the launcher assumed, with its output and the way out."""
        why = "failed: the launcher exited" if self._exited() else "timed out"
        return (
            f"starting {self.world_size} MPI rank(s) {why} ({connected} connected, "
            f"{self.start_timeout_s:g} s allowed); --ranks mpi assumed {self.launcher}, the launcher of the "
            f"MPI mpi4py uses, and ran: {' '.join(self.command())}. If your MPI needs other options, start "
            "the job yourself and run the tester inside it: mpiexec -n N ring-ref difftest --ranks mpi-job "
            f"TARGET (reveal and invariance take --ranks mpi-job too).\n{self._log_tail()}"
        )

    def run(
        self,
        fn: Callable[[Any, _P], _R],
        payload: _P,
        *,
        timeout_s: float = 60.0,
        trusted: bool = True,
        gave_up: Callable[[_R], bool] | None = None,
    ) -> list[_R]:
        """Call ``fn(comm, payload)`` on every rank; return the results in rank order.

        Raises :class:`RanksTimedOut`, :class:`RankFailed` or :class:`RanksStopped`
        (see the module docstring).  ``trusted=False`` accepts only plain data
        back (``None``, bools, numbers, strings, bytes, and lists, tuples and
        dicts of them): a rank running code under test cannot make the parent
        build any other object.  ``gave_up``: a result for which it is true is
        the answer of a rank that gave up (``fn`` caught the target's
        exception): the ranks still inside the call get :data:`FAILURE_GRACE_S`
        to finish, as after a rank whose ``fn`` raised.
        """
        self._send_task(fn, payload)
        loads: Callable[[bytes], Any] = pickle.loads if trusted else plain_loads
        return self._collect(f"running {task_name(fn)}", timeout_s, loads, gave_up)

    def _collect(
        self,
        what: str,
        timeout_s: float,
        loads: Callable[[bytes], Any],
        gave_up: Callable[[Any], bool] | None,
    ) -> list[Any]:
        """One result per rank, or the failure, killing the job unless every rank answered."""
        deadline = time.monotonic() + timeout_s
        replies: dict[int, Any] = {}
        errors: dict[int, str] = {}
        gone: set[int] = set()
        quit_: list[int] = []
        grace_until: float | None = None

        def pending() -> list[int]:
            return [
                r for r in range(self.world_size) if r not in replies and r not in errors and r not in gone
            ]

        while (waiting := pending()) and not (gone and self._exited()):
            remaining = min(deadline, grace_until or deadline) - time.monotonic()
            if remaining <= 0:
                break
            ready = wait([self._conns[r] for r in waiting], timeout=min(_POLL_S, remaining))
            for rank in waiting:
                if self._conns[rank] in ready:
                    kind, value = _reply(self._conns[rank], loads)
                    if kind == "gone":
                        gone.add(rank)
                    elif kind == "error":
                        errors[rank] = value
                    else:
                        replies[rank] = value
                        if gave_up is not None and gave_up(value):
                            quit_.append(rank)
            if not ready and self._exited():
                gone.update(waiting)
            if (errors or gone or quit_) and grace_until is None:
                grace_until = time.monotonic() + FAILURE_GRACE_S
        waiting = pending()
        if not waiting and not errors and not gone:
            return [replies[r] for r in range(self.world_size)]
        raise self._failure(what, timeout_s, waiting, replies, errors, gone, quit_)

    def _failure(  # noqa: PLR0917 - what one collection found, passed on whole
        self,
        what: str,
        timeout_s: float,
        waiting: list[int],
        replies: dict[int, Any],
        errors: dict[int, str],
        gone: set[int],
        quit_: list[int],
    ) -> Exception:
        """The exception for a collection that did not end with every rank's result, killing the job
        unless every rank answered."""
        if not waiting and not gone:
            return RankFailed(self.world_size, tracebacks=errors, killed=False)
        if gone:
            self._wait_exit(STOP_GRACE_S)
            log = self._log_tail()
            died = _mpirun_account(log) or {r: "its process ended without answering" for r in sorted(gone)}
            self._kill()
            return RankFailed(self.world_size, tracebacks=errors, died=died, log=log)
        stacks = self._stacks(waiting)
        self._kill()
        if errors:
            return RankFailed(self.world_size, tracebacks=errors, stacks=stacks)
        if quit_:
            return RanksStopped(self.world_size, replies, quit_, waiting, stacks)
        return RanksTimedOut(self.world_size, timeout_s, what, waiting, stacks)

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        """Each rank's Python stacks, written by its ``faulthandler`` on ``SIGUSR1``."""
        assert self._dir is not None
        control = str(self._dir / "control.sock")
        paths = {r: Path(stack_path(control, r)) for r in ranks}
        for r in ranks:
            ask_for_stack(self._pids[r])
        wait_for_stacks(
            lambda: [p.stat().st_size if p.exists() else 0 for p in paths.values()],
            time.monotonic() + STACK_WAIT_S,
        )
        return {r: p.read_text(errors="replace") for r, p in paths.items() if p.exists() and p.stat().st_size}

    def _exited(self) -> bool:
        return self._proc is None or self._proc.poll() is not None

    def _wait_exit(self, seconds: float) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(seconds)

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        with contextlib.suppress(OSError):
            return (self._dir / "mpirun.log").read_text(errors="replace")[-_LOG_TAIL:]
        return ""

    def _wait_stopped(self, deadline: float) -> None:
        """Give ``mpirun`` until ``deadline`` to end the job once every rank was told to stop."""
        self._wait_exit(max(0.0, deadline - time.monotonic()))

    def _kill(self) -> None:
        """Kill ``mpirun``'s session (it and every rank), reap it, close the sockets, remove the directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            kill_session(proc.pid)
            ranks = []
            for pid in self._pids:  # each rank has a process group of its own, in mpirun's session
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if os.getsid(pid) == proc.pid:
                        os.kill(pid, signal.SIGKILL)
                        ranks.append(pid)
            proc.wait()
            deadline = time.monotonic() + STOP_GRACE_S
            while any(map(_alive, ranks)) and time.monotonic() < deadline:
                time.sleep(0.02)
        for conn in self._conns:
            conn.close()
        self._conns, self._pids = [], []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _reply(conn: Connection, loads: Callable[[bytes], Any]) -> tuple[str, Any]:
    """A rank's reply: ``("ok", result)``, ``("error", text)`` (``fn`` raised, or its result was refused
    by ``loads``) or ``("gone", None)`` (the connection ended or carried garbage)."""
    try:
        kind, value = plain_loads(conn.recv_bytes())
    except (EOFError, OSError, pickle.UnpicklingError, ValueError, TypeError):
        return "gone", None
    if kind != "ok":
        return "error", value
    try:
        return "ok", loads(value)
    except pickle.UnpicklingError as exc:
        return "error", f"its result was refused: {exc}"


class _PlainUnpickler(pickle.Unpickler):
    """Builds only what pickle encodes without naming a class: plain data."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a rank sent {module}.{name}; only plain data is accepted")


def plain_loads(data: bytes) -> Any:
    """``pickle.loads`` for plain data only (see :meth:`MpiJob.run`'s ``trusted``).

    >>> plain_loads(pickle.dumps(("ok", b"bits", [1, 2.5, None], {"k": True})))
    ('ok', b'bits', [1, 2.5, None], {'k': True})
    >>> plain_loads(pickle.dumps(ValueError("x")))
    Traceback (most recent call last):
    ...
    _pickle.UnpicklingError: a rank sent builtins.ValueError; only plain data is accepted
    """
    return _PlainUnpickler(io.BytesIO(data)).load()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _hello(conn: Connection, token: bytes, deadline: float) -> tuple[int, int] | None:
    """A rank's ``(rank, pid)``, read only after it has shown the token; ``None`` for anything else."""
    try:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            return None
        if not hmac.compare_digest(conn.recv_bytes(len(token)), token):
            return None
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            return None
        kind, rank, pid = plain_loads(conn.recv_bytes(4096))
    except (EOFError, OSError, ValueError, TypeError, pickle.UnpicklingError):
        return None
    return (int(rank), int(pid)) if kind == "hello" else None
