"""Per-rank targets for ``--subgroups`` (``--ranks job`` / ``mpi-job``): they run on the group they are given.

A torch target is ``fn(tensor, group=None)``, an ``mpi4py`` one ``fn(comm,
array)``; under ``--subgroups`` a case of ``N`` below the job's size gets the
subgroup of ranks ``0 .. N-1``.  The planted bug shows only in a group of odd
size above 1: the last rank keeps its own input instead of the sum, so a job
of 4 ranks finds it only at ``N = 3``, through a subgroup.
Another hangs only in a group of two (a fault in a subgroup case).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tests.common.planted_mpi import plain_ring

__all__ = ["ODD_GROUP_CODE"]

ODD_GROUP_CODE = "ranks-disagree"
"""The code of the odd-group bug: the other ranks hold the sum, the last one its input."""


def all_reduce_on_group(tensor: torch.Tensor, group: Any = None) -> None:
    """Correct: ``torch.distributed.all_reduce`` on the group given."""
    dist.all_reduce(tensor, group=group)


def _odd_and_last(rank: int, size: int) -> bool:
    return size % 2 == 1 and size > 1 and rank == size - 1


def odd_group_last_rank_keeps_input(tensor: torch.Tensor, group: Any = None) -> None:
    """BUG: in a group of odd size above 1, the last rank puts its own input back after the sum."""
    own = tensor.clone()
    dist.all_reduce(tensor, group=group)
    if _odd_and_last(dist.get_rank(group), dist.get_world_size(group)):
        tensor.copy_(own)


def takes_no_group(tensor: torch.Tensor) -> None:
    """Correct on the whole job, but it cannot be given a subgroup (``--subgroups`` refuses it)."""
    dist.all_reduce(tensor)


def mpi_odd_group_last_rank_keeps_input(comm: Any, array: np.ndarray[Any, Any]) -> None:
    """BUG (``mpi4py``): the same, in a communicator of odd size above 1."""
    own = array.copy()
    plain_ring(comm, array)
    if _odd_and_last(comm.Get_rank(), comm.Get_size()):
        array[...] = own


def pair_rank_0_skips_the_call(tensor: torch.Tensor, group: Any = None) -> None:
    """BUG: in a group of two, rank 0 returns without joining the all-reduce; rank 1 waits (``timed-out``)."""
    if dist.get_world_size(group) == 2 and dist.get_rank(group) == 0:
        return
    dist.all_reduce(tensor, group=group)
