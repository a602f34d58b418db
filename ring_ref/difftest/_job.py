"""``--ranks job``: the tester inside a job someone else launched (``torchrun``, ``srun``, ``mpirun``).

Every rank of the job's ``torch.distributed`` group runs :func:`run_in_job`
(clause ``difftest-job``).  Rank 0 also drives the search, the oracles, the
diagnosis and the report, in a thread of its own, through :class:`JobRanks`,
a :class:`~ring_ref.difftest._ranks.RankGroup`: the same one call on every
rank, the same deadline, grace and answers as ``--ranks gloo``.  The main
thread of every rank (rank 0's included) serves: it waits for the next case,
calls ``TARGET(tensor)`` on its own input (:func:`~ring_ref.difftest._call.observe`,
on ``--device``) and writes the raw answer back.

The side channel is the job's own store (``torch.distributed``'s default
store, under a prefix of its own), never the group under test:

* ``cmd/I/R``: the ``I``-th case for rank ``R`` (or the stop, with the verdict or the error);
* ``answer/I/R``: rank ``R``'s raw answer (the isolated worker's frame: JSON header, bits);
* ``ready/R``: rank ``R`` loaded the target (empty) or why not;
* ``hb/R``: rank ``R``'s heartbeat, a counter its watchdog thread adds to every
  :data:`HEARTBEAT_S`; a rank whose counter stops for :data:`DEAD_AFTER_S` is ``crashed``;
* ``bye/R``: rank ``R`` was sent ``SIGTERM`` (the launcher is ending the job,
  as ``torchrun`` does once a rank died): a rank gone without saying so is the dead one;
* ``stackreq/R`` and ``stack/R``: on a timeout rank 0 asks every rank still
  inside the call for its Python stack, which that rank's watchdog writes
  (rank 0 cannot signal processes on other nodes);
* ``verdict`` and ``done/R``: after a call that left ranks stuck in the target, rank 0
  prints the report, then sets the verdict; every rank's watchdog acknowledges it and
  ends its process with that status.

So every rank exits with the verdict's status (0, 1, 2), and the job ends
within ``--timeout`` plus :data:`JOB_GRACE_S` whatever the target does.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import faulthandler
import itertools
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import torch.distributed as dist

from ring_ref.difftest._call import observe
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._loading import TargetError, load_target
from ring_ref.difftest._ranks import AFTER_FAILURE_GRACE_S, START_TIMEOUT_S, Rank, RankGroup
from ring_ref.difftest._report import Report
from ring_ref.difftest._vocabulary import OpTarget, Target
from ring_ref.difftest._worker import Died, Reply, frame, target_frames, unframe

__all__ = [
    "DEAD_AFTER_S",
    "HEARTBEAT_S",
    "JOB_GRACE_S",
    "SHOW",
    "JobRank",
    "JobRanks",
    "job_size",
    "run_in_job",
]

HEARTBEAT_S: Final = 0.25
"""How often every rank's watchdog beats (and looks for a stack request or the verdict)."""
DEAD_AFTER_S: Final = 10.0
"""A rank whose heartbeat has not moved for this long is ``crashed`` (its process died or froze)."""
BYE_WAIT_S: Final = 1.0
"""After ``SIGTERM`` reached rank 0, how long the others get to say they were sent it too."""
JOB_GRACE_S: Final = 15.0
"""The job ends within ``--timeout`` plus this (stacks, the report, the verdict's acknowledgements)."""
_WAIT: Final = datetime.timedelta(seconds=30)
_runs = itertools.count()
_DIED_FIRST: Final = "its process died (then the launcher ended the job: the live ranks said so, it did not)"


def _show_text(report: Report) -> None:
    print(report.render(), file=sys.stderr)


SHOW: Final[contextvars.ContextVar[Callable[[Report], None]]] = contextvars.ContextVar(
    "SHOW", default=_show_text
)
"""How rank 0 prints the report before the job ends early (the command line sets it for ``--json``)."""


def job_size(group: object, max_workers: int | None) -> int:
    """The group's size, the only ``N`` of ``ranks="job"``; ``ValueError`` without a group or for another
    ``max_workers``."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "ranks='job' runs inside a job's torch.distributed process group, and none is initialised: "
            "call torch.distributed.init_process_group first on every rank, or run "
            "`torchrun ... -m ring_ref difftest --ranks job TARGET`"
        )
    size = dist.get_world_size(group)  # type: ignore[arg-type]
    if max_workers is not None and max_workers != size:
        raise ValueError(
            f"max_workers (--max-workers) {max_workers} differs from the job's {size} ranks: --ranks job "
            "tests N = the number of ranks (drop the option, or start a job of that many ranks)"
        )
    return size


def after_report(rank: int) -> None:
    """Hold every rank but 0 until rank 0 has printed the report (``torchrun`` ends a job once one exits)."""
    store = _store()
    if rank == 0:
        store.set("ring-ref-difftest/reported", "")
        return
    with contextlib.suppress(Exception):  # rank 0 gone: nothing left to wait for
        store.wait(["ring-ref-difftest/reported"], datetime.timedelta(seconds=JOB_GRACE_S))


def _store() -> Any:
    """The job's default store (``torch.distributed`` keeps it for the default group)."""
    return dist.distributed_c10d._get_default_store()


class _Watch:
    """Rank 0's view of which ranks are alive: heartbeats and ``bye`` notes, looked at once per beat."""

    def __init__(self, store: Any, size: int, terminated: threading.Event) -> None:
        self.store = store
        self.terminated = terminated
        self.terminated_at = float("inf")
        now = time.monotonic()
        self.beats = dict.fromkeys(range(size), (-1, now))
        self.looked = dict.fromkeys(range(size), 0.0)

    def dead(self, rank: int) -> str:
        """Why rank ``rank`` counts as dead, or ``""``."""
        now = time.monotonic()
        if now - self.looked[rank] >= HEARTBEAT_S:
            self.looked[rank] = now
            count = int(self.store.add(f"hb/{rank}", 0))
            if count != self.beats[rank][0]:
                self.beats[rank] = (count, now)
        silent = now - self.beats[rank][1]
        if silent >= DEAD_AFTER_S:
            return f"its heartbeat stopped {silent:.0f} s ago (the process died or froze)"
        if self.terminated.is_set():
            self.terminated_at = min(self.terminated_at, now)
            if now - self.terminated_at >= BYE_WAIT_S:
                if not self.store.check([f"bye/{rank}"]):
                    return _DIED_FIRST
                if now - self.terminated_at >= 2 * BYE_WAIT_S + AFTER_FAILURE_GRACE_S:
                    return "the launcher ended it (SIGTERM) during the call"
        return ""


class JobRank:
    """Rank ``rank`` of the job as :class:`JobRanks` drives it, through the store (a :class:`Rank`)."""

    def __init__(self, group: JobRanks, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.watched: list[int] = []

    def _key(self, what: str) -> str:
        return f"{what}/{self.group.calls}/{self.rank}"

    def send(self, request: object) -> bool:
        """Write the case for this rank."""
        self.group.store.set(self._key("cmd"), pickle.dumps(request))
        return True

    def poll(self) -> Reply | Died | None:
        """The answer if it is there; how the rank died if it did; else ``None``."""
        store, key = self.group.store, self._key("answer")
        if store.check([key]):
            data = store.get(key)
            store.delete_key(key)
            try:
                return unframe(data)
            except ValueError as exc:
                return Died(f"its answer was garbled ({exc})", "")
        why = self.group.watch.dead(self.rank)
        return Died(why, "") if why else None

    def request_stack(self) -> None:
        """Ask the rank's watchdog for its stack."""
        self.group.store.set(f"stackreq/{self.rank}", "")

    def collect_stack(self, give_up: float) -> str:
        """The stack the watchdog wrote, or ``""`` at ``give_up``."""
        store, key = self.group.store, f"stack/{self.rank}"
        while time.monotonic() < give_up:
            if store.check([key]):
                return bytes(store.get(key)).decode(errors="replace")
            time.sleep(0.02)
        return ""

    def read_output(self) -> str:
        """Nothing: a rank of a job writes to the job's own output."""
        return ""


class JobRanks(RankGroup):
    """``TARGET(tensor)`` on every rank of the job, driven from rank 0 (see the module docstring)."""

    kind = "job"
    poll_s = 0.002

    def __init__(self, store: Any, size: int, timeout_s: float, terminated: threading.Event) -> None:
        super().__init__(timeout_s)
        self.store = store
        self.size = size
        self.min_workers = size
        self.calls = 0
        self.watch = _Watch(store, size, terminated)
        self._ranks: Sequence[Rank] = [JobRank(self, r) for r in range(size)]

    def start(self) -> None:
        """Wait until every rank has loaded the target; :class:`TargetError` with the first rank's reason."""
        deadline = time.monotonic() + max(self.timeout_s, START_TIMEOUT_S)
        keys = [f"ready/{r}" for r in range(self.size)]
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                late = [r for r, k in enumerate(keys) if not self.store.check([k])]
                raise TargetError(f"rank(s) {late} did not load the target within {deadline:g} s")
            time.sleep(0.01)
        for rank, key in enumerate(keys):
            why = bytes(self.store.get(key)).decode(errors="replace")
            if why:
                raise TargetError(f"rank {rank}: {why}")

    def _group(self, n: int) -> Sequence[Rank]:
        if n != self.size:
            raise ValueError(
                f"--ranks job runs N = {self.size} (the job's world size) only; got a case of {n}"
            )
        if self.broken:
            raise TargetError(self.broken)
        self.calls += 1
        return self._ranks

    def _teardown(self, n: int) -> None:
        """Nothing to tear down: a call that left ranks inside the target breaks the job (:meth:`call`)."""

    def call(self, case: Case) -> Any:
        """One call on every rank; after one that left ranks inside the target, no other can be made."""
        outcome = super().call(case)
        if outcome.failure is not None or outcome.note:
            self.broken = (
                f"the job's ranks could not be called again after call {self.calls} "
                f"({outcome.failure.code if outcome.failure else 'raised'}): the modes after it did not run"
            )
        return outcome

    def close(self) -> None:
        """Nothing to close: :func:`run_in_job` ends the ranks."""


def _own_stack() -> str:
    """Every thread's Python stack in this process, without the tester's own frames."""
    with tempfile.TemporaryFile() as dump:
        faulthandler.dump_traceback(dump, all_threads=True)
        dump.seek(0)
        threads = target_frames(dump.read().decode(errors="replace")).split("\n\n")
    return "\n\n".join(t.strip("\n") for t in threads if 'File "' in t) + "\n"


def _leave(status: int) -> None:
    """End this process now with ``status`` (the target may hold the main thread forever)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        if dist.is_initialized() and dist.get_backend() == "nccl":
            dist.distributed_c10d._abort_process_group()
    os._exit(status)


def _watchdog(store: Any, rank: int, stop: threading.Event) -> None:
    """Beat; give the stack when asked; on the verdict, acknowledge it and end the process (not rank 0)."""
    stacked = False
    while not stop.wait(HEARTBEAT_S):
        try:
            store.add(f"hb/{rank}", 1)
            if not stacked and store.check([f"stackreq/{rank}"]):
                store.set(f"stack/{rank}", _own_stack())
                stacked = True
            if rank != 0 and store.check(["verdict"]):
                status = int(store.get("verdict"))
                store.set(f"done/{rank}", "")
                _leave(status)
        except Exception as exc:  # the store is gone: rank 0, the tester, has ended
            if stop.is_set():
                return
            print(f"ring-ref difftest --ranks job: rank {rank} lost the job's store ({exc})", file=sys.stderr)
            _leave(1)


class _Terminate:
    """``SIGTERM`` noted instead of obeyed at once: a rank says ``bye`` (rank 0 finishes its report first)."""

    def __init__(self, store: Any, rank: int) -> None:
        self.event = threading.Event()
        self.installed = threading.current_thread() is threading.main_thread()
        if not self.installed:
            return
        self.read, write = socket.socketpair()
        write.setblocking(False)
        self.write = write
        self.old_fd = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
        self.old_handler = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        threading.Thread(target=self._wait, args=(store, rank), daemon=True).start()

    def _wait(self, store: Any, rank: int) -> None:
        while True:
            try:
                data = self.read.recv(64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                with contextlib.suppress(Exception):
                    store.set(f"bye/{rank}", "")
                self.event.set()
                if rank != 0:
                    _leave(128 + signal.SIGTERM)
                time.sleep(JOB_GRACE_S)
                _leave(128 + signal.SIGTERM)

    def restore(self) -> None:
        """Put back the handler and wakeup descriptor there were before."""
        if self.installed:
            signal.set_wakeup_fd(self.old_fd)
            signal.signal(signal.SIGTERM, self.old_handler)
            self.write.close()
            self.read.close()


def _wait_key(store: Any, key: str) -> bytes:
    while True:
        try:
            store.wait([key], _WAIT)
        except dist.DistStoreError:
            continue
        data = bytes(store.get(key))
        store.delete_key(key)
        return data


def _serve(fn: Target | OpTarget | None, store: Any, rank: int, device: str) -> tuple[str, object]:
    """Answer cases until the stop; what the stop carries (``("report", Report)`` or ``("error", exc)``)."""
    for call in itertools.count(1):
        request = pickle.loads(_wait_key(store, f"cmd/{call}/{rank}"))
        if not isinstance(request, Case):
            return request  # type: ignore[no-any-return]
        assert fn is not None  # rank 0 sends cases only once every rank has loaded the target
        head, payload = observe(fn, request, rank, device=device)
        store.set(f"answer/{call}/{rank}", frame({"kind": "answer", **head}, payload))
    raise AssertionError("unreachable")


def _unavailable(case: Case) -> Any:
    raise RuntimeError("the expected results are computed on rank 0 only")


def _portable(report: Report) -> Report:
    """``report`` without what cannot travel to the other ranks (the order's functions)."""
    exact = report.exact_against
    if exact is None:
        return report
    return dataclasses.replace(
        report, exact_against=dataclasses.replace(exact, expected=_unavailable, cases=None)
    )


def _drive(
    run: Callable[[Launcher], Report],
    launcher: JobRanks,
    store: Any,
    show: Callable[[Report], None],
    got: dict[str, object],
) -> None:
    """Rank 0's driver thread: the whole difftest, then the stop (or, with ranks stuck, the exit)."""
    stop: tuple[str, object]
    try:
        report = run(launcher)
        stop = ("report", _portable(report))
        got["report"] = report
    except BaseException as exc:
        stop = ("error", exc)
        got["error"] = exc
    if launcher.broken and "report" in got:
        show(report)
        status = 0 if report.verdict == "pass" else 1
        store.set("verdict", str(status))
        give_up = time.monotonic() + 2 * BYE_WAIT_S
        while time.monotonic() < give_up and not store.check([f"done/{r}" for r in range(1, launcher.size)]):
            time.sleep(0.02)
        _leave(status)
    for rank in range(launcher.size):
        store.set(f"cmd/{launcher.calls + 1}/{rank}", pickle.dumps(stop))


def run_in_job(
    fn: Target | OpTarget | str,
    run: Callable[[Launcher], Report],
    *,
    group: object = None,
    device: str = "cpu",
    timeout_s: float,
) -> Report:
    """On every rank of the job's group: serve the target; on rank 0, also ``run(launcher)`` (the difftest).

    Returns the same :class:`Report` on every rank (rank 0's; the others get it through the store), or
    raises the exception the run raised on every rank.  When a call left ranks inside the target, rank 0
    prints the report (:data:`SHOW`) and every rank's process ends with the verdict's status instead.
    """
    show = SHOW.get()
    rank = dist.get_rank(group)  # type: ignore[arg-type]
    size = dist.get_world_size(group)  # type: ignore[arg-type]
    base: Any = dist.PrefixStore(  # type: ignore[attr-defined]  # re-exported at runtime, not in stubs
        f"ring-ref-difftest/{next(_runs)}", _store()
    )
    store = base.clone()
    error = ""
    target: Target | OpTarget | None = None
    try:
        target = load_target(fn) if isinstance(fn, str) else fn
    except TargetError as exc:
        error = str(exc)
    terminate = _Terminate(base.clone(), rank)
    stop = threading.Event()
    watchdog = threading.Thread(target=_watchdog, args=(base.clone(), rank, stop), daemon=True)
    watchdog.start()
    got: dict[str, object] = {}
    driver = None
    if rank == 0:
        launcher = JobRanks(base.clone(), size, timeout_s, terminate.event)
        driver = threading.Thread(target=_drive, args=(run, launcher, base.clone(), show, got), daemon=True)
        driver.start()
    store.set(f"ready/{rank}", error)
    try:
        kind, value = _serve(target, store, rank, device)
    finally:
        stop.set()
        watchdog.join()
        terminate.restore()
    store.set(f"done/{rank}", "")
    if driver is not None:
        driver.join()
        give_up = time.monotonic() + JOB_GRACE_S
        while time.monotonic() < give_up and not store.check([f"done/{r}" for r in range(size)]):
            time.sleep(0.01)
    if kind == "error":
        raise value  # type: ignore[misc]
    return got.get("report", value)  # type: ignore[return-value]
