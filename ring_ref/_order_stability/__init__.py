"""``ring-ref invariance``: does an all-reduce's order for an element depend on the message size or on where
the element sits (a DDP bucket, a fusion buffer)?

A probe region of ``K`` elements is placed at every offset inside buffers of
every size (:mod:`._placement`, whose :class:`Embedded` shows the target's
answer for the region alone); reveal names each probed element's tree in every
placement, or ``--by-bits`` compares random values' bits with the region
all-reduced alone (:mod:`._run`); the report gives each element's first
change and a one-line summary (:mod:`._report`).  The picture is
:func:`ring_ref._svg.invariance_svg`.
"""

from ring_ref._order_stability._placement import (
    DEFAULT_PROBE,
    Embedded,
    InvarianceError,
    Placement,
    batches,
    chunk_offsets,
    placements,
)
from ring_ref._order_stability._report import (
    INVARIANCE_FORMAT,
    INVARIANCE_VERSION,
    Change,
    Invariance,
    first_changes,
)
from ring_ref._order_stability._run import BITS_DRAWS, invariance

__all__ = [
    "BITS_DRAWS",
    "DEFAULT_PROBE",
    "INVARIANCE_FORMAT",
    "INVARIANCE_VERSION",
    "Change",
    "Embedded",
    "Invariance",
    "InvarianceError",
    "Placement",
    "batches",
    "chunk_offsets",
    "first_changes",
    "invariance",
    "placements",
]
