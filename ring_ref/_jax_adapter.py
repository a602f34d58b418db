"""Both engines on ``jax.Array`` inputs (the optional extra ``ring-ref[jax]``).

Only :mod:`ring_ref._dispatch` imports this module, and only for an input that
is a ``jax.Array`` (so ``import ring_ref`` never imports jax).  The input's
bits are read into a ``torch.Tensor`` of the same dtype (a zero-copy view of
the host copy: numpy has no bfloat16, and ``ml_dtypes``' bfloat16 is read
through its 16-bit integer view) and reduced by the torch engines
(:mod:`ring_ref._torch_adapter`, :mod:`ring_ref._fast`), which own the
validation and the chunking; the result's bits come back as a new
``jax.Array`` on the input's device, with the input's dtype.

Gradients: :func:`reduce_jax` is a ``jax.custom_vjp``: the gradient of a sum
is the output's cotangent passed to every worker unchanged (``avg`` divides it
by ``N``); ``prod``, ``max`` and ``min`` are refused under ``jax.grad``.
Under ``jax.jit`` (or any other trace) the ring runs on the host through
``jax.pure_callback`` (shape and dtype are checked when the function is
traced, finiteness when it runs).

>>> import jax.numpy as jnp
>>> reduce_jax(jnp.array([[1.0, 2.0], [3.0, 4.0]], dtype=jnp.float32))
Array([4., 6.], dtype=float32)
"""

from __future__ import annotations

import functools
from typing import Any, Literal, NamedTuple, cast

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ring_ref import _fast, _torch_adapter
from ring_ref._dtypes import FORMATS, INT_OF_SIZE
from ring_ref._ops import Op
from ring_ref._validate import check_jax_structure
from ring_ref.schedule import SPEC, Schedule

__all__ = ["GRADIENT_OPS", "host_of", "reduce_jax", "tensor_of"]

GRADIENT_OPS: tuple[Op, ...] = _fast.DIFFERENTIABLE_OPS
"""The ops ``jax.grad`` goes through: the sum's gradient (``avg``'s divided by ``N``)."""


class _How(NamedTuple):
    """Everything but the input: hashable, so that ``jax.custom_vjp`` takes it as a static argument."""

    engine: Literal["reference", "fast"]
    op: Op
    ring: Schedule
    n: int


def tensor_of(a: np.ndarray[Any, Any]) -> torch.Tensor:
    """A host array of a supported dtype as a tensor of the same dtype (a writeable copy if it is not)."""
    fmt = FORMATS[a.dtype.name]
    ints = np.require(a, requirements=["C", "W"]).view(np.dtype(f"int{fmt.bits}"))
    return torch.from_numpy(ints).view(fmt.torch_dtype)


def host_of(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A tensor of a supported dtype as a host array of the same jax dtype and bits (a copy when strided)."""
    ints = t.detach().contiguous().view(INT_OF_SIZE[t.element_size()]).numpy()
    return ints.view(jnp.dtype(str(t.dtype).removeprefix("torch.")))


def _host(a: np.ndarray[Any, Any], how: _How) -> np.ndarray[Any, Any]:
    """The engine on a host array; the result as a host array of the input's dtype."""
    x = tensor_of(a)
    if how.engine == "fast":
        return host_of(_fast.ring_all_reduce_torch(x, how.op, how.ring))
    return host_of(_torch_adapter.reduce_torch(x, how.op, how.ring))


def _forward(x: jax.Array, how: _How) -> jax.Array:
    if isinstance(x, jax.core.Tracer):
        shape = jax.ShapeDtypeStruct(x.shape[1:], x.dtype)  # type: ignore[no-untyped-call]
        answer = jax.pure_callback(lambda a: _host(np.asarray(a), how), shape, x, vmap_method="sequential")
        return cast(jax.Array, answer)
    device = min(x.devices(), key=lambda d: int(d.id))
    return cast(jax.Array, jax.device_put(_host(np.asarray(x), how), device))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _reduce(x: jax.Array, how: _How) -> jax.Array:
    return _forward(x, how)


def _reduce_fwd(x: jax.Array, how: _How) -> tuple[jax.Array, None]:
    return _forward(x, how), None


def _reduce_bwd(how: _How, _residual: None, g: jax.Array) -> tuple[jax.Array]:
    if how.op not in GRADIENT_OPS:
        raise ValueError(
            f"jax.grad through ring_all_reduce is defined for op='sum' and op='avg' only; op={how.op!r} "
            "has no gradient here. Stop the gradient first (jax.lax.stop_gradient(x)), or reduce with "
            "op='sum'."
        )
    if how.op == "avg":
        g = g / jnp.asarray(how.n, g.dtype)
    return (jnp.broadcast_to(g, (how.n, *g.shape)),)


_reduce.defvjp(_reduce_fwd, _reduce_bwd)


def reduce_jax(
    x: jax.Array,
    op: Op = "sum",
    schedule: Schedule = SPEC,
    engine: Literal["reference", "fast"] = "reference",
) -> jax.Array:
    """Reduce ``(N, M, ...)`` over the worker axis with ``schedule``'s ring; worker 0's ``(M, ...)``.

    float16, bfloat16, float32 and float64 (float64 needs
    ``jax.config.update("jax_enable_x64", True)``, without which jax makes no
    float64 arrays); any other dtype, a shape that is not ``(N, M, ...)``, or a
    non-finite value gets the error every entry point gives.  The result is on
    the input's device (a sharded input's: its lowest-numbered device).
    """
    check_jax_structure(x.shape, x.dtype, divisible=schedule.layout == "even")
    return _reduce(x, _How(engine, op, schedule, int(x.shape[0])))
