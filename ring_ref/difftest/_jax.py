"""JAX targets (``--framework jax``): the tester's tensors handed over as ``jax.Array``, answers read back.

The tester draws and judges ``torch.Tensor`` cases as for any target; only
where the target runs (the isolated worker, or this process with
``--in-process``) does :func:`on_jax` turn the case's tensor into a
``jax.Array`` with the same bits (contiguous: a jax array has no strides) and
a returned ``jax.Array`` back into a tensor with its bits, read with
``numpy.asarray`` from whichever devices hold it.  Anything else the target
returns is passed on unchanged, for the tester to refuse.  Wrapping a target
sets up jax in its process (the worker's, or this one's with ``--in-process``):
``jax_enable_x64``, so that float64 cases reach it as float64, and, unless jax
is already in use there, :data:`CPU_DEVICES` CPU devices, so that a target can
place worker ``i`` on device ``i`` (:func:`ring_ref.targets.jax_psum`).  This module is
imported only for a JAX run: jax is the optional extra ``ring-ref[jax]``.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Final

import jax
import numpy as np
import torch

from ring_ref._dtypes import FORMATS
from ring_ref._jax_adapter import host_of, tensor_of
from ring_ref.difftest._vocabulary import OpTarget, Target

__all__ = ["CPU_DEVICES", "on_jax", "to_tensor"]

CPU_DEVICES: Final = 64
"""The CPU devices a JAX target's process is given: the largest ``N`` (``--max-workers``) difftest takes."""


def to_tensor(returned: object) -> object:
    """A returned ``jax.Array`` as a tensor of its bits (another dtype's: by value); else as it is."""
    if not isinstance(returned, jax.Array):
        return returned
    host = np.array(returned)
    return tensor_of(host) if host.dtype.name in FORMATS else torch.from_numpy(host)


def on_jax(fn: OpTarget) -> Target:
    """``fn``, a JAX target, as the tester calls a torch one: ``jax.Array`` in, tensor out."""
    jax.config.update("jax_enable_x64", True)  # type: ignore[no-untyped-call]
    with contextlib.suppress(RuntimeError):  # refused once jax is in use: it keeps its devices
        jax.config.update("jax_num_cpu_devices", CPU_DEVICES)  # type: ignore[no-untyped-call]

    @functools.wraps(fn)
    def call(x: torch.Tensor, **op: Any) -> object:
        return to_tensor(fn(jax.device_put(host_of(x)), **op))

    return call
