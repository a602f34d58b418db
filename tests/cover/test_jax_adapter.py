"""``ring_all_reduce`` on ``jax.Array`` inputs: the reference's bits, dtype and device kept, grad and jit.

The expected values come from the spec's closed forms in :mod:`tests.common.oracles`
(written on tensors, independent of the package) and from the torch path on
the same bits; jax arrays and tensors are exchanged through their integer
bit patterns, never through a value conversion that could round.
"""

from __future__ import annotations

from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ring_ref import ring_all_reduce
from ring_ref._dispatch import Engine
from tests.common.oracles import REDUCE_OPS, blocks_bounds, ring_fold, same_bits, schedule_fold
from tests.common.strategies import worker_tensors

jax.config.update("jax_enable_x64", True)  # type: ignore[no-untyped-call]  # float64 jax arrays exist only with it
jax.config.update("jax_num_cpu_devices", 2)  # type: ignore[no-untyped-call]  # a second device to keep results on (before first use)

pytestmark = pytest.mark.clause("jax-adapter")

_INT = {2: np.int16, 4: np.int32, 8: np.int64}
_TORCH_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def to_jax(t: torch.Tensor, device: jax.Device | None = None) -> jax.Array:
    """The tensor's bits as a jax array of the same dtype (on ``device``)."""
    t = t.contiguous()
    name = str(t.dtype).removeprefix("torch.")
    ints = t.view(_TORCH_INT[t.element_size()]).numpy()
    return cast(jax.Array, jax.device_put(ints.view(jnp.dtype(name)), device))


def to_torch(a: jax.Array) -> torch.Tensor:
    """The jax array's bits as a tensor of the same dtype."""
    host = np.array(a)
    ints = torch.from_numpy(host.view(_INT[host.dtype.itemsize]))
    return ints.view(getattr(torch, host.dtype.name))


@given(worker_tensors(max_n=8), st.sampled_from(["reference", "fast"]))
def test_every_dtype_gives_the_spec_fold_on_both_engines(x: torch.Tensor, engine: Engine) -> None:
    a = to_jax(x)
    y = ring_all_reduce(a, engine)
    assert isinstance(y, jax.Array)
    assert y.dtype == a.dtype and y.shape == a.shape[1:]
    assert same_bits(to_torch(y), ring_fold(x))


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("op", sorted(REDUCE_OPS))
def test_ops_and_schedules_match_the_torch_path(engine: Engine, op: str) -> None:
    x = torch.randn(4, 7, 2, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    for schedule in ("openmpi-ring", "gloo"):
        y = ring_all_reduce(to_jax(x), engine, op=op, schedule=schedule)
        assert same_bits(to_torch(y), ring_all_reduce(x, engine, op=op, schedule=schedule))


def test_a_schedule_gives_its_own_fold() -> None:
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = ring_all_reduce(to_jax(x), schedule="openmpi-ring")
    assert same_bits(to_torch(y), schedule_fold(x, 1, 0, blocks_bounds(3, 5)))


def test_the_result_is_a_new_array_on_the_inputs_device() -> None:
    device = jax.devices()[1]
    a = to_jax(torch.ones(2, 4, dtype=torch.float16), device)
    before = np.array(a)
    y = ring_all_reduce(a)
    assert y.devices() == {device}
    assert np.array_equal(np.array(a), before)
    assert np.array(y).tolist() == [2.0] * 4


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_grad_is_the_sums_gradient(op: str) -> None:
    x = jnp.arange(12.0, dtype=jnp.float32).reshape(4, 3)
    weights = jnp.array([1.0, -2.0, 0.5], dtype=jnp.float32)

    def loss(x: jax.Array) -> jax.Array:
        return (ring_all_reduce(x, op=op, schedule="gloo") * weights).sum()

    grad = jax.grad(loss)(x)
    scale = 4.0 if op == "avg" else 1.0
    assert np.array(grad).tolist() == [[1.0 / scale, -2.0 / scale, 0.5 / scale]] * 4


def test_grad_of_an_op_without_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"op='sum' and op='avg' only; op='max'.*stop_gradient"):
        jax.grad(lambda x: ring_all_reduce(x, op="max").sum())(jnp.ones((2, 2), jnp.float32))


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_jit_runs_the_ring_through_a_callback(engine: Engine) -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    y = jax.jit(lambda a: ring_all_reduce(a, engine))(to_jax(x))
    assert same_bits(to_torch(y), ring_fold(x))


def test_bad_input_gets_the_tables_message() -> None:
    with pytest.raises(TypeError, match=r"unsupported dtype int32.*jax\.numpy\.float16, bfloat16"):
        ring_all_reduce(jnp.ones((2, 2), jnp.int32))
    with pytest.raises(ValueError, match="M = 3 is not divisible by N = 2"):
        jax.jit(ring_all_reduce)(jnp.ones((2, 3), jnp.float32))  # refused when traced
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        ring_all_reduce(jnp.ones(4, jnp.float32))
    with pytest.raises(ValueError, match=r"inputs must be finite: 1 element\(s\).*\(1, 0\)"):
        ring_all_reduce(jnp.array([[1.0, 2.0], [jnp.inf, 0.0]], jnp.float32))
    with pytest.raises(Exception, match="inputs must be finite"):  # jax wraps the callback's error
        jax.jit(ring_all_reduce)(jnp.array([[1.0, 2.0], [jnp.nan, 0.0]], jnp.float32))
