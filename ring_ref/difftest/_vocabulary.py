"""The tester's fixed names: oracle modes, diagnosis codes, dtypes by name, and what a target is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

import torch

from ring_ref._dtypes import FORMATS

__all__ = ["CODES", "DEFAULT_TIMEOUT_S", "DTYPES", "MODES", "Mode", "Target"]

Mode = Literal["exact", "order-free", "bound"]
MODES: Final[tuple[Mode, ...]] = ("exact", "order-free", "bound")

CODES: Final = (
    "wrong-shape",
    "dtype-changed",
    "device-changed",
    "input-modified",
    "aliases-input",
    "raised",
    "timed-out",
    "crashed",
    "nondeterministic",
    "mean-not-sum",
    "double-counted",
    "not-ring-order",
    "out-of-bound",
)
"""The fixed diagnosis vocabulary (README section *Differential testing*)."""

DTYPES: Final[dict[str, torch.dtype]] = {name: fmt.torch_dtype for name, fmt in FORMATS.items()}
"""The dtypes the tester generates, by name."""

DEFAULT_TIMEOUT_S: Final = 60.0
"""The default time limit, in seconds, for one call of an isolated target (``--timeout``)."""

Target = Callable[[torch.Tensor], object]
"""A stacked target: ``fn(worker_tensors)`` with the signature of :func:`ring_ref.ring_all_reduce`."""
