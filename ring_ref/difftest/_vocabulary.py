"""The tester's fixed names: oracle modes, diagnosis codes, dtypes by name, and what a target is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

import torch

from ring_ref._dtypes import FORMATS

__all__ = ["CODES", "DEFAULT_TIMEOUT_S", "DTYPES", "MAX_RANKS", "MODES", "RANKS", "Mode", "Ranks", "Target"]

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
    "ranks-disagree",
    "mean-not-sum",
    "double-counted",
    "not-ring-order",
    "out-of-bound",
)
"""The fixed diagnosis vocabulary (README section *Differential testing*)."""

DTYPES: Final[dict[str, torch.dtype]] = {name: fmt.torch_dtype for name, fmt in FORMATS.items()}
"""The dtypes the tester generates, by name."""

DEFAULT_TIMEOUT_S: Final = 60.0
"""The default time limit, in seconds, for one call of an isolated or per-rank target (``--timeout``)."""

Ranks = Literal["gloo", "mpi"]
RANKS: Final[tuple[Ranks, ...]] = ("gloo", "mpi")
"""The process groups a per-rank target can run on (``--ranks``): gloo, ``TARGET(tensor)``; mpi,
``TARGET(comm, array)`` with an ``mpi4py`` communicator and a ``numpy`` array."""

MAX_RANKS: Final = 8
"""The default largest group for a per-rank target (``--max-workers``; 16 for a stacked one)."""

Target = Callable[[torch.Tensor], object]
"""A target: stacked, ``fn(worker_tensors)`` with the signature of :func:`ring_ref.ring_all_reduce`; or
per rank (``ranks="gloo"``), ``fn(tensor)`` on every rank of a process group with that rank's
``(M, ...)`` tensor, returning the result or ``None`` (then the tensor itself, after the call, is it)."""
