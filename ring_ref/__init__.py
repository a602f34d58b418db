"""ring-ref: the formally specified reference implementation of ring all-reduce.

This module only re-exports; :func:`ring_all_reduce` is defined in :mod:`ring_ref._dispatch`.  Each name
is imported when first used (:mod:`ring_ref._exports`), so that ``ring-ref --help`` imports no torch.

>>> import torch
>>> from ring_ref import ring_all_reduce
>>> ring_all_reduce(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
"""

from typing import TYPE_CHECKING

from ring_ref._exports import lazy_exports

if TYPE_CHECKING:
    from ring_ref._cost import REFERENCE_SLOW_N, SlowReferenceWarning
    from ring_ref._dispatch import ENGINES, Engine, ring_all_gather, ring_all_reduce, ring_reduce_scatter
    from ring_ref._ops import OPS, Op
    from ring_ref._version import __version__
    from ring_ref.invariants import InvariantViolation
    from ring_ref.schedule import PRESETS, RingSchedule

__all__ = [
    "ENGINES",
    "OPS",
    "PRESETS",
    "REFERENCE_SLOW_N",
    "Engine",
    "InvariantViolation",
    "Op",
    "RingSchedule",
    "SlowReferenceWarning",
    "__version__",
    "ring_all_gather",
    "ring_all_reduce",
    "ring_reduce_scatter",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ring_ref._cost": ("REFERENCE_SLOW_N", "SlowReferenceWarning"),
        "ring_ref._dispatch": (
            "ENGINES",
            "Engine",
            "ring_all_gather",
            "ring_all_reduce",
            "ring_reduce_scatter",
        ),
        "ring_ref._ops": ("OPS", "Op"),
        "ring_ref._version": ("__version__",),
        "ring_ref.invariants": ("InvariantViolation",),
        "ring_ref.schedule": ("PRESETS", "RingSchedule"),
    },
)
