"""Helpers shared by the fast engine's tests (``tests/cover/test_fast*.py``).

They turn the engine's tuning knobs and read its plan; what a test then expects
comes from ``tests/common/oracles.py`` or the reference engine, never from here.
"""

from __future__ import annotations

import pytest
import torch

from ring_ref import RingSchedule, _fast, ring_all_reduce
from ring_ref._fast import _kernel

__all__ = ["fast_in_small_tiles", "plan_fold_orders"]


def fast_in_small_tiles(
    x: torch.Tensor, tile_bytes: int, threads: int, op: str = "sum", schedule: str | RingSchedule = "spec"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fast engine's result on ``x`` (for the ring ``schedule``) as a tensor and as a numpy array,
    with kernel tiles of ``tile_bytes`` shared among ``threads`` threads and no minimum size per thread."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_kernel, "TILE_BYTES", tile_bytes)
            patch.setattr(_kernel, "MIN_BYTES_PER_THREAD", 1)
            got = ring_all_reduce(x, engine="fast", op=op, schedule=schedule)
            array = ring_all_reduce(x.numpy(), engine="fast", op=op, schedule=schedule)
    finally:
        torch.set_num_threads(before)
    return got, torch.from_numpy(array)


def plan_fold_orders(n: int) -> dict[int, list[int]]:
    """Per element offset ``c`` of a chunk, the workers whose values the fast plan adds into it, in
    the order its rounds add them (the first add of a chunk names both its workers)."""
    order: dict[int, list[int]] = {c: [] for c in range(n)}
    for adds in _fast.plan(n).rounds:
        for add in adds:
            for c in range(add.start, add.stop):
                if add.incoming is not None:
                    order[c].append(c + add.incoming)
                order[c].append(c + add.own)
    return order
