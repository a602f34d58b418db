"""The tester's fixed names: oracle modes, diagnosis codes, ops, dtypes by name, and what a target is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import torch

from ring_ref._dtypes import FORMATS
from ring_ref._ops import OPS, REDUCE_OP_NAMES, Op
from ring_ref.difftest._rules import (
    DEFAULT_TIMEOUT_S,
    FRAMEWORKS,
    MAX_RANKS,
    MODES,
    MPI_MAX_RANKS,
    RANKS,
    Framework,
    Mode,
    Ranks,
)
from ring_ref.schedule import COLLECTIVES, Collective, CollectiveName

__all__ = [
    "CODES",
    "COLLECTIVES",
    "DEFAULT_TIMEOUT_S",
    "DTYPES",
    "FRAMEWORKS",
    "MAX_RANKS",
    "MODES",
    "MPI_MAX_RANKS",
    "OPS",
    "RANKS",
    "Collective",
    "CollectiveName",
    "Framework",
    "Mode",
    "Op",
    "OpTarget",
    "Ranks",
    "Target",
    "op_argument",
]

# Collective (owned by ring_ref.schedule, COLLECTIVES its names) is what the tester checks (--collective,
# clause difftest-collectives): a value that the inputs, the oracles, the launchers and the report take
# as a parameter and ask (its phases, shapes, whether it reduces), never comparing its name.
# reduce-scatter: (N, M, ...) -> (N, M/N, ...), rank r ends with chunk r of the reduction; all-gather:
# (N, S, ...) -> (N*S, ...), rank r's shard in slot r.

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
    "sum-not-op",
    "wrong-op",
    "avg-divided-first",
    "avg-times-reciprocal",
    "double-counted",
    "signed-zero",
    "not-ring-order",
    "narrowed-dtype",
    "out-of-bound",
    "wrong-shard",
    "gather-changed-bits",
    "gather-misplaced",
)
"""The fixed diagnosis vocabulary (``docs/guide/difftest.md``, *Diagnosis codes*)."""

DTYPES: Final[dict[str, torch.dtype]] = {name: fmt.torch_dtype for name, fmt in FORMATS.items()}
"""The dtypes the tester generates, by name."""

Target = Callable[[torch.Tensor], object]
"""A target: stacked, ``fn(worker_tensors)`` with the signature of :func:`ring_ref.ring_all_reduce`; or
per rank (``ranks="gloo"``), ``fn(tensor)`` on every rank of a process group with that rank's
``(M, ...)`` tensor, returning the result or ``None`` (then the tensor itself, after the call, is it).
With an op (``--op``) it is also given ``op=`` (:func:`op_argument`), so it then takes two arguments."""


OpTarget = Callable[..., object]
"""A target given ``op=`` as well (``--op``): ``fn(x, op=...)``, or ``fn(tensor, op=...)`` per rank."""


def op_argument(op: Op, ranks: Ranks | None) -> object:
    """The ``op=`` a target is called with (clause ``difftest-ops``).

    A stacked target, an MPI rank and a JAX rank get the op's name, as
    :func:`ring_ref.ring_all_reduce` takes it; a gloo rank gets the
    ``torch.distributed.ReduceOp`` (``SUM``, ``PRODUCT``, ``MAX``, ``MIN``, ``AVG``), so that
    ``torch.distributed.all_reduce`` and :func:`ring_ref.distributed.ring_all_reduce_` are
    per-rank targets as they are.

    >>> op_argument("max", None), op_argument("prod", "gloo") == torch.distributed.ReduceOp.PRODUCT
    ('max', True)
    """
    if ranks != "gloo":
        return op
    from torch.distributed import ReduceOp

    return getattr(ReduceOp, REDUCE_OP_NAMES[op])
