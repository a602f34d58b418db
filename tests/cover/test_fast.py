"""The fast engine (``ring_ref._fast``): bitwise equal to the reference engine, and its own invariants.

The reference engine is the oracle for bits; ``tests/oracles.py`` (independent
of ``ring_ref``) is a second one where the reference would be too slow.  Speed
and memory are not tested here: ``make bench`` measures them side by side.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.autograd import forward_ad

from ring_ref import InvariantViolation, _fast, ring_all_reduce, schedule
from tests.oracles import bits, ring_fold, same_bits
from tests.strategies import ALL_DTYPES, shapes, worker_tensors

NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64)
FEW = settings(max_examples=max(4, settings().max_examples // 15))
"""Examples for the tests whose reference runs take seconds (N up to 64): 4 by default, more under soak."""


@pytest.fixture(autouse=True)
def _fresh_plans() -> Iterator[None]:
    """Plans are cached per N; tests that patch the schedule must not see or leave stale ones."""
    _fast.plan.cache_clear()
    yield
    _fast.plan.cache_clear()


def snapshot(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...], torch.dtype]:
    """Everything ``input-unchanged`` requires to stay the same."""
    return bits(x).clone(), tuple(x.shape), x.stride(), x.dtype


def same_snapshot(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """True when two :func:`snapshot` results agree bit for bit."""
    return bool(torch.equal(a[0], b[0])) and a[1:] == b[1:]


def negative_strides(a: npt.NDArray[Any], axis: int) -> npt.NDArray[Any]:
    """The same values as ``a`` in a view whose stride along ``axis`` is negative."""
    flipped = np.ascontiguousarray(np.flip(a, axis))
    return np.flip(flipped, axis)


@pytest.mark.clause("engines-same-bits", "fold-order", "input-unchanged", "preserve-dtype-device")
@given(worker_tensors())
def test_fast_equals_reference_bitwise(x: torch.Tensor) -> None:
    before = snapshot(x)
    want = ring_all_reduce(x, engine="reference")
    got = ring_all_reduce(x, engine="fast")
    assert same_bits(got, want)
    assert (got.dtype, got.device) == (x.dtype, x.device)
    assert same_snapshot(snapshot(x), before)


@pytest.mark.clause("fold-order")
@FEW
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(ALL_DTYPES),
    st.integers(17, 64),
    st.sampled_from(["contiguous", "sliced"]),
)
@example(seed=0, dtype=torch.bfloat16, n=64, layout="sliced")  # the largest N, on every run
def test_fast_equals_reference_bitwise_up_to_64_workers(
    seed: int, dtype: torch.dtype, n: int, layout: str
) -> None:
    # Seeded values: drawing n * n floats one by one would overrun Hypothesis' buffer at n = 64.
    generator = torch.Generator().manual_seed(seed)
    dense = (
        torch.randn(n, n, generator=generator, dtype=torch.float64)
        * 2.0 ** torch.randint(-8, 9, (n, n), generator=generator)
    ).to(dtype)
    x = dense if layout == "contiguous" else torch.cat([dense, dense], 1)[:, ::2]
    assert same_bits(ring_all_reduce(x, engine="fast"), ring_all_reduce(x, engine="reference"))


UNUSUAL_LAYOUTS = {
    "expanded-workers": lambda: torch.randn(1, 8, dtype=torch.float64).expand(4, 8),
    "expanded-rows": lambda: torch.randn(4, 1, 3, dtype=torch.float64).expand(4, 8, 3),
    "expanded-trailing": lambda: torch.randn(4, 8, 1, dtype=torch.float64).expand(4, 8, 3),
    "permuted": lambda: torch.randn(3, 2, 6, dtype=torch.float64).permute(1, 2, 0),
    "storage-offset": lambda: torch.randn(5, 8, 2, dtype=torch.float64)[1:],
}


@pytest.mark.clause("fold-order", "input-unchanged")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("layout", list(UNUSUAL_LAYOUTS))
def test_fast_equals_reference_on_unusual_strides(layout: str, dtype: torch.dtype) -> None:
    """Zero strides (``expand``), permuted dimensions and a storage offset: the diagonal views stay right."""
    x = (UNUSUAL_LAYOUTS[layout]() * 1e3).to(dtype)
    before = snapshot(x)
    got = ring_all_reduce(x, engine="fast")
    assert same_bits(got, ring_all_reduce(x, engine="reference"))
    assert same_bits(got, ring_fold(x))
    assert same_snapshot(snapshot(x), before)


@st.composite
def wide_range_tensors(draw: st.DrawFn, max_n: int = 64) -> torch.Tensor:
    """Inputs up to ``max_n`` workers with values spread over many binades, so rounding order shows."""
    dtype = draw(st.sampled_from(ALL_DTYPES))
    n = draw(st.integers(1, max_n))
    shape = (n, n * draw(st.integers(1, 3)), *draw(st.lists(st.integers(1, 3), max_size=2)))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    mantissas = torch.randn(shape, generator=generator, dtype=torch.float64)
    exponents = torch.randint(-8, 9, shape, generator=generator).to(torch.float64)
    x = (mantissas * 2.0**exponents).to(dtype)
    if draw(st.booleans()):
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    return x


@pytest.mark.clause("fold-order", "chunk-layout")
@given(wide_range_tensors())
def test_fast_equals_the_closed_form_fold(x: torch.Tensor) -> None:
    assert same_bits(ring_all_reduce(x, engine="fast"), ring_fold(x))


@pytest.mark.clause("fold-order")
@given(worker_tensors(max_n=12), st.integers(1, 64))
def test_tile_size_does_not_change_the_bits(x: torch.Tensor, tile_bytes: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_fast, "TILE_BYTES", tile_bytes)
        patch.setattr(_fast, "NUMPY_TILE_BYTES", tile_bytes)
        got = ring_all_reduce(x, engine="fast")
    assert same_bits(got, ring_all_reduce(x, engine="reference"))


@pytest.mark.clause("fold-order", "preserve-dtype-device", "input-unchanged")
@given(worker_tensors(dtypes=NUMPY_DTYPES), st.sampled_from([None, 0, 1]))
def test_fast_numpy_equals_reference_bitwise(x: torch.Tensor, flip_axis: int | None) -> None:
    a = x.numpy()
    if flip_axis is not None:
        a = negative_strides(a, flip_axis)
    before = a.copy()
    want = ring_all_reduce(a, engine="reference")
    got = ring_all_reduce(a, engine="fast")
    assert type(got) is np.ndarray
    assert got.dtype == a.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    assert a.tobytes() == before.tobytes()


@pytest.mark.clause("no-aliasing", "n1-no-rounds")
@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_fast_result_owns_its_storage(n: int, kind: str) -> None:
    x = torch.arange(n * n * 2, dtype=torch.float32).reshape(n, 2 * n)
    before = x.clone()
    if kind == "torch":
        result = ring_all_reduce(x, engine="fast")
        assert result.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        result.fill_(-1.0)
    else:
        array = ring_all_reduce(x.numpy(), engine="fast")
        assert not np.shares_memory(array, x.numpy())
        array.fill(-1.0)
    assert torch.equal(x, before)


@pytest.mark.clause("autograd")
@settings(max_examples=max(10, settings().max_examples // 3))
@given(worker_tensors(max_n=8), st.integers(0, 2**32 - 1))
def test_fast_gradients_equal_reference_gradients(x: torch.Tensor, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    grad_out = torch.randn(x.shape[1:], generator=generator, dtype=torch.float64).to(x.dtype)
    grads = []
    for engine in ("reference", "fast"):
        leaf = x.detach().clone().requires_grad_(True)
        result = ring_all_reduce(leaf, engine=engine)
        assert result.requires_grad
        (grad,) = torch.autograd.grad(result, leaf, grad_out)
        grads.append(grad)
    # Equal values; the reference may turn a -0.0 into +0.0 when it sums its per-chunk view gradients.
    assert torch.equal(grads[1], grads[0])
    assert same_bits(grads[1], grad_out.expand_as(x))


@pytest.mark.clause("autograd")
def test_fast_engine_passes_gradcheck_and_double_backward() -> None:
    x = torch.randn(4, 8, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ring_all_reduce(t, engine="fast"), (x,))
    assert torch.autograd.gradgradcheck(lambda t: ring_all_reduce(t, engine="fast"), (x,))


@pytest.mark.clause("autograd", "fold-order")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch's own
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_fast_forward_mode_tangent_equals_reference_bitwise(dtype: torch.dtype) -> None:
    """Forward-mode AD: the tangent is the ring over the tangents, bit for bit the reference's."""
    generator = torch.Generator().manual_seed(3)
    x, tangent = (
        (torch.randn(5, 10, 2, generator=generator, dtype=torch.float64) * 1e3).to(dtype) for _ in range(2)
    )
    tangent = tangent.transpose(0, 1).contiguous().transpose(0, 1)  # a non-contiguous tangent
    results = []
    for engine in ("reference", "fast"):
        with forward_ad.dual_level():
            dual = forward_ad.make_dual(x, tangent)  # type: ignore[no-untyped-call]
            primal, out_tangent = forward_ad.unpack_dual(  # type: ignore[no-untyped-call]
                ring_all_reduce(dual, engine=engine)
            )
            assert out_tangent is not None
            results.append((primal.clone(), out_tangent.clone()))
    (ref_primal, ref_tangent), (primal, out_tangent) = results
    assert same_bits(primal, ref_primal) and same_bits(primal, ring_fold(x))
    assert same_bits(out_tangent, ref_tangent) and same_bits(out_tangent, ring_fold(tangent))


@pytest.mark.clause("autograd")
def test_fast_engine_records_no_graph_without_grad() -> None:
    x = torch.randn(3, 6, requires_grad=True)
    with torch.no_grad():
        assert ring_all_reduce(x, engine="fast").grad_fn is None
    assert ring_all_reduce(x.detach(), engine="fast").grad_fn is None


@pytest.mark.clause("bad-input", "input-unchanged")
@given(
    worker_tensors(max_n=8),
    st.lists(st.sampled_from([float("nan"), float("inf"), float("-inf")]), min_size=1, max_size=3),
    st.data(),
)
def test_fast_engine_rejects_non_finite_input_wherever_it_is(
    x: torch.Tensor, bad: list[float], data: st.DataObject
) -> None:
    """One to three NaN/infinities anywhere (an infinity of each sign can meet in one sum), every dtype."""
    poisoned = x.clone()
    for value in bad:
        index = np.unravel_index(data.draw(st.integers(0, x.numel() - 1)), tuple(x.shape))
        poisoned[tuple(int(i) for i in index)] = value
    before = snapshot(poisoned)
    with pytest.raises(ValueError, match="must be finite"):
        ring_all_reduce(poisoned, engine="fast")
    assert same_snapshot(snapshot(poisoned), before)
    if x.dtype in NUMPY_DTYPES:
        array = poisoned.numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # inf - inf must not surface as a RuntimeWarning first
            with pytest.raises(ValueError, match="must be finite"):
                ring_all_reduce(array, engine="fast")


def fast_on(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The fast engine on ``x`` as a tensor or as a numpy array (converted back)."""
    if kind == "torch":
        return ring_all_reduce(x, engine="fast")
    return torch.from_numpy(ring_all_reduce(x.numpy(), engine="fast"))


@pytest.mark.clause("input-finite")
@pytest.mark.parametrize(
    ("dtype", "kind"), [(d, "torch") for d in ALL_DTYPES] + [(d, "numpy") for d in NUMPY_DTYPES]
)
def test_fast_engine_returns_overflow_to_infinity(dtype: torch.dtype, kind: str) -> None:
    big = torch.finfo(dtype).max
    x = torch.tensor([[big, 1.0, -big, 4.0], [big, 2.0, -big, 8.0]], dtype=torch.float64).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fast_on(x, kind)
    assert got.tolist() == [float("inf"), 3.0, float("-inf"), 12.0]


@pytest.mark.clause("input-finite", "fold-order")
@pytest.mark.parametrize(
    ("dtype", "kind"), [(d, "torch") for d in ALL_DTYPES] + [(d, "numpy") for d in NUMPY_DTYPES]
)
def test_fast_engine_returns_finite_results_whose_total_overflows(dtype: torch.dtype, kind: str) -> None:
    """Every element of the result is finite, but their sum (a cheap finiteness check) would overflow."""
    big = torch.finfo(dtype).max
    halves = torch.full((2, 64), big / 2, dtype=torch.float64).to(dtype)
    x = torch.stack([halves[0], halves[1] / 2])  # each result element is 0.75 * max
    got = fast_on(x, kind)
    assert bool(torch.isfinite(got).all())
    assert same_bits(got, ring_fold(x))


@pytest.mark.clause("bad-input")
@pytest.mark.parametrize("engine", ["Fast", "", None, "torch.sum"])
def test_unknown_engine_is_rejected(engine: Any) -> None:
    x = torch.ones(2, 2)
    with pytest.raises(ValueError, match="unknown engine"):
        ring_all_reduce(x, engine=engine)


@pytest.mark.clause("bad-input")
@pytest.mark.parametrize(
    ("x", "error", "message"),
    [
        (torch.ones(3, 4), ValueError, "M = 4 is not divisible by N = 3"),
        (torch.ones(4), ValueError, "at least 2 dimensions"),
        (torch.ones(2, 2, dtype=torch.int32), TypeError, "unsupported dtype"),
        (torch.ones(2, 2).to_sparse(), TypeError, "dense strided tensor"),
        (torch.ones(2, 2, device="meta"), ValueError, "meta device"),
        (np.ma.masked_array(np.ones((2, 2))), TypeError, "ndarray subclass"),
        ([[1.0, 2.0], [3.0, 4.0]], TypeError, "torch.stack"),
    ],
    ids=["indivisible", "1-d", "int32", "sparse", "meta", "masked", "list"],
)
def test_fast_engine_rejects_bad_input_like_the_reference(
    x: Any, error: type[Exception], message: str
) -> None:
    for engine in ("reference", "fast"):
        with pytest.raises(error, match=message):
            ring_all_reduce(x, engine=engine)


@pytest.mark.clause("no-shortcut", "fold-order")
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16, 33])
def test_plan_adds_each_chunk_in_ring_order_n_minus_1_times(n: int) -> None:
    order: dict[int, list[int]] = {c: [] for c in range(n)}
    for adds in _fast.plan(n):
        for add in adds:
            for c in range(add.start, add.stop):
                if add.incoming is not None:
                    order[c].append(c + add.incoming)
                order[c].append(c + add.own)
    assert sum(len(workers) - 1 for workers in order.values() if workers) == n * (n - 1)
    for c, workers in order.items():
        assert workers == ([] if n == 1 else [(c + j) % n for j in range(n)])


def shifted_ring(patch: pytest.MonkeyPatch) -> None:
    """A different but consistent ring: every send one chunk earlier, so chunk c's fold starts at c + 1."""
    patch.setattr(schedule, "rs_send_chunk", lambda i, r, n: (i - r - 1) % n)
    patch.setattr(schedule, "ag_send_chunk", lambda i, r, n: (i - r) % n)


@pytest.mark.clause("rs-send-chunk", "ag-send-chunk")
def test_fast_engine_follows_ring_ref_schedule_rather_than_its_own() -> None:
    n, k = 5, 3
    x = torch.randn(n, k * n, dtype=torch.float64) * 1e6
    with pytest.MonkeyPatch.context() as patch:
        shifted_ring(patch)
        got = ring_all_reduce(x, engine="fast")
    want = []
    for c in range(n):
        acc = x[(c + 1) % n, c * k : (c + 1) * k]
        for j in range(2, n + 1):
            acc = acc + x[(c + j) % n, c * k : (c + 1) * k]
        want.append(acc)
    assert same_bits(got, torch.cat(want))
    assert not same_bits(got, ring_fold(x))


@pytest.mark.clause("rs-add", "ag-copy-not-add", "round-count")
@pytest.mark.parametrize(
    ("function", "fault", "message"),
    [
        ("rounds_per_phase", lambda n: n, "already holds the receiver's contribution"),
        ("rs_send_chunk", lambda i, r, n: (i + r) % n, "partial sum is at worker"),
        ("rs_send_chunk", lambda i, r, n: 0, "already in flight"),
        ("ag_send_chunk", lambda i, r, n: (i - r) % n, "forwards incomplete chunk"),
        ("rounds_per_phase", lambda n: max(0, n - 2), "not complete"),
    ],
    ids=["extra-round", "stale-chunk", "same-chunk", "ag-off-by-one", "missing-round"],
)
def test_plan_rejects_a_faulty_schedule(function: str, fault: Any, message: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(schedule, function, fault)
        with pytest.raises(InvariantViolation, match=message):
            ring_all_reduce(torch.ones(4, 8), engine="fast")


@pytest.mark.clause("preserve-dtype-device", "fold-order")
@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["fast", "reference"])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_engines_on_cuda_keep_device_and_bits(dtype: torch.dtype, engine: str) -> None:
    """Run by `make gpu-check` on a machine with CUDA; `make verify` deselects it."""
    assert torch.cuda.is_available(), "make gpu-check needs a CUDA device"
    x = (torch.randn(8, 64, 3, dtype=torch.float64) * 100).to(dtype)
    got = ring_all_reduce(x.cuda(), engine=engine)  # type: ignore[call-overload]
    assert got.device == x.cuda().device
    assert same_bits(got.cpu(), ring_fold(x))


@pytest.mark.clause("output-shape")
@given(shapes(max_n=8))
def test_fast_result_shape(shape: tuple[int, ...]) -> None:
    x = torch.zeros(shape)
    assert tuple(ring_all_reduce(x, engine="fast").shape) == shape[1:]
