"""Per-rank targets on real process groups: launching ``N`` ranks, kept apart from checking them.

A per-rank launcher is a :class:`~ring_ref.difftest._launch.Launcher` whose
``call(case)`` runs ``TARGET(tensor)`` once on every rank of a group of
``case.n`` processes, rank ``r`` on its own fresh contiguous ``(M, ...)``
tensor (:meth:`~ring_ref.difftest.Case.rank_tensor`), and returns one
:class:`~ring_ref.difftest._call.Answer` per rank (made by
:func:`~ring_ref.difftest._call.observe` in the rank and read by
:func:`~ring_ref.difftest._call.decode` in the tester), or a
:class:`~ring_ref.difftest._call.Failure` naming the ranks that did not
answer.  That is all the checks see: a launcher that starts its ranks some
other way (``mpirun``) plugs in by producing the same outcomes.

:class:`ForkedGroup` is the part common to groups whose ranks the tester
forks itself: one group per ``N`` (a :class:`ForkedRanks`, whose start,
deadline and teardown are those of every harness of
:mod:`ring_ref._processes`), started on first use and reused; the case
sent to every rank and all of them waited on at once, with one deadline; on a
timeout each rank still inside the call gives its Python stack before it is
stopped; a rank that dies is named with its exit status or signal; after any
rank raised, hung or died the group is torn down (its channels may hold stale
messages) and rebuilt for the next call.  What a kind of group adds is how
rank ``r`` of ``N`` joins it before the target is imported (:meth:`ForkedGroup.hub`):
:class:`GlooRanks` hosts a ``TCPStore`` on ``127.0.0.1`` and each rank joins
a gloo group through it (:mod:`ring_ref._processes._shared`), so
``TARGET`` may use the default group freely (``torch.distributed:all_reduce``
is a valid target); :class:`JaxRanks` picks a free port on ``127.0.0.1`` for
``jax.distributed``'s coordinator, and each rank imports jax only after it was
forked (the tester never imports it), turns on gloo CPU collectives and joins
(:func:`join_jax`), so that a ``jax`` collective over the global mesh of the
``N`` processes' CPU devices (:func:`ring_ref.targets.jax_psum_ranks`) runs over gloo;
:class:`MlxRanks` writes a hostfile of ``N`` loopback ports, and each rank
sets ``MLX_HOSTFILE`` and ``MLX_RANK`` and joins MLX's ring
(:mod:`ring_ref._processes._mlx`), so that a target joining it from the
environment (:func:`ring_ref.targets.mlx_all_sum`) finds the group joined.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import select
import shutil
import socket
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, Protocol

from torch.distributed import TCPStore  # type: ignore[attr-defined]  # re-exported at runtime, not in stubs

from ring_ref._processes._mlx import HOSTFILE, RANK, join_ring, loopback_hostfile
from ring_ref._processes._shared import (
    FAILURE_GRACE_S,
    STACK_WAIT_S,
    START_TIMEOUT_S,
    Harness,
    PerSize,
    host_store,
    join_group,
    loopback_listener,
)
from ring_ref.difftest._call import Answer, Failure, Garbled, Outcome, decode, stopped_note
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._launch import OUTPUT_LIMIT, Launcher, OutputLog
from ring_ref.difftest._loading import TargetError
from ring_ref.difftest._vocabulary import Framework
from ring_ref.difftest._worker import Died, Reply, Worker, trim

__all__ = [
    "ForkedGroup",
    "ForkedRanks",
    "GlooRanks",
    "Hub",
    "JaxRanks",
    "MlxRanks",
    "Rank",
    "RankGroup",
    "join_jax",
    "join_mlx",
]

_NO_STACK: Final = "(no stack: the rank did not answer SIGUSR1)"


class Hub(ABC):
    """How the ranks of one group find each other: made before the ranks are forked, closed after them."""

    @abstractmethod
    def rank_setup(self, rank: int) -> Callable[[], None]:
        """What rank ``rank`` runs in its own process, before the target is imported, to join the group."""

    @abstractmethod
    def started(self) -> None:
        """Called once every rank has been forked (a hub may start serving only now)."""

    @abstractmethod
    def close(self) -> None:
        """Release what the hub holds."""


class Rank(Protocol):
    """One rank as a :class:`RankGroup` drives it: a forked :class:`~ring_ref.difftest._worker.Worker`,
    or a rank of a job reached through its store (:mod:`ring_ref.difftest._job`)."""

    @property
    def rank(self) -> int | None:
        """The rank's number."""

    @property
    def watched(self) -> list[int]:
        """Descriptors that become readable when the rank replies or ends (may be empty)."""

    def send(self, request: object) -> bool:
        """Send one case."""

    def poll(self) -> Reply | Died | None:
        """The reply, or how the rank died, or ``None`` while it is busy."""

    def request_stack(self) -> None:
        """Ask the rank for its Python stack."""

    def collect_stack(self, give_up: float) -> str:
        """The stack asked for, or what came by ``give_up``."""

    def read_output(self) -> str:
        """What the rank wrote since the last call."""


class RankGroup(Launcher):
    """One call on every rank of a group of ``case.n``: the case out, the replies back, one deadline.

    Subclasses say where the ranks come from (:meth:`_group`) and what a
    failed call does to them (:meth:`_teardown`); ``poll_s`` is the longest
    wait between two looks at ranks that have no descriptor to wait on;
    ``death_grace_s`` how long the other ranks may still answer after one died.
    """

    isolated = True
    per_rank = True
    poll_s = 0.05
    death_grace_s = FAILURE_GRACE_S

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.output = OutputLog()

    @abstractmethod
    def _group(self, n: int) -> Sequence[Rank]:
        """The ranks of the group of ``n`` (:class:`TargetError` if they cannot start)."""

    def decode_reply(self, reply: Reply) -> Answer:
        """A rank's answer from its reply (:func:`~ring_ref.difftest._call.decode`; :class:`Garbled`)."""
        return decode(reply.head, reply.payload)

    @abstractmethod
    def _teardown(self, n: int) -> None:
        """After a call in which a rank raised, hung or died."""

    def _read_output(self, workers: Sequence[Rank]) -> str:
        parts = []
        for worker in workers:
            text = worker.read_output()
            self.output.add(text)
            if text:
                parts.append(f"rank {worker.rank}:\n{text}")
        return "".join(parts)

    def call(self, case: Case) -> Outcome:
        """Run the target on every rank of the group of ``case.n``; one answer per rank, or the failure."""
        try:
            workers = self._group(case.n)
        except TargetError as exc:
            return Outcome(case, failure=Failure("crashed", f"starting the ranks failed: {exc}"))
        for worker in workers:
            worker.send(case)
        replies, dead, pending = self._collect(workers)
        output = trim(self._read_output(workers), OUTPUT_LIMIT)
        answers: list[Answer] = []
        for rank, reply in sorted(replies.items()):
            try:
                if reply.head.get("kind") != "answer" or reply.head.get("rank") != rank:
                    raise Garbled(
                        f"expected an answer from rank {rank}, got kind {reply.head.get('kind')!r} "
                        f"naming rank {reply.head.get('rank')!r}"
                    )
                answers.append(self.decode_reply(reply))
            except Garbled as exc:
                dead[rank] = Died(f"its reply was garbled ({exc})", "")
        outcome = Outcome(case, tuple(answers), output=output)
        if pending and not dead and not any(a.raised for a in answers):
            outcome.failure = self._timed_out(workers, pending)
        elif dead:
            listing = "; ".join(f"rank {r}: {d.text}" for r, d in sorted(dead.items()))
            others = f"; rank(s) {pending} were stopped" if pending else ""
            outcome.failure = Failure(
                "crashed",
                f"rank(s) {sorted(dead)} of {case.n} died during the call ({listing}){others}",
                "".join(f"rank {r}:\n{d.stack}" for r, d in sorted(dead.items()) if d.stack),
                tuple(sorted(dead)),
            )
        elif pending:
            raised = [a.rank for a in answers if a.raised]
            outcome.note = stopped_note(pending, raised, FAILURE_GRACE_S)
        if dead or pending or any(a.raised for a in answers):
            self._teardown(case.n)
        return outcome

    def _collect(self, workers: Sequence[Rank]) -> tuple[dict[int, Reply], dict[int, Died], list[int]]:
        """Wait for every rank's reply, until the deadline, or a short grace after a rank raised or died."""
        deadline = time.monotonic() + self.timeout_s
        grace_end = float("inf")
        replies: dict[int, Reply] = {}
        dead: dict[int, Died] = {}
        while True:
            for rank, worker in enumerate(workers):
                if rank in replies or rank in dead:
                    continue
                got = worker.poll()
                if isinstance(got, Reply):
                    replies[rank] = got
                    if got.head.get("raised"):
                        grace_end = min(grace_end, time.monotonic() + FAILURE_GRACE_S)
                elif isinstance(got, Died):
                    dead[rank] = got
                    grace_end = min(grace_end, time.monotonic() + self.death_grace_s)
            pending = [r for r in range(len(workers)) if r not in replies and r not in dead]
            remaining = min(deadline, grace_end) - time.monotonic()
            if not pending or remaining <= 0:
                return replies, dead, pending
            watched = [fd for r in pending for fd in workers[r].watched]
            select.select(watched, [], [], min(remaining, self.poll_s))

    def _timed_out(self, workers: Sequence[Rank], pending: list[int]) -> Failure:
        """Take the stack of every rank still inside the call, then stop the group."""
        for rank in pending:
            workers[rank].request_stack()
        give_up = time.monotonic() + STACK_WAIT_S
        stacks = {rank: workers[rank].collect_stack(give_up) for rank in pending}
        done = [r for r in range(len(workers)) if r not in pending]
        answered = f"; rank(s) {done} had answered" if done else ""
        return Failure(
            "timed-out",
            f"no answer within {self.timeout_s:g} s (--timeout): rank(s) {pending} of {len(workers)} were "
            f"still inside the call{answered}; every rank was stopped",
            "".join(f"rank {r}:\n{stacks[r] or _NO_STACK}\n" for r in pending),
            tuple(pending),
        )


def _in_environment(env: Mapping[str, str], setup: Callable[[], None]) -> None:
    """In a forked rank: ``env`` into its environment, then ``setup`` (joining the group), so that a
    library reads the variables when it joins or is first imported (``--env``)."""
    os.environ.update(env)
    setup()


class ForkedRanks(Harness):
    """The ``n`` forked workers of one of ``group``'s groups and the hub they join through, started and
    killed together.

    The lifecycle is the one every harness of :mod:`ring_ref._processes` has
    (:class:`~ring_ref._processes._shared.Harness`): its start makes the hub
    (:meth:`ForkedGroup.hub`), forks every worker, lets the hub serve and
    waits until every worker has loaded the target, within the call time
    limit or :data:`~ring_ref._processes._shared.START_TIMEOUT_S`, whichever
    is longer; a kill (or a start that failed) ends the workers and the hub,
    but keeps each worker's output for a last
    :meth:`~ring_ref.difftest._worker.Worker.read_output`, which
    :meth:`close` then releases.
    """

    def __init__(self, n: int, group: ForkedGroup) -> None:
        super().__init__(n, max(group.timeout_s, START_TIMEOUT_S))
        self.group = group
        self.workers: list[Worker] = []
        self._hub: Hub | None = None

    @property
    def running(self) -> bool:
        """Whether the workers are up."""
        return any(worker.running for worker in self.workers)

    def _start(self, deadline: float) -> None:
        self._hub = hub = self.group.hub(self.world_size)
        env = dict(self.group.env)
        self.workers = [
            Worker(
                self.group.target,
                rank=r,
                setup=functools.partial(_in_environment, env, hub.rank_setup(r)),
                framework=self.group.framework,
            )
            for r in range(self.world_size)
        ]
        for worker in self.workers:
            worker.spawn()
        hub.started()
        for worker in self.workers:
            worker.wait_ready(deadline)

    def _wait_stopped(self, deadline: float) -> None:
        """Nothing to wait for: a worker is not told to stop but killed (its target may hold it)."""

    def _kill(self) -> None:
        """Kill every worker (its output kept) and close the hub."""
        for worker in self.workers:
            worker.kill()
        if self._hub is not None:
            self._hub.close()
            self._hub = None

    def close(self) -> None:
        """Kill the workers and close the hub, then release the workers' output."""
        super().close()
        for worker in self.workers:
            worker.close()


class ForkedGroup(RankGroup):
    """Groups of forked ranks (:class:`ForkedRanks`), one per ``N``; subclasses say how a rank joins
    (:meth:`hub`) and what the target is handed (``framework``)."""

    framework: Framework = "torch"

    def __init__(self, target: str, timeout_s: float, env: Mapping[str, str] | None = None) -> None:
        super().__init__(timeout_s)
        self.target = target
        self.env: Mapping[str, str] = env or {}
        """``--env``: set in every rank's process (after the fork, before it joins and loads the target)."""
        self._groups = PerSize(lambda n: ForkedRanks(n, self))

    @abstractmethod
    def hub(self, n: int) -> Hub:
        """A new hub for a group of ``n`` ranks."""

    def start(self) -> None:
        """Start a group of one and load the target in it (:class:`TargetError` if it cannot be loaded)."""
        self._group(1)

    def _group(self, n: int) -> list[Worker]:
        if n in self._groups:
            return self._groups[n].workers
        group = self._groups[n]
        try:
            group.start()
        except BaseException:
            self._read_output(group.workers)
            self._groups.drop(n)
            raise
        return group.workers

    def _teardown(self, n: int) -> None:
        self._groups.drop(n)

    def close(self) -> None:
        """Stop every group."""
        self._groups.close()


class _GlooHub(Hub):
    """A ``TCPStore`` on ``127.0.0.1`` (a free port) through which ``n`` ranks join one gloo group."""

    def __init__(self, n: int, group_timeout_s: float) -> None:
        self.n = n
        self.timeout = datetime.timedelta(seconds=group_timeout_s)
        self.listener: socket.socket | None = loopback_listener()
        self.port = self.listener.getsockname()[1]
        self.store: TCPStore | None = None

    def rank_setup(self, rank: int) -> Callable[[], None]:
        """Join the gloo group as ``rank`` (gloo's own sockets on the loopback interface only)."""
        return functools.partial(join_group, "gloo", self.port, rank, self.n, self.timeout)

    def started(self) -> None:
        """Serve the store on the listening socket (bound to loopback before the ranks were forked)."""
        assert self.listener is not None
        listener, self.listener = self.listener, None
        self.store = host_store(listener, self.timeout)

    def close(self) -> None:
        """Stop serving the store."""
        if self.listener is not None:
            with contextlib.suppress(OSError):
                self.listener.close()
        self.listener = self.store = None


class GlooRanks(ForkedGroup):
    """``TARGET(tensor)`` on every rank of a ``torch.distributed`` gloo group of forked processes.

    Each collective inside the group may wait up to twice the call time limit
    plus 30 s (``init_process_group(timeout=...)``), so the tester's own limit
    always comes first and a deadlock is ``timed-out``, with the stacks.
    """

    kind = "gloo"

    def hub(self, n: int) -> Hub:
        """A store for ``n`` ranks."""
        return _GlooHub(n, 2 * self.timeout_s + 30)


def join_jax(port: int, rank: int, n: int, timeout_s: int) -> None:
    """Join ``jax.distributed`` as process ``rank`` of ``n``: coordinator at ``127.0.0.1:port``, gloo.

    Run in the rank's own process before the target is imported.  It also
    starts jax's CPU backend (one device per process), so that the target
    cannot change the device count afterwards (:func:`ring_ref.difftest._jax.on_jax`).
    """
    import jax  # in the forked rank only: the tester never imports jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # type: ignore[no-untyped-call]
    jax.config.update("jax_num_cpu_devices", 1)  # type: ignore[no-untyped-call]
    address = f"127.0.0.1:{port}"
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=n,
        process_id=rank,
        coordinator_bind_address=address,
        initialization_timeout=timeout_s,
    )
    if jax.process_count() != n or len(jax.devices()) != n:
        raise RuntimeError(
            f"jax.distributed joined {jax.process_count()} processes with {len(jax.devices())} devices; "
            f"expected {n} and {n}"
        )


class _JaxHub(Hub):
    """A free port on ``127.0.0.1`` for ``jax.distributed``'s coordinator, which rank 0 serves."""

    def __init__(self, n: int, group_timeout_s: int) -> None:
        self.n = n
        self.timeout_s = group_timeout_s
        with contextlib.closing(loopback_listener()) as probe:
            self.port = probe.getsockname()[1]

    def rank_setup(self, rank: int) -> Callable[[], None]:
        """Join ``jax.distributed`` as ``rank`` (:func:`join_jax`)."""
        return functools.partial(join_jax, self.port, rank, self.n, self.timeout_s)

    def started(self) -> None:
        """Nothing to serve: rank 0 hosts the coordinator."""

    def close(self) -> None:
        """Nothing held: the coordinator ends with rank 0."""


class JaxRanks(ForkedGroup):
    """``TARGET(x)`` on every process of a ``jax.distributed`` group over gloo, ``x`` a ``jax.Array``.

    ``x`` is the rank's ``(M, ...)`` input on its process's one CPU device
    (:mod:`ring_ref.difftest._jax`); the processes join through a coordinator
    on ``127.0.0.1`` and run their collectives over gloo.  The ranks are
    forked from the tester, which must not have imported jax (jax is multithreaded and
    warns that a fork of it may deadlock): ``RuntimeError`` if it has.
    """

    kind = "jax"
    framework: Framework = "jax"

    def hub(self, n: int) -> Hub:
        """A coordinator port for ``n`` processes (``RuntimeError`` if this process has imported jax)."""
        _refuse_fork_of("jax", "jax", ", or test the target stacked with framework='jax'")
        return _JaxHub(n, int(2 * self.timeout_s + 30))


def _refuse_fork_of(module: str, ranks: str, stacked: str) -> None:
    """``RuntimeError`` if this process has imported ``module``: its ranks are forked from it, and a fork
    of a multithreaded runtime may hang."""
    if module in sys.modules:
        raise RuntimeError(
            f"ranks={ranks!r} forks its ranks from this process, which has imported {module} (a forked "
            f"{module} process may hang): run difftest --ranks {ranks} from a process that does not import "
            f"{module} (the ring-ref command){stacked}"
        )


def join_mlx(hostfile: str | None, rank: int, n: int) -> None:
    """Join MLX's ring as rank ``rank`` of ``n`` through ``hostfile`` (``None`` for one rank: MLX's singleton
    group), the variables set as ``mlx.launch`` sets them, so that the target finds them.

    Run in the rank's own process before the target is imported.
    """
    os.environ[RANK] = str(rank)
    if hostfile is None:
        os.environ.pop(HOSTFILE, None)
    else:
        os.environ[HOSTFILE] = hostfile
    size = join_ring().size()
    if size != n:
        raise RuntimeError(f"MLX's ring joined a group of {size}; expected {n}")


class _MlxHub(Hub):
    """A hostfile of ``n`` free ports on ``127.0.0.1`` for MLX's ring (none for one rank), in a directory
    of its own."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.directory = tempfile.mkdtemp(prefix="ring-ref-mlx-")
        self.hostfile = str(loopback_hostfile(n, Path(self.directory) / "hosts.json")) if n > 1 else None

    def rank_setup(self, rank: int) -> Callable[[], None]:
        """Join MLX's ring as ``rank`` (:func:`join_mlx`)."""
        return functools.partial(join_mlx, self.hostfile, rank, self.n)

    def started(self) -> None:
        """Nothing to serve: the ranks connect to each other."""

    def close(self) -> None:
        """Remove the hostfile."""
        shutil.rmtree(self.directory, ignore_errors=True)


class MlxRanks(ForkedGroup):
    """``TARGET(tensor)`` on every process of an MLX ring group on ``127.0.0.1`` (extra ``ring-ref[mlx]``).

    Each rank joins the ring of ``N`` (``mlx.core.distributed.init(backend="ring")``)
    from ``MLX_HOSTFILE`` and ``MLX_RANK``, set before the target is imported; a
    target may join again (the same group) or use the global group.  MLX's ring
    needs two ranks: at ``N = 1`` the rank has no hostfile and MLX's singleton
    group.  The tester must not have imported MLX (``RuntimeError``).
    """

    kind = "mlx"

    def hub(self, n: int) -> Hub:
        """A hostfile for ``n`` ranks (``RuntimeError`` if this process has imported MLX)."""
        _refuse_fork_of("mlx", "mlx", "")
        return _MlxHub(n)
