"""JAX targets with planted bugs (``difftest --framework jax``), one per diagnosis family.

Each is ``ring_ref.targets.jax_psum`` (``psum`` over ``N`` CPU devices) with one
thing wrong, so that the code difftest gives it is the bug's, not the order's;
:data:`PLANTED_RANKS` are per-process ones (``difftest --ranks jax``), built on
``ring_ref.targets.jax_psum_ranks``.  They import jax when called, never when
this module is imported.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ring_ref.targets import jax_psum, jax_psum_ranks

if TYPE_CHECKING:
    import jax


def psum_counts_device_0_twice(x: jax.Array) -> jax.Array:
    """Bug: device 0's contribution is added a second time."""
    return jax_psum(x) + x[0]


def psum_loses_the_last_device(x: jax.Array) -> jax.Array:
    """Bug: the psum runs over devices 0 .. N - 2; the last device's contribution is lost."""
    return jax_psum(x[:-1]) if x.shape[0] > 1 else x[0] * 1


def psum_rotates_the_chunks(x: jax.Array) -> jax.Array:
    """Bug: the result is stored one chunk (``M / N`` rows) off, every contribution counted once."""
    import jax.numpy as jnp

    return jnp.roll(jax_psum(x), x.shape[1] // x.shape[0], axis=0)


PLANTED = {
    "psum_counts_device_0_twice": "double-counted",
    "psum_loses_the_last_device": "out-of-bound",
    "psum_rotates_the_chunks": "out-of-bound",
}
"""Each planted bug and the one code every failing mode gives it."""


def psum_ranks_last_process_adds_one(x: jax.Array) -> jax.Array:
    """Bug (per process): the last of ``N > 1`` processes adds 1 to its copy of the global psum."""
    import jax

    total = jax_psum_ranks(x)
    last = jax.process_count() > 1 and jax.process_index() == jax.process_count() - 1
    return total + 1 if last else total


def psum_ranks_process_1_hangs(x: jax.Array) -> jax.Array:
    """Bug (per process): process 1 never joins the psum, so every process waits (``timed-out``)."""
    import jax

    if jax.process_index() == 1:
        threading.Event().wait()
    return jax_psum_ranks(x)


PLANTED_RANKS = {"psum_ranks_last_process_adds_one": "ranks-disagree"}
"""Each planted per-process bug (``--ranks jax``) and the code it gets."""
