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
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._names import OPS, Op

__all__ = [
    "COMMUTING_OPS",
    "OPS",
    "REDUCE_OP_NAMES",
    "Op",
    "finish_numpy",
    "finish_torch",
    "numpy_combine",
    "numpy_combine_out",
    "op_name",
    "torch_combine",
    "torch_combine_into",
    "torch_combine_out",
]

COMMUTING_OPS: Final[frozenset[Op]] = frozenset({"sum", "avg", "prod"})
"""Ops whose combine of two finite inputs gives the same bits with the two swapped, in every
supported dtype: IEEE addition and multiplication commute exactly.  ``max`` and ``min`` do not:
of ``-0.0`` and ``+0.0`` they keep the incoming one."""

REDUCE_OP_NAMES: Final[dict[str, str]] = {
    "sum": "SUM",
    "prod": "PRODUCT",
    "max": "MAX",
    "min": "MIN",
    "avg": "AVG",
}
"""Each op's ``torch.distributed.ReduceOp`` attribute name."""
_OP_OF_REDUCE_OP: Final[dict[str, Op]] = {REDUCE_OP_NAMES[op]: op for op in OPS}

Array = npt.NDArray[Any]


def op_name(op: object) -> Op:
    """Normalise ``op``: one of :data:`OPS` (any case) or a ``torch.distributed.ReduceOp``.

    Anything else raises ``ValueError`` naming the choices.
    """
    if isinstance(op, str):
        key = op.lower()
        if key in OPS:
            return key
        mapped = _OP_OF_REDUCE_OP.get(op.upper())
    else:
        mapped = _OP_OF_REDUCE_OP.get(str(op).rsplit(".", 1)[-1].upper())
    if mapped is None:
        raise ValueError(
            f"unknown reduction op {op!r}; choose one of {', '.join(OPS)} "
            "(or torch.distributed.ReduceOp SUM, PRODUCT, MAX, MIN, AVG)."
        )
    return mapped


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


def _torch_add_out(incoming: torch.Tensor, own: torch.Tensor, out: torch.Tensor) -> object:
    return torch.add(incoming, own, out=out)


def _torch_mul_out(incoming: torch.Tensor, own: torch.Tensor, out: torch.Tensor) -> object:
    return torch.mul(incoming, own, out=out)


def _torch_max_out(incoming: torch.Tensor, own: torch.Tensor, out: torch.Tensor) -> object:
    return torch.where(own > incoming, own, incoming, out=out)


def _torch_min_out(incoming: torch.Tensor, own: torch.Tensor, out: torch.Tensor) -> object:
    return torch.where(own < incoming, own, incoming, out=out)


_TORCH_OUT: Final[dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]]] = {
    "sum": _torch_add_out,
    "avg": _torch_add_out,
    "prod": _torch_mul_out,
    "max": _torch_max_out,
    "min": _torch_min_out,
}


def torch_combine_out(op: Op) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]:
    """``combine(incoming, own, out)``: :func:`torch_combine`'s bits, written into ``out`` (fast engine)."""
    return _TORCH_OUT[op]


def torch_combine_into(op: Op) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``combine_into(incoming, own)``: :func:`torch_combine`'s result, same bits, stored in ``own``."""
    combine = _TORCH_OUT[op]

    def into(incoming: torch.Tensor, own: torch.Tensor) -> None:
        combine(incoming, own, own)

    return into


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


def _numpy_add_out(incoming: Array, own: Array, out: Array) -> object:
    return np.add(incoming, own, out=out)


def _numpy_mul_out(incoming: Array, own: Array, out: Array) -> object:
    return np.multiply(incoming, own, out=out)


def _numpy_max_out(incoming: Array, own: Array, out: Array) -> None:
    if incoming is not out:
        np.copyto(out, incoming)
    np.copyto(out, own, where=own > out)


def _numpy_min_out(incoming: Array, own: Array, out: Array) -> None:
    if incoming is not out:
        np.copyto(out, incoming)
    np.copyto(out, own, where=own < out)


_NUMPY_OUT: Final[dict[str, Callable[[Array, Array, Array], object]]] = {
    "sum": _numpy_add_out,
    "avg": _numpy_add_out,
    "prod": _numpy_mul_out,
    "max": _numpy_max_out,
    "min": _numpy_min_out,
}


def numpy_combine_out(op: Op) -> Callable[[Array, Array, Array], object]:
    """``combine(incoming, own, out)`` for arrays, into ``out`` (``numpy.maximum`` and ``numpy.minimum``
    would break signed-zero ties otherwise); the caller sets ``numpy.errstate``."""
    return _NUMPY_OUT[op]


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
