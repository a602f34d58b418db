"""The spawned-process harness ``ring_ref._processes._gloo``: results, failures, deadlines, reuse.

Every case is bounded: the ring's own group timeout is set far above the
bounds asserted here, so a pass shows that the harness killed the blocked
ranks itself rather than waiting for torch.distributed to give up.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from ring_ref._processes._gloo import RankError, SpawnedGroup

WORLD = 2
GROUP_TIMEOUT_S = 300.0
PROMPT_S = 30.0  # far below GROUP_TIMEOUT_S: the harness, not gloo, ended the call


def sum_of_ranks(rank: int, world_size: int, offset: float) -> tuple[int, int, float]:
    """All-reduce ``rank + offset`` over the default group."""
    t = torch.tensor([rank + offset], dtype=torch.float64)
    dist.all_reduce(t)
    return rank, world_size, float(t.item())


def raise_on_rank(rank: int, world_size: int, bad: int) -> int:
    """Rank ``bad`` raises; every other rank blocks on a receive from it (a hang without the harness)."""
    if rank == bad:
        raise ValueError(f"planted failure on rank {rank}")
    dist.recv(torch.zeros(1), src=bad)
    return rank


def hang_on_rank(rank: int, world_size: int, bad: int) -> int:
    """Rank ``bad`` sleeps for an hour; the others return at once."""
    if rank == bad:
        time.sleep(3600)
    return rank


def exit_on_rank(rank: int, world_size: int, bad: int) -> int:
    """Rank ``bad`` dies without replying; the others block on a receive from it."""
    if rank == bad:
        os._exit(7)
    dist.recv(torch.zeros(1), src=bad)
    return rank


def exit_late_on_rank(rank: int, world_size: int, bad: int) -> int:
    """Rank ``bad`` closes its connections, so that the others fail first, and dies a moment later."""
    if rank == bad:
        dist.destroy_process_group()
        time.sleep(0.3)
        os._exit(7)
    dist.recv(torch.zeros(1), src=bad)
    return rank


@pytest.fixture(scope="module")
def ring() -> Iterator[SpawnedGroup]:
    with SpawnedGroup(WORLD, group_timeout_s=GROUP_TIMEOUT_S) as r:
        yield r


def test_results_in_rank_order_and_group_reused(ring: SpawnedGroup) -> None:
    expected_sum = sum(range(WORLD)) + WORLD * 0.5
    assert ring.run(sum_of_ranks, 0.5) == [(r, WORLD, expected_sum) for r in range(WORLD)]
    pids = [p.pid for p in ring._procs]
    assert ring.run(sum_of_ranks, 2.0) == [(r, WORLD, sum(range(WORLD)) + WORLD * 2.0) for r in range(WORLD)]
    assert [p.pid for p in ring._procs] == pids, "a second call must reuse the same processes"


LOOPBACK_HEX = {
    "0100007F",  # 127.0.0.1 in /proc/net/tcp's little-endian hex
    "00000000000000000000000001000000",  # ::1 in /proc/net/tcp6
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
}


def listening_addresses(pids: list[int]) -> set[str]:
    """The local addresses (``/proc/net/tcp*`` hex) on which the processes ``pids`` hold listening sockets."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # state 0A: LISTEN
                    found.add(fields[1].rsplit(":", 1)[0])
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc/net/tcp")
def test_parent_and_ranks_listen_on_loopback_only(ring: SpawnedGroup) -> None:
    """The parent's store and the ranks' gloo sockets: 127.0.0.1 only, never every interface."""
    ring.run(sum_of_ranks, 0.0)
    addresses = listening_addresses([os.getpid(), *(p.pid for p in ring._procs if p.pid is not None)])
    assert addresses, "found no listening socket at all"
    assert addresses <= LOOPBACK_HEX, addresses


def test_raising_rank_reports_traceback_and_does_not_hang(ring: SpawnedGroup) -> None:
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        ring.run(raise_on_rank, 1, timeout_s=PROMPT_S)
    assert time.monotonic() - start < PROMPT_S
    assert info.value.rank == 1
    assert list(info.value.tracebacks) == [1]
    message = str(info.value)
    assert "rank 1 of 2 failed" in message
    assert "ValueError: planted failure on rank 1" in message
    assert "raise_on_rank" in message, "the rank's own traceback must be carried"
    assert not ring.running, "the blocked rank must have been killed"


def test_hanging_rank_times_out_naming_it(ring: SpawnedGroup) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out after 2 s; rank\(s\) \[1\] did not finish"):
        ring.run(hang_on_rank, 1, timeout_s=2)
    assert time.monotonic() - start < PROMPT_S
    assert not ring.running


def test_dead_rank_is_reported(ring: SpawnedGroup) -> None:
    with pytest.raises(RankError, match="rank 0 of 2 failed:\nthe process exited with code 7 without"):
        ring.run(exit_on_rank, 0, timeout_s=PROMPT_S)
    assert not ring.running


def test_a_rank_that_dies_after_its_peers_failed_is_reported_with_them(ring: SpawnedGroup) -> None:
    """The peers' "connection closed" errors come first; the dead rank's exit is still named."""
    with pytest.raises(RankError) as info:
        ring.run(exit_late_on_rank, 0, timeout_s=PROMPT_S)
    message = str(info.value)
    assert "rank 0 of 2 failed:\nthe process exited with code 7 without replying" in message, message
    assert "rank 1 of 2 failed:" in message, message
    assert not ring.running


def test_ring_respawns_after_a_failure(ring: SpawnedGroup) -> None:
    """The previous case killed the ring; the next call spawns a fresh, working group."""
    assert not ring.running
    assert ring.run(sum_of_ranks, 1.0) == [(r, WORLD, sum(range(WORLD)) + WORLD * 1.0) for r in range(WORLD)]


def test_unpicklable_function_is_rejected_before_spawning() -> None:
    ring = SpawnedGroup(2)
    with pytest.raises(TypeError, match="must be picklable"):
        ring.run(lambda rank, world_size, payload: rank, None)
    assert not ring.running


@pytest.mark.soak  # a fresh interpreter per rank re-imports torch: seconds per process on two cores
def test_spawn_start_method() -> None:
    with SpawnedGroup(WORLD, start_method="spawn") as ring:
        assert ring.run(sum_of_ranks, 0.0) == [(r, WORLD, float(sum(range(WORLD)))) for r in range(WORLD)]


def test_bad_start_method_is_rejected() -> None:
    with pytest.raises(ValueError, match="start_method must be 'forkserver' or 'spawn'; got 'fork'"):
        SpawnedGroup(2, start_method="fork")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_world_size_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        SpawnedGroup(bad)  # type: ignore[arg-type]


def test_close_joins_every_rank(ring: SpawnedGroup) -> None:
    """Runs last on the module's ring: closing it makes every rank exit cleanly (code 0)."""
    procs = list(ring._procs)
    assert len(procs) == WORLD
    ring.close()
    assert [p.exitcode for p in procs] == [0] * WORLD
    assert not ring.running
