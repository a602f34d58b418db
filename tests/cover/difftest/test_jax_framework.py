"""``--framework jax`` in the tester's process: what a JAX target is handed and how its answer is read.

The isolated worker and ``jax_psum`` are checked in ``tests/nocover/test_jax.py``
(fresh processes); here the wrapper itself, and the JAX adapter checked by
difftest as a JAX target, in this process.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref.difftest import difftest
from ring_ref.difftest._loading import with_framework

pytestmark = pytest.mark.clause("jax-difftest")


def _bits(t: torch.Tensor) -> list[int]:
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return [int(v) for v in t.contiguous().view(ints).reshape(-1)]


def test_a_jax_target_gets_a_jax_array_with_the_cases_bits() -> None:
    seen: list[jax.Array] = []

    def target(x: jax.Array) -> jax.Array:
        seen.append(x)
        return x[0]

    strided = torch.tensor([[1.5, -0.0, 3.0, 7.0], [2.0, 65504.0, -1.0, 0.5]], dtype=torch.bfloat16)[:, ::2]
    with_framework(target, "jax")(strided)
    (x,) = seen
    assert isinstance(x, jax.Array) and x.dtype == jnp.bfloat16 and x.shape == (2, 2)
    assert np.array(x).view(np.int16).reshape(-1).tolist() == _bits(strided)


def test_what_a_jax_target_returns_is_read_back_by_its_bits() -> None:
    x = torch.tensor([[1.0, -0.0], [3.0, 2.0**-24]], dtype=torch.float16)
    back = with_framework(lambda a: a[0] + a[1], "jax")(x)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.float16
    assert _bits(back) == _bits(torch.tensor([4.0, 2.0**-24], dtype=torch.float16))
    widened = with_framework(lambda a: a.astype(jnp.int32)[0], "jax")(x)
    assert isinstance(widened, torch.Tensor) and widened.dtype == torch.int32  # judged: dtype-changed
    host = np.zeros(2)
    assert with_framework(lambda a: host, "jax")(x) is host  # not a jax.Array: judged as returned


def jax_reference(x: jax.Array) -> jax.Array:
    """The reference on a ``jax.Array``: must pass every mode as a JAX target."""
    return ring_all_reduce(x)


def test_the_jax_adapter_passes_difftest_as_a_jax_target() -> None:
    report = difftest(jax_reference, examples=15, seed=11, max_workers=4, isolate=False, framework="jax")
    assert report.verdict == "pass", report.render()
    assert not report.isolated
    assert report.replay.endswith("--framework jax --in-process")

    def local_reference(x: jax.Array) -> jax.Array:  # not importable: runs here, replayed in Python
        return ring_all_reduce(x)

    local = difftest(local_reference, modes="bound", examples=1, seed=1, framework="jax")
    assert local.verdict == "pass" and local.replay.endswith("], framework='jax')")


def test_framework_jax_with_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match=r"jax is for stacked targets or ranks='jax' \(--ranks jax\)"):
        difftest("ring_ref.targets:jax_psum", ranks="gloo", framework="jax")


@pytest.mark.clause("jax-ranks")
def test_ranks_jax_refuses_to_fork_a_process_that_imported_jax() -> None:
    assert "jax" in sys.modules  # this module imported it
    for framework in ("torch", "jax"):
        with pytest.raises(RuntimeError, match="forks its ranks from this process, which has imported jax"):
            difftest("ring_ref.targets:jax_psum_ranks", ranks="jax", framework=framework, examples=1)
