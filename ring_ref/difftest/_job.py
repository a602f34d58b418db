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

* ``cmd/I``: the ``I``-th case, one key read by every rank (or the stop, with the report or the error);
* ``answer/I/R``: rank ``R``'s raw answer (the isolated worker's frame: JSON header, bits), from the
  ranks ``R < N`` of the case (with ``subgroups``, a case of ``N`` below the world size runs on the
  subgroup of ranks ``0 .. N-1``; the other ranks idle until the next case);
* ``ready/R``: rank ``R`` loaded the target (empty) or why not;
* ``hb/R``: rank ``R``'s heartbeat, a counter its watchdog thread adds to every
  :data:`HEARTBEAT_S`; a rank whose counter stops for :data:`DEAD_AFTER_S` is ``crashed``;
* ``bye/R``: rank ``R`` was sent ``SIGTERM`` (the launcher is ending the job,
  as ``torchrun`` does once a rank died), or under ``mpirun`` ``SIGCONT`` (OpenMPI's first signal
  when a rank died, :data:`MPIRUN_BYE_WAIT_S`): a rank gone without saying so is the dead one;
* ``stackreq/R`` and ``stack/R``: on a timeout rank 0 asks every rank still
  inside the call for its Python stack, which that rank's watchdog writes
  (rank 0 cannot signal processes on other nodes);
* ``verdict`` and ``done/R``: after a call that left ranks stuck in the target, rank 0
  prints the report, then sets the verdict; every rank's watchdog acknowledges it and
  ends its process with that status.

So every rank exits with the verdict's status (0, 1, 2), and the job ends
within ``--timeout`` plus :data:`JOB_GRACE_S` whatever the target does.

``--subgroups`` (``subgroups=True``): every ``N`` from 1 to the world size is
drawn, as under ``--ranks gloo``.  Before the first case every rank creates,
in the same order, the subgroups of ranks ``0 .. k-1`` for ``k = 1 .. N-1``
(``torch.distributed.new_group``; under MPI ``Split``), and a case of ``N``
calls ``TARGET(tensor, group=G)`` (``TARGET(comm_N, array)``) on ranks
``0 .. N-1``, ``G`` the whole group for ``N`` = the world size.  The report's
``tested_n`` lists the ``N`` that were called.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import faulthandler
import functools
import inspect
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
from typing import Any, Final, TypeVar, cast

import torch.distributed as dist

from ring_ref._processes._shared import FAILURE_GRACE_S, START_TIMEOUT_S
from ring_ref.difftest._call import Answer, Outcome, observe
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._launch import Launcher
from ring_ref.difftest._loading import TargetError, load_target
from ring_ref.difftest._mpi import decode_rank, observe_rank, plain_json, plain_unjson
from ring_ref.difftest._ranks import Rank, RankGroup
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
    "run_in_mpi_job",
    "takes_group",
]

HEARTBEAT_S: Final = 0.25
"""How often every rank's watchdog beats (and looks for a stack request or the verdict)."""
DEAD_AFTER_S: Final = 10.0
"""A rank whose heartbeat has not moved for this long is ``crashed`` (its process died or froze)."""
BYE_WAIT_S: Final = 1.0
"""After ``SIGTERM`` reached rank 0, how long the others get to say they were sent it too."""
MPIRUN_BYE_WAIT_S: Final = 0.3
"""The same under ``mpirun``, which sends every live rank ``SIGCONT`` as soon as one died, ``SIGTERM`` a
second later and ``SIGKILL`` a second after that (OpenMPI's ``odls_base_sigkill_timeout``): rank 0 has
under two seconds to name the dead rank and print the report."""
JOB_GRACE_S: Final = 15.0
"""The job ends within ``--timeout`` plus this (stacks, the report, the verdict's acknowledgements)."""
_WAIT: Final = datetime.timedelta(seconds=30)
_runs = itertools.count()
T = TypeVar("T")
_DIED_FIRST: Final = "its process died (then the launcher ended the job: the live ranks said so, it did not)"


def _show_text(outcome: object) -> None:
    print(outcome.render() if isinstance(outcome, Report) else outcome, file=sys.stderr)


SHOW: Final[contextvars.ContextVar[Callable[[object], None] | None]] = contextvars.ContextVar(
    "SHOW", default=None
)
"""How rank 0 shows the report (or the error) before the other ranks are let go: the command line's
printing; ``None`` (the Python API): the caller gets the report, and only a job ended early prints it
(to stderr)."""


def job_size(ranks: str, group: object, max_workers: int | None) -> int:
    """The group's size (``COMM_WORLD``'s for ``"mpi-job"``), the only ``N`` of ``ranks="job"``;
    ``ValueError`` without a process group, for a ``group`` that is none, or for another ``max_workers``."""
    if ranks == "mpi-job":
        from mpi4py import MPI

        return _size_fits(int(MPI.COMM_WORLD.Get_size()), max_workers)
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "ranks='job' runs inside a job's torch.distributed process group, and none is initialised: "
            "call torch.distributed.init_process_group first on every rank, or run "
            "`torchrun ... -m ring_ref difftest --ranks job TARGET`"
        )
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise ValueError(
            "group must be a torch.distributed process group (torch.distributed.new_group's result) or None "
            f"for the default one; got {type(group).__name__}"
        )
    return _size_fits(dist.get_world_size(group), max_workers)


def _size_fits(size: int, max_workers: int | None) -> int:
    if max_workers is not None and max_workers != size:
        raise ValueError(
            f"max_workers (--max-workers) {max_workers} differs from the job's {size} ranks: --ranks job "
            "tests N = the number of ranks (drop the option, or start a job of that many ranks)"
        )
    return size


def takes_group(fn: object) -> bool:
    """Whether ``fn`` can be called with ``group=`` (a parameter of that name, or ``**kwargs``); ``True``
    when its signature cannot be read (the call then says).

    >>> import torch.distributed
    >>> takes_group(torch.distributed.all_reduce), takes_group(lambda tensor: tensor)
    (True, False)
    """
    try:
        parameters = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(
        (p.name == "group" and p.kind in named) or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters
    )


def _store() -> Any:
    """The job's default store (``torch.distributed`` keeps it for the default group)."""
    return dist.distributed_c10d._get_default_store()


class _Watch:
    """Rank 0's view of which ranks are alive: heartbeats and ``bye`` notes, looked at once per beat."""

    def __init__(self, store: Any, size: int, terminated: threading.Event, bye_wait_s: float) -> None:
        self.store = store
        self.terminated = terminated
        self.bye_wait_s = bye_wait_s
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
            if now - self.terminated_at >= self.bye_wait_s:
                if not self.store.check([f"bye/{rank}"]):
                    return _DIED_FIRST
                if now - self.terminated_at >= 2 * self.bye_wait_s + FAILURE_GRACE_S:
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
        """Write the case, once for every rank (rank 0's handle writes the one key they all read)."""
        if self.rank == 0:
            self.group.store.set(f"cmd/{self.group.calls}", pickle.dumps(request))
        return True

    def poll(self) -> Reply | Died | None:
        """The answer if it is there; how the rank died if it did; else ``None``."""
        store, key = self.group.store, self._key("answer")
        if store.check([key]):
            data = store.get(key)
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

    def __init__(
        self,
        store: Any,
        size: int,
        timeout_s: float,
        terminated: threading.Event,
        decode: Callable[[Reply], Answer] | None = None,
        *,
        subgroups: bool = False,
        mpirun: bool = False,
    ) -> None:
        super().__init__(timeout_s)
        if mpirun:  # the job ends two seconds after a rank died: no grace for the others
            self.death_grace_s = 0.0
        self.decode = decode
        self.store = store
        self.size = size
        self.min_workers = 1 if subgroups else size
        self.tested: set[int] = set()
        """The ``N`` of the cases called."""
        self.calls = 0
        self.watch = _Watch(store, size, terminated, MPIRUN_BYE_WAIT_S if mpirun else BYE_WAIT_S)
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

    @property
    def tested_n(self) -> list[int] | None:
        """The ``N`` of the cases called, for the report's ``tested_n``."""
        return sorted(self.tested)

    def _group(self, n: int) -> Sequence[Rank]:
        if not self.min_workers <= n <= self.size:
            raise ValueError(
                f"--ranks job runs N from {self.min_workers} to {self.size} (the job's world size; below it "
                f"only with --subgroups); got a case of {n}"
            )
        if self.broken:
            raise TargetError(self.broken)
        self.calls += 1
        self.tested.add(n)
        return self._ranks[:n]

    def decode_reply(self, reply: Reply) -> Answer:
        """A rank's answer: ``observe``'s frame, or (``--ranks mpi-job``) an MPI rank's plain data."""
        return super().decode_reply(reply) if self.decode is None else self.decode(reply)

    def _teardown(self, n: int) -> None:
        """Nothing to tear down: a call that left ranks inside the target breaks the job (:meth:`call`)."""

    def call(self, case: Case) -> Outcome:
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


def under_mpirun() -> bool:
    """Whether OpenMPI's ``mpirun`` started this process (its variables are in the environment)."""
    return "OMPI_COMM_WORLD_RANK" in os.environ


class _Terminate:
    """``SIGTERM`` noted instead of obeyed at once: a rank says ``bye`` (rank 0 finishes its report first).

    Under ``mpirun`` ``SIGCONT`` is noted too, without leaving: OpenMPI sends it to every live rank as
    soon as one died, a second before its ``SIGTERM`` (:data:`MPIRUN_BYE_WAIT_S`).
    """

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
        self.noted = (signal.SIGTERM, signal.SIGCONT) if under_mpirun() else (signal.SIGTERM,)
        self.old_cont = signal.signal(signal.SIGCONT, lambda signum, frame: None) if under_mpirun() else None
        threading.Thread(target=self._wait, args=(store, rank), daemon=True).start()

    def _wait(self, store: Any, rank: int) -> None:
        while True:
            try:
                data = self.read.recv(64)
            except OSError:
                return
            if not data:
                return
            if any(signum in data for signum in self.noted):
                with contextlib.suppress(Exception):
                    store.set(f"bye/{rank}", "")
                self.event.set()
            if signal.SIGTERM in data:
                if rank != 0:
                    _leave(128 + signal.SIGTERM)
                time.sleep(JOB_GRACE_S)
                _leave(128 + signal.SIGTERM)

    def restore(self) -> None:
        """Put back the handler and wakeup descriptor there were before."""
        if self.installed:
            signal.set_wakeup_fd(self.old_fd)
            signal.signal(signal.SIGTERM, self.old_handler)
            if self.old_cont is not None:
                signal.signal(signal.SIGCONT, self.old_cont)
            self.write.close()
            self.read.close()


def _wait_key(store: Any, key: str) -> bytes:
    while True:
        try:
            store.wait([key], _WAIT)
        except dist.DistStoreError:
            continue
        return bytes(store.get(key))


def _serve(answer: Callable[[Case], bytes], store: Any, rank: int) -> tuple[str, object]:
    """Answer cases until the stop; what the stop carries (``("report", Report)`` or ``("error", exc)``)."""
    for call in itertools.count(1):
        request = pickle.loads(_wait_key(store, f"cmd/{call}"))
        if not isinstance(request, Case):
            return request  # type: ignore[no-any-return]
        if rank < request.n:  # the others are outside this case's subgroup
            store.set(f"answer/{call}/{rank}", answer(request))
    raise AssertionError("unreachable")


def _unavailable(case: Case) -> Any:
    raise RuntimeError("the expected results are computed on rank 0 only")


def _portable(report: object) -> object:
    """``report`` without what cannot travel to the other ranks (the order's functions)."""
    if not isinstance(report, Report) or report.exact_against is None:
        return report
    exact = report.exact_against
    return dataclasses.replace(
        report, exact_against=dataclasses.replace(exact, expected=_unavailable, cases=None)
    )


def _drive(
    run: Callable[[Launcher], object],
    launcher: JobRanks,
    store: Any,
    show: Callable[[object], None] | None,
    got: dict[str, object],
) -> None:
    """Rank 0's driver thread: the whole difftest, the report shown, then the stop (or, with ranks stuck,
    the verdict and the exit)."""
    stop: tuple[str, object]
    outcome: object
    try:
        outcome = got["report"] = run(launcher)
        stop = ("report", _portable(outcome))
    except BaseException as exc:
        outcome = got["error"] = exc
        stop = ("error", exc)
    if isinstance(outcome, Report) and launcher.broken:
        (show or _show_text)(outcome)
        sys.stdout.flush()  # before mpirun's SIGKILL
        status = 0 if outcome.verdict == "pass" else 1
        store.set("verdict", str(status))
        give_up = time.monotonic() + 2 * BYE_WAIT_S
        while time.monotonic() < give_up and not store.check([f"done/{r}" for r in range(1, launcher.size)]):
            time.sleep(0.02)
        _leave(status)
    if show is not None:
        show(outcome)  # before the other ranks may leave (torchrun ends a job once one exits)
    store.set(f"cmd/{launcher.calls + 1}", pickle.dumps(stop))


@dataclasses.dataclass(frozen=True)
class _Member:
    """This process in the job: its rank, the size, the side channel, and how it answers a case."""

    rank: int
    size: int
    store: Any
    answer: Callable[[Case], bytes]
    load_error: str
    decode: Callable[[Reply], Answer] | None = None
    subgroups: bool = False


def run_in_job(
    fn: Target | OpTarget | str,
    run: Callable[[Launcher], T],
    *,
    group: object = None,
    device: str = "cpu",
    timeout_s: float,
    subgroups: bool = False,
) -> T:
    """On every rank of the job's ``torch.distributed`` group: serve the target; on rank 0, also
    ``run(launcher)`` (the difftest).

    ``subgroups``: also every smaller ``N``, ``TARGET(tensor, group=G)`` on the subgroup of ranks
    ``0 .. N-1`` (see the module docstring); ``ValueError`` for a ``group`` that is not the whole job
    (every rank of the job creates the subgroups), :class:`TargetError` on every rank for a target
    that does not take ``group=``.

    Returns the same :class:`Report` on every rank (rank 0's; the others get it through the store), or
    raises the exception the run raised on every rank.  Rank 0 shows the report or the error first
    (:data:`SHOW`).  When a call left ranks inside the target, rank 0 prints the report and every rank's
    process ends with the verdict's status instead.
    """
    rank, size = dist.get_rank(group), dist.get_world_size(group)  # type: ignore[arg-type]
    if subgroups and size != dist.get_world_size():
        raise ValueError(
            f"subgroups (--subgroups) creates its subgroups with new_group on every rank of the job, but "
            f"group has {size} of the job's {dist.get_world_size()} ranks: drop group= (test the whole job) "
            "or drop subgroups"
        )
    base: Any = dist.PrefixStore(  # type: ignore[attr-defined]  # re-exported at runtime, not in stubs
        f"ring-ref-difftest/{next(_runs)}", _store()
    )
    error = ""
    target: Target | OpTarget | None = None
    try:
        target = load_target(fn) if isinstance(fn, str) else fn
    except TargetError as exc:
        error = str(exc)
    if subgroups and target is not None and not takes_group(target):
        error = (
            f"{getattr(target, '__qualname__', target)!r} does not take group=: --subgroups calls "
            "TARGET(tensor, group=G) on the subgroup G of each smaller N (add a group parameter and run "
            "the collective on it, or drop --subgroups)"
        )
    whole = group if group is not None else dist.group.WORLD
    groups: dict[int, Any] = dict.fromkeys(range(1, size + 1), whole)
    if subgroups:  # every rank, in the same order, as new_group requires; outside one: NON_GROUP_MEMBER
        groups.update({k: dist.new_group(ranks=list(range(k))) for k in range(1, size)})

    def answer(case: Case) -> bytes:
        assert target is not None  # rank 0 sends cases only once every rank has loaded the target
        call = functools.partial(cast(Any, target), group=groups[case.n]) if subgroups else target
        head, payload = observe(call, case, rank, device=device)
        return frame({"kind": "answer", **head}, payload)

    member = _Member(rank, size, base, answer, error, subgroups=subgroups)
    try:
        return _run_member(member, run, timeout_s)
    finally:
        for k in range(rank + 1, size if subgroups else 0):  # the subgroups this rank is in
            dist.destroy_process_group(groups[k])


def run_in_mpi_job(
    target: str, run: Callable[[Launcher], T], *, timeout_s: float, subgroups: bool = False
) -> T:
    """:func:`run_in_job` for ``TARGET(comm, array)`` on every rank of ``COMM_WORLD`` (``--ranks mpi-job``).

    The target gets a duplicate of ``COMM_WORLD`` (the same for every call); the side channel is a
    ``TCPStore`` that rank 0 hosts, its address sent to the others on a second duplicate, once.
    ``subgroups``: a case of a smaller ``N`` gets the communicator of ranks ``0 .. N-1`` (``Split``
    from the duplicate, on every rank, once).
    """
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    side, comm = world.Dup(), world.Dup()
    rank, size = world.Get_rank(), world.Get_size()
    comms: dict[int, Any] = {size: comm}
    if subgroups:  # MPI.UNDEFINED: this rank is outside; it gets COMM_NULL and idles for that N
        comms.update({k: comm.Split(0 if rank < k else MPI.UNDEFINED, rank) for k in range(1, size)})
    host = os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname())
    hosted = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False) if rank == 0 else None  # type: ignore[attr-defined]
    port = side.bcast(hosted.port if hosted is not None else 0, root=0)
    store = hosted if hosted is not None else dist.TCPStore(host, port, is_master=False)  # type: ignore[attr-defined]
    base: Any = dist.PrefixStore(f"ring-ref-difftest/{next(_runs)}", store)  # type: ignore[attr-defined]
    error = ""
    try:
        load_target(target)
    except TargetError as exc:
        error = str(exc)

    def answer(case: Case) -> bytes:
        x = case.rank_tensor(rank).numpy()
        inputs = [b""] * case.n
        inputs[rank] = x.tobytes()
        reply = observe_rank(comms[case.n], (target, x.dtype.name, tuple(x.shape), inputs, case.op))
        return frame({"kind": "answer", "rank": rank, "mpi": plain_json(reply)}, b"")

    def decode_mpi(reply: Reply) -> Answer:
        return decode_rank(plain_unjson(reply.head.get("mpi")), int(reply.head["rank"]))

    try:
        member = _Member(rank, size, base, answer, error, decode_mpi, subgroups)
        return _run_member(member, run, timeout_s)
    finally:
        side.Barrier()  # rank 0 keeps the store up until every rank is done with it
        for each in comms.values():
            if each != MPI.COMM_NULL:
                each.Free()
        side.Free()


def _run_member(member: _Member, run: Callable[[Launcher], T], timeout_s: float) -> T:
    """Serve on this rank (and drive on rank 0) until the stop; the report, or the run's exception."""
    show = SHOW.get()
    rank, size, base = member.rank, member.size, member.store
    store = base.clone()
    terminate = _Terminate(base.clone(), rank)
    stop = threading.Event()
    watchdog = threading.Thread(target=_watchdog, args=(base.clone(), rank, stop), daemon=True)
    watchdog.start()
    got: dict[str, object] = {}
    driver = None
    if rank == 0:
        launcher = JobRanks(
            base.clone(),
            size,
            timeout_s,
            terminate.event,
            member.decode,
            subgroups=member.subgroups,
            mpirun=under_mpirun(),
        )
        driver = threading.Thread(target=_drive, args=(run, launcher, base.clone(), show, got), daemon=True)
        driver.start()
    store.set(f"ready/{rank}", member.load_error)
    try:
        kind, value = _serve(member.answer, store, rank)
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
