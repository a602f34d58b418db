"""What the reference engine costs, and the warning it gives before a ring that takes seconds."""

from __future__ import annotations

import warnings
from typing import Final

__all__ = ["REFERENCE_SLOW_N", "SlowReferenceWarning", "warn_if_slow"]

REFERENCE_SLOW_N: Final = 256
"""From this many workers on, the reference engine warns before it starts: it takes seconds (N = 256:
about 3 s here) and grows as N^3, while ``engine="fast"`` gives the same bits in milliseconds."""


class SlowReferenceWarning(UserWarning):
    """The reference engine was asked for a ring large enough to take seconds or more."""


def warn_if_slow(n: int) -> None:
    """Warn (:class:`SlowReferenceWarning`) when ``n`` workers would keep the reference busy for seconds."""
    if n >= REFERENCE_SLOW_N:
        warnings.warn(
            SlowReferenceWarning(
                f"N = {n} workers: the reference engine checks every invariant after each of the "
                f"{2 * (n - 1)} rounds and takes seconds or more (time grows as N^3). engine='fast' "
                "gives the same bits much sooner."
            ),
            stacklevel=4,
        )
