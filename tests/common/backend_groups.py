"""The ``"ring_ref"`` groups of a rank, one per order, for the backend's tests and benchmark."""

from __future__ import annotations

import torch.distributed as dist

from ring_ref.distributed import RingRefOptions  # also registers the backend "ring_ref" in the rank

__all__ = ["ring_ref_group"]

_GROUPS: dict[str, dist.ProcessGroup] = {}


def ring_ref_group(order: str) -> dist.ProcessGroup:
    """In a rank of a world: its ``"ring_ref"`` group of ``order``, made on first use (every rank of the
    world must ask for the same orders in the same turn, as ``new_group`` needs)."""
    if order not in _GROUPS:
        group = dist.new_group(backend="ring_ref", pg_options=RingRefOptions(order=order))
        assert group is not None
        _GROUPS[order] = group
    return _GROUPS[order]
