"""The one lifecycle of rank processes (``ring_ref._processes._shared``), without starting any process.

Every harness of rank processes (spawned gloo groups, ``mpirun`` jobs,
difftest's forked groups) derives from :class:`Harness`; its start, its
teardown after a failed start and its ``with`` are checked here on a harness
whose "ranks" are list entries, as is keeping one harness per world size, and
the wait for the stacks of hung ranks on sizes given by hand.  The harnesses
on real processes: ``nocover/test_procs.py``, ``nocover/test_mpi.py``,
``nocover/test_difftest_ranks.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from ring_ref._processes._gloo import SpawnedGroup
from ring_ref._processes._mpi_job import MpiJob
from ring_ref._processes._shared import (
    STOP_GRACE_S,
    Harness,
    PerSize,
    ask_for_stack,
    die_with_parent,
    host_store,
    join_group,
    loopback_listener,
    wait_for_stacks,
)
from ring_ref.difftest._ranks import ForkedRanks


class _Listed(Harness):
    """A harness whose ranks are entries of ``up``; ``fail`` makes the next start fail half-way."""

    def __init__(self, world_size: int) -> None:
        super().__init__(world_size, start_timeout_s=7.0)
        self.up: list[int] = []
        self.fail = False
        self.deadlines: list[float] = []
        self.stopped_by: list[float] = []
        self.kills = 0

    @property
    def running(self) -> bool:
        return bool(self.up)

    def _start(self, deadline: float) -> None:
        self.deadlines.append(deadline)
        self.up = [0]
        if self.fail:
            raise RuntimeError("rank 1 did not start")
        self.up = list(range(self.world_size))

    def _wait_stopped(self, deadline: float) -> None:
        self.stopped_by.append(deadline)

    def _kill(self) -> None:
        self.kills += 1
        self.up = []


def test_every_harness_of_rank_processes_derives_from_the_one_base() -> None:
    assert all(issubclass(h, Harness) for h in (SpawnedGroup, MpiJob, ForkedRanks))


def test_a_failed_start_kills_what_it_began_and_the_next_start_begins_again() -> None:
    harness = _Listed(3)
    harness.fail = True
    before = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1 did not start"):
        harness.start()
    assert harness.kills == 1 and not harness.running
    assert before + 7.0 <= harness.deadlines[0] <= time.monotonic() + 7.0  # start_timeout_s from now
    harness.fail = False
    with harness:
        assert harness.up == [0, 1, 2] and len(harness.deadlines) == 2
        harness.start()  # already up: nothing is started again
        assert len(harness.deadlines) == 2
    assert harness.kills == 2 and not harness.running  # leaving the block closed it
    assert 0 < harness.stopped_by[0] - time.monotonic() <= STOP_GRACE_S


@pytest.mark.parametrize("world_size", [0, -1, True, 2.0])
def test_a_harness_needs_a_positive_int_world_size(world_size: object) -> None:
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        _Listed(world_size)  # type: ignore[arg-type]


def test_one_harness_per_size_is_made_on_first_use_reused_and_each_closed_once() -> None:
    given = _Listed(5)
    made = PerSize(_Listed, {5: given})
    two = made[2]
    assert made[2] is two and made[5] is given and two.world_size == 2
    assert 3 not in made and 2 in made
    two.start()
    made.drop(2)
    assert two.kills == 1 and 2 not in made and made[2] is not two
    made.close()
    made.close()
    assert [two.kills, given.kills] == [1, 1] and 5 not in made


def test_the_stacks_are_written_once_every_file_is_non_empty_and_stopped_growing() -> None:
    looks = iter([[0, 10], [5, 10], [5, 12], [5, 12], [5, 99]])
    seen: list[list[int]] = []

    def sizes() -> list[int]:
        seen.append(next(looks))
        return seen[-1]

    wait_for_stacks(sizes, time.monotonic() + 10)
    assert seen == [[0, 10], [5, 10], [5, 12], [5, 12]]


def test_the_wait_for_stacks_gives_up_at_its_deadline_when_a_rank_writes_none() -> None:
    start = time.monotonic()
    wait_for_stacks(lambda: [0, 7], start + 0.3)
    assert 0.3 <= time.monotonic() - start < 2


@pytest.mark.parametrize(
    ("interfaces", "chosen"),
    [
        (["eth0", "lo"], "lo"),  # Linux
        (["en0", "lo0"], "lo0"),  # macOS and the BSDs
        (["lo0", "lo"], "lo"),  # both: Linux's name first
        (["eth0"], "lo"),  # neither listed: Linux's name
    ],
)
def test_a_rank_joins_gloo_on_the_loopback_interface_by_its_name_here(
    monkeypatch: pytest.MonkeyPatch, interfaces: list[str], chosen: str
) -> None:
    monkeypatch.setattr(socket, "if_nameindex", lambda: list(enumerate(interfaces, start=1)))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "not-yet-set")
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: None)
    host = host_store(loopback_listener(), datetime.timedelta(seconds=5))
    join_group("gloo", host.port, 0, 1, datetime.timedelta(seconds=5))
    assert os.environ["GLOO_SOCKET_IFNAME"] == chosen


def test_a_rank_joins_the_default_group_through_the_hosts_store_with_the_timeout_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    timeout = datetime.timedelta(seconds=23)  # neither torch's default nor the host's
    host = host_store(loopback_listener(), datetime.timedelta(seconds=5))
    join_group("gloo", host.port, 0, 1, timeout)
    try:
        assert (dist.get_backend(), dist.get_rank(), dist.get_world_size()) == ("gloo", 0, 1)
        group = dist.distributed_c10d._get_default_group()
        assert group._get_backend(torch.device("cpu")).options._timeout == timeout
        assert "lo" in [name for _, name in socket.if_nameindex()]  # Linux: the name below
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
    finally:
        dist.destroy_process_group()


def test_a_rank_whose_host_hangs_up_gives_up_after_its_own_timeout() -> None:
    # The port stays this test's own: a freed port, dialled for a second, could be a concurrent test's
    # gloo listener by then, which the client's bytes would break.
    listener = loopback_listener()

    def hang_up() -> None:
        with contextlib.suppress(OSError):  # closed when the test is done
            while True:
                listener.accept()[0].close()

    threading.Thread(target=hang_up, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(dist.DistNetworkError):
            join_group("gloo", listener.getsockname()[1], 0, 1, datetime.timedelta(seconds=1))
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
    assert time.monotonic() - started < 20  # it retries until its own timeout; torch's default is 300 s


_PR_GET_PDEATHSIG = 2


def test_a_child_asks_for_a_signal_when_its_parent_dies_and_stays_while_its_parent_lives() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what prctl reports after the call, through the pipe
        try:
            os.close(read)
            die_with_parent(signal.SIGUSR2, parent=os.getppid())
            got = ctypes.c_int(-1)
            ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_PDEATHSIG, ctypes.byref(got))
            os.write(write, str(got.value).encode())
        finally:
            os._exit(7)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        reported = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 7  # it went on: its parent (this process) is alive
    assert reported == str(int(signal.SIGUSR2)).encode()


def test_a_child_whose_parent_is_not_the_one_named_leaves_at_once_with_status_0() -> None:
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent(signal.SIGUSR2, parent=os.getpid())  # not its parent: "gone" already
        finally:
            os._exit(7)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_asking_a_process_that_is_gone_for_its_stack_is_no_error() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process (until the kernel gives it out again)
    ask_for_stack(gone.pid)
