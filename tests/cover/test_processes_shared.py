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

import time

import pytest

from ring_ref._processes._gloo import SpawnedGroup
from ring_ref._processes._mpi_job import MpiJob
from ring_ref._processes._shared import STOP_GRACE_S, Harness, PerSize, wait_for_stacks
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
