"""What reveal asks of a target: the sizes it can probe (clause ``reveal-limits``) and a checked call.

Set probes need the ``N`` small values ``2^0 .. 2^(N-1)`` to add exactly, so
``N`` at most the significand's bits: 24 in float32, 53 in float64.  Count
probes need counts of up to ``N`` units to be exact: ``N <= 2^p``, so 2048 in
float16 and 256 in bfloat16; float32 and float64 are capped at 65536.  A target is
called on ``(N, M)`` tensors and must return the ``(M,)`` sum over workers in
the same dtype; one that raises or returns anything else is a
:class:`RevealError`, never a wrong tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import torch

from ring_ref._dtypes import FORMATS
from ring_ref._hints import raised_hint

__all__ = ["LIMITS", "REVEAL_DTYPES", "SET_LIMITS", "RevealError", "call_target", "check_reveal_size"]

SET_LIMITS: Final[dict[str, int]] = {
    "float32": FORMATS["float32"].precision,
    "float64": FORMATS["float64"].precision,
}
"""The largest ``N`` of set probes per dtype: the ``N`` small probe values must add exactly."""

LIMITS: Final[dict[str, int]] = {
    "float16": 2 ** FORMATS["float16"].precision,
    "bfloat16": 2 ** FORMATS["bfloat16"].precision,
    "float32": 65536,
    "float64": 65536,
}
"""The largest ``N`` per dtype: counts of up to ``N`` units exact (``2^p``), float32 and float64 capped."""

_WHY: Final[dict[str, str]] = {
    "float16": "counts of up to N units must be exact in the 11-bit significand",
    "bfloat16": "counts of up to N units must be exact in the 8-bit significand",
    "float32": "reveal caps N there (the probes are N x M inputs; float64 has the same cap)",
    "float64": "reveal caps N there (the probes are N x M inputs)",
}

REVEAL_DTYPES: Final[dict[str, torch.dtype]] = {name: FORMATS[name].torch_dtype for name in LIMITS}
"""The torch dtype of each dtype name reveal probes in (those of :data:`LIMITS`)."""


class RevealError(ValueError):
    """The reveal cannot run: a size beyond the limits, or a target that misbehaves on valid input."""


def check_reveal_size(n: int, m: int, dtype_name: str) -> None:
    """Refuse sizes the probes cannot serve (clause ``reveal-limits``)."""
    if dtype_name not in LIMITS:
        raise RevealError(f"reveal supports dtype {', '.join(LIMITS)}; got {dtype_name!r}")
    if n < 1 or m < 1:
        raise RevealError(f"N = {n} and M = {m} must both be at least 1")
    limit = LIMITS[dtype_name]
    if n > limit:
        other = " (float32 reaches N = 65536)" if limit < LIMITS["float32"] else ""
        raise RevealError(
            f"N = {n} is beyond reveal's limit for {dtype_name}: N <= {limit}, because "
            f"{_WHY[dtype_name]}{other}"
        )


def call_target(target: Callable[[torch.Tensor], object], x: torch.Tensor, m: int) -> torch.Tensor:
    """``target(x)``, which must be an ``(m,)`` tensor of ``x``'s dtype (else :class:`RevealError`)."""
    try:
        out = target(x)
    except RevealError:
        raise  # a per-rank adapter's own account of what the ranks did (difftest._orders.per_rank_target)
    except Exception as exc:
        raised = f"{type(exc).__name__}: {exc}"
        hint = raised_hint(raised, per_rank=False)
        raise RevealError(f"the target raised {raised} (on a valid input){hint}") from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (m,) or out.dtype != x.dtype:
        got = (
            f"{type(out).__name__} {tuple(out.shape)} {out.dtype}"
            if isinstance(out, torch.Tensor)
            else type(out).__name__
        )
        raise RevealError(f"the target must return a ({m},) tensor of {x.dtype}; it returned {got}")
    return out.detach().cpu()
