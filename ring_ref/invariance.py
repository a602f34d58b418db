"""Same bits at every size and position?  :func:`invariance` (``ring-ref invariance``, spec/invariance.md).

It places a probe region of ``K`` elements at several offsets inside buffers
of several sizes, reveals every probed element's summation tree in each
placement (or, ``by_bits=True``, compares random values' bits with the
region all-reduced alone) and says whether the order is invariant over what
was tried, where it first changes for each element, and how (chunk
boundaries, a size threshold, the position).

This module only re-exports; the code is in ``ring_ref._order_stability``.

>>> found = invariance(lambda x: ((x[0] + x[1]) + x[2]), 3, [4, 9], offsets=[0, 5], probe=4)
>>> found.invariant, found.calls
(True, 12)
"""

from ring_ref._order_stability import Change, Invariance, InvarianceError, Placement, invariance

__all__ = ["Change", "Invariance", "InvarianceError", "Placement", "invariance"]
