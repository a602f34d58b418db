"""The reduction operations: what a reduce-scatter receiver stores, per op (clauses ``op-*``).

Every op runs the same ring and the same fold order as ``sum``; only the
combine differs.  The receiver stores ``combine(incoming, own)`` in the input
dtype:

* ``sum``: ``incoming + own``; ``prod``: ``incoming * own`` (one rounding each);
* ``max``: ``own`` if ``own > incoming`` else ``incoming``; ``min``: ``own`` if
  ``own < incoming`` else ``incoming``.  So of equal values (``-0.0`` and
  ``+0.0``) the one met first in the fold order is kept: the result is the
  first maximum (minimum) in fold order, sign of zero included.  (``torch.maximum``
  and ``numpy.maximum`` disagree on that sign, so neither is used.)
* ``avg``: the ring's ``sum``, then one division by ``N``, correctly rounded once
  to the dtype.  (NCCL's floating-point average differs: it multiplies every
  contribution by ``1/N`` rounded to the dtype, then sums.)

>>> import torch
>>> combine = torch_combine("max")
>>> combine(torch.tensor([-0.0, 1.0]), torch.tensor([0.0, 2.0]))
tensor([-0., 2.])
>>> op_name("MIN"), op_name("avg")
('min', 'avg')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal, cast

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "COMMUTING_OPS",
    "OPS",
    "Op",
    "finish_numpy",
    "finish_torch",
    "numpy_combine",
    "op_name",
    "torch_combine",
    "torch_combine_into",
]

Op = Literal["sum", "prod", "max", "min", "avg"]
OPS: Final[tuple[Op, ...]] = ("sum", "prod", "max", "min", "avg")
COMMUTING_OPS: Final[frozenset[Op]] = frozenset({"sum", "avg", "prod"})
"""Ops whose combine of two finite inputs gives the same bits with the two swapped, in every
supported dtype: IEEE addition and multiplication commute exactly.  ``max`` and ``min`` do not:
of ``-0.0`` and ``+0.0`` they keep the incoming one."""

_REDUCE_OP_NAMES: Final = {"SUM": "sum", "PRODUCT": "prod", "MAX": "max", "MIN": "min", "AVG": "avg"}

Array = npt.NDArray[Any]


def op_name(op: object) -> Op:
    """Normalise ``op``: one of :data:`OPS` (any case) or a ``torch.distributed.ReduceOp``.

    Anything else raises ``ValueError`` naming the choices.
    """
    if isinstance(op, str):
        key = op.lower()
        if key in OPS:
            return key
        mapped = _REDUCE_OP_NAMES.get(op.upper())
    else:
        mapped = _REDUCE_OP_NAMES.get(str(op).rsplit(".", 1)[-1].upper())
    if mapped is None:
        raise ValueError(
            f"unknown reduction op {op!r}; choose one of {', '.join(OPS)} "
            "(or torch.distributed.ReduceOp SUM, PRODUCT, MAX, MIN, AVG)."
        )
    return cast(Op, mapped)


def _torch_max(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    return torch.where(own > incoming, own, incoming)


def _torch_min(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    return torch.where(own < incoming, own, incoming)


_TORCH: Final[dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
    "sum": torch.add,
    "avg": torch.add,
    "prod": torch.mul,
    "max": _torch_max,
    "min": _torch_min,
}


def torch_combine(op: Op) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``combine(incoming, own)`` for tensors."""
    return _TORCH[op]


def _torch_add_into(incoming: torch.Tensor, own: torch.Tensor) -> None:
    torch.add(incoming, own, out=own)


def _torch_mul_into(incoming: torch.Tensor, own: torch.Tensor) -> None:
    torch.mul(incoming, own, out=own)


def _torch_max_into(incoming: torch.Tensor, own: torch.Tensor) -> None:
    torch.where(own > incoming, own, incoming, out=own)


def _torch_min_into(incoming: torch.Tensor, own: torch.Tensor) -> None:
    torch.where(own < incoming, own, incoming, out=own)


_TORCH_INTO: Final[dict[str, Callable[[torch.Tensor, torch.Tensor], None]]] = {
    "sum": _torch_add_into,
    "avg": _torch_add_into,
    "prod": _torch_mul_into,
    "max": _torch_max_into,
    "min": _torch_min_into,
}


def torch_combine_into(op: Op) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``combine_into(incoming, own)``: :func:`torch_combine`'s result, same bits, stored in ``own``."""
    return _TORCH_INTO[op]


def _numpy_add(incoming: Array, own: Array) -> Array:
    # Overflow to +-inf is the correctly rounded result (clause input-finite), not an error.
    with np.errstate(over="ignore"):
        return np.add(incoming, own)


def _numpy_mul(incoming: Array, own: Array) -> Array:
    # As for the sum: an overflow, an underflow, and the NaN of an overflowed partial product meeting a
    # zero (as in the fast engine, which does not warn either).
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return np.multiply(incoming, own)


def _numpy_max(incoming: Array, own: Array) -> Array:
    return np.where(own > incoming, own, incoming)


def _numpy_min(incoming: Array, own: Array) -> Array:
    return np.where(own < incoming, own, incoming)


_NUMPY: Final[dict[str, Callable[[Array, Array], Array]]] = {
    "sum": _numpy_add,
    "avg": _numpy_add,
    "prod": _numpy_mul,
    "max": _numpy_max,
    "min": _numpy_min,
}


def numpy_combine(op: Op) -> Callable[[Array, Array], Array]:
    """``combine(incoming, own)`` for arrays."""
    return _NUMPY[op]


def finish_torch(op: Op, result: torch.Tensor, n: int) -> torch.Tensor:
    """``avg``: the ring's sum divided by ``n``, rounded once; every other op: ``result`` itself."""
    return torch.div(result, n) if op == "avg" else result


def finish_numpy(op: Op, result: Array, n: int) -> Array:
    """``avg``: the ring's sum divided by ``n``, rounded once in the dtype; else ``result``."""
    if op != "avg":
        return result
    # In float64 the quotient is rounded once to 53 bits; rounding that to float32 or float16
    # gives the correctly rounded quotient (53 >= 2p + 2). Dividing in float16 would round N too.
    quotient: Array = np.divide(result.astype(np.float64), np.float64(n))
    return quotient.astype(result.dtype)
