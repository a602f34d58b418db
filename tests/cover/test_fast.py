"""The fast engine (``ring_ref._fast``): bitwise equal to the reference engine, and its own invariants.

The reference engine is the oracle for bits; ``tests/common/oracles.py`` (independent
of ``ring_ref``) is a second one where the reference would be too slow.  Speed
and memory are not tested here: ``make bench`` measures them side by side.
"""

from __future__ import annotations

import functools
import itertools
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.autograd import forward_ad

from ring_ref import InvariantViolation, _fast, ring_all_reduce, schedule
from ring_ref._fast import _forward, _kernel, _plan, _run
from ring_ref.schedule import PRESETS, RingSchedule
from tests.common.fast_knobs import fast_in_small_tiles, plan_fold_orders
from tests.common.oracles import (
    bits,
    exact_sum,
    gloo_bounds,
    pairwise_tree,
    ring_fold,
    ring_fold_op,
    same_bits,
    schedule_fold,
    schedule_fold_by_worker,
)
from tests.common.strategies import ALL_DTYPES, FEW, NUMPY_DTYPES, shapes, worker_tensors

pytestmark = pytest.mark.usefixtures("fresh_plans")

KERNEL_DTYPES = (torch.float32, torch.float64)
"""The dtypes the compiled kernel adds (on the CPU); float16 and bfloat16 take the batched path."""


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


def scaled(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Normal values times 1000 in ``dtype``, a fresh contiguous tensor to take a view of."""
    return (torch.randn(shape, dtype=torch.float64) * 1e3).to(dtype)


UNUSUAL_LAYOUTS: dict[str, Callable[[torch.dtype], torch.Tensor]] = {
    "expanded-workers": lambda d: scaled((1, 8), d).expand(4, 8),
    "expanded-rows": lambda d: scaled((4, 1, 3), d).expand(4, 8, 3),
    "expanded-trailing": lambda d: scaled((4, 8, 1), d).expand(4, 8, 3),
    "permuted": lambda d: scaled((3, 2, 6), d).permute(1, 2, 0),
    "storage-offset": lambda d: scaled((5, 8, 2), d)[1:],
}
"""Views made last, in the dtype under test, so that the engine sees the layout (arithmetic would copy)."""


@pytest.mark.clause("fold-order", "input-unchanged")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("layout", list(UNUSUAL_LAYOUTS))
def test_fast_equals_reference_on_unusual_strides(layout: str, dtype: torch.dtype) -> None:
    """Zero strides (``expand``), permuted dimensions and a storage offset: the diagonal views stay right."""
    x = UNUSUAL_LAYOUTS[layout](dtype)
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
        patch.setattr(_forward, "TILE_BYTES", tile_bytes)
        patch.setattr(_forward, "NUMPY_TILE_BYTES", tile_bytes)
        patch.setattr(_kernel, "TILE_BYTES", tile_bytes)
        got = ring_all_reduce(x, engine="fast")
    assert same_bits(got, ring_all_reduce(x, engine="reference"))


@pytest.mark.clause("fold-order")
@settings(max_examples=max(10, settings().max_examples // 3))
@given(worker_tensors(max_n=12, dtypes=KERNEL_DTYPES), st.integers(1, 256), st.integers(2, 4))
def test_kernel_tiles_shared_among_threads_give_the_same_bits(
    x: torch.Tensor, tile_bytes: int, threads: int
) -> None:
    """Tiny tiles and no minimum size per thread: every input is cut among several threads."""
    got, array = fast_in_small_tiles(x, tile_bytes, threads)
    want = ring_all_reduce(x, engine="reference")
    assert same_bits(got, want)
    assert same_bits(array, want)


def kernel_calls(patch: pytest.MonkeyPatch) -> list[int]:
    """Record each call of the compiled kernel (its ``N``) while ``patch`` is active."""
    calls: list[int] = []
    fold = _kernel.fold_chunks

    def counted(x: npt.NDArray[Any], *args: Any, **kwargs: Any) -> bool:
        calls.append(x.shape[0])
        return fold(x, *args, **kwargs)

    patch.setattr(_kernel, "fold_chunks", counted)
    return calls


KERNEL_LAYOUTS: dict[str, Callable[[torch.dtype], torch.Tensor | npt.NDArray[Any]]] = {
    "contiguous": lambda d: torch.randn(4, 8, 3, dtype=d),
    "transposed": lambda d: torch.randn(8, 4, dtype=d).T,
    "strided": lambda d: torch.randn(4, 16, dtype=d)[:, ::2],
    "expanded-workers": lambda d: torch.randn(1, 8, dtype=d).expand(4, 8),
    "storage-offset": lambda d: torch.randn(5, 8, 2, dtype=d)[1:],
    "numpy": lambda d: torch.randn(4, 8, 3, dtype=d).numpy(),
    "numpy-negative-strides": lambda d: negative_strides(torch.randn(4, 8, dtype=d).numpy(), 1),
}


@pytest.mark.clause("fold-order", "engines-same-bits")
@pytest.mark.parametrize(
    ("layout", "dtype"),
    [
        (layout, d)
        for layout in KERNEL_LAYOUTS
        for d in ALL_DTYPES
        if d in NUMPY_DTYPES or "numpy" not in layout
    ],
)
def test_kernel_takes_float32_and_float64_in_every_layout_it_can_address(
    layout: str, dtype: torch.dtype
) -> None:
    """So the bitwise property tests exercise the compiled path; float16 and bfloat16 keep the batched one."""
    x = KERNEL_LAYOUTS[layout](dtype)
    with pytest.MonkeyPatch.context() as patch:
        calls = kernel_calls(patch)
        got = ring_all_reduce(x, engine="fast")
    assert calls == ([4] if dtype in KERNEL_DTYPES else [])
    want = ring_all_reduce(x, engine="reference")
    assert bits(torch.as_tensor(got)).tolist() == bits(torch.as_tensor(want)).tolist()


@pytest.mark.clause("fold-order")
@pytest.mark.parametrize("layout", ["permuted", "expanded-rows", "expanded-trailing"])
def test_layouts_without_one_element_stride_take_the_batched_path(layout: str) -> None:
    x = UNUSUAL_LAYOUTS[layout](torch.float32)
    with pytest.MonkeyPatch.context() as patch:
        calls = kernel_calls(patch)
        got = ring_all_reduce(x, engine="fast")
    assert calls == []
    assert same_bits(got, ring_fold(x))


def half_ulp_ring(n: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Each chunk's first worker (worker ``c`` for chunk ``c``) holds ``s``, every other ``s * 2**-p``.

    ``2**-p`` is half an ulp of 1 (``p`` the dtype's precision) and ``s = ±2**e``:
    in ring order every addition is a tie that rounds back to ``s`` (even), so
    the result is ``s``; adding any two small terms first makes a whole ulp
    that survives.
    """
    generator = torch.Generator().manual_seed(seed)
    precision = {torch.float32: 24, torch.float64: 53}[dtype]
    signs = torch.randint(0, 2, (n * k,), generator=generator).to(torch.float64) * 2 - 1
    scale = signs * 2.0 ** torch.randint(-30, 31, (n * k,), generator=generator).to(torch.float64)
    owner = torch.arange(n * k) // k  # the chunk of each element, whose fold starts at that worker
    first = torch.arange(n)[:, None] == owner[None, :]
    return torch.where(first, scale, scale * 2.0**-precision).to(dtype)


def right_fold(terms: list[torch.Tensor]) -> torch.Tensor:
    """``t0 + (t1 + (t2 + ...))``: the ring's terms, reassociated from the right."""
    acc = terms[-1]
    for t in reversed(terms[:-1]):
        acc = t + acc
    return acc


@pytest.mark.clause("fold-order", "engines-same-bits")
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize(("n", "k"), [(4, 3), (5, 1), (8, 7), (33, 2)])
@pytest.mark.parametrize("tile_bytes", [16 << 10, 8])
@pytest.mark.parametrize("kind", ["torch", "numpy", "transposed"])
def test_kernel_rounds_where_reassociation_would_not(
    dtype: torch.dtype, n: int, k: int, tile_bytes: int, kind: str
) -> None:
    """Inputs on which a reassociated, tree-shaped or once-rounded sum differs from the ring in every element.

    The fast engine must still give the reference's bits; the alternatives,
    computed here independently, show that the inputs can tell them apart.
    ``tile_bytes = 8`` cuts every chunk into column tiles (the one-chunk path),
    the default batches whole chunks (the row-streaming path).
    """
    x = half_ulp_ring(n, k, dtype, seed=n * k)
    if kind == "transposed":
        x = x.T.contiguous().T  # worker axis innermost: the kernel's any-strides specialisation
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_kernel, "TILE_BYTES", tile_bytes)
        got = fast_on(x, "numpy" if kind == "numpy" else "torch")
    want = ring_all_reduce(x, engine="reference")
    assert same_bits(got, want)
    assert same_bits(want, ring_fold(x))
    chunks = [
        [x[(c + j) % n, c * k : (c + 1) * k] for j in range(n)] for c in range(n)
    ]  # each chunk's terms in ring order
    reassociated = torch.cat([right_fold(terms) for terms in chunks])
    tree = torch.cat([pairwise_tree(terms) for terms in chunks])
    once = torch.tensor([float(v) for v in exact_sum(x)], dtype=torch.float64).to(dtype)  # exact in float64
    for other in (reassociated, tree, once):
        assert bool((bits(other) != bits(want)).all())


COMBINES = {"sum": "fadd", "prod": "fmul", "max": "fcmp ogt", "min": "fcmp olt"}
"""The instruction of each op's combine: ``max`` keeps ``own`` only if ``own > incoming`` (ordered), ``min``
only if ``own < incoming``."""


@pytest.mark.clause("fold-order", "op-prod", "op-max", "op-min")
@pytest.mark.parametrize("op", list(COMBINES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kernel_machine_code_combines_in_the_dtype_without_fast_math(dtype: str, op: str) -> None:
    """The compiled kernel's LLVM IR: every floating-point instruction is plain IEEE (no fast-math flags)
    in the input type.

    No flag allows reassociation, contraction or ignoring signed zeros and
    NaNs, no wider type carries a partial result, no fused multiply-add and no
    ``maxnum``/``minnum`` (whose ties are not the spec's) exists; the vector
    combines are the element loops (independent folds side by side).
    """
    ir = _kernel.optimised_ir(dtype, unit_stride=True, op=op)
    scalar = {"float32": "float", "float64": "double"}[dtype]
    kinds = r"<\d+ x (?:float|double|half|bfloat)>|float|double|half|bfloat"
    instructions = re.findall(rf"= (fadd|fsub|fmul|fdiv|frem|fcmp) ((?:[a-z]+ )*)({kinds}) ", ir)
    flags = [words.split()[:-1] if name == "fcmp" else words.split() for name, words, _ in instructions]
    assert flags and all(f == [] for f in flags)  # (an fcmp's last word is its predicate)
    assert {re.sub(r"<\d+ x (\w+)>", r"\1", t) for *_, t in instructions} == {scalar}
    combines = [t for name, words, t in instructions if f"{name} {words}".startswith(COMBINES[op])]
    assert any(t.startswith("<") for t in combines)
    assert not re.search(r"fmuladd|llvm\.fma|\bfpext\b|\bfptrunc\b|llvm\.(?:max|min)(?:num|imum)", ir)
    assert not any(re.search(rf"= {c} ", ir) for o, c in COMBINES.items() if o != op)


@pytest.mark.clause("fold-order")
def test_kernel_compiles_without_a_writable_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where no cache directory can be written, the kernel is compiled in memory instead; where one can,
    it is saved there and a later process (here: a fresh table of kernels) loads it."""
    blocked = tmp_path / "file"
    blocked.write_text("")  # a directory cannot be made inside a file
    monkeypatch.setattr(_kernel, "cache_dirs", lambda: [blocked / "cache"])
    monkeypatch.setattr(_kernel, "_kernels", {})
    x = half_ulp_ring(4, 3, torch.float64, seed=1)
    out = np.empty(12)
    cycle = _fast.plan(4).cycle
    transposed = x.T.contiguous().T.numpy()  # element stride 4: the any-stride kernel
    assert _kernel.fold_chunks(transposed, out, cycle.order, cycle.entries, chunk_size=3, threads=1)
    assert same_bits(torch.from_numpy(out), ring_fold(x))
    assert list(_kernel._kernels) == [("float64", False, "sum")]
    assert _kernel._kernels["float64", False, "sum"][1:] == (None, False)  # in memory, compiled now
    monkeypatch.setattr(_kernel, "cache_dirs", lambda: [tmp_path / "cache"])
    for loaded in (False, True):
        monkeypatch.setattr(_kernel, "_kernels", {})
        compiled = _kernel.kernel("float64", False, "sum")
        assert compiled.loaded is loaded and compiled.path is not None
        assert compiled.path.parent == tmp_path / "cache"
    assert compiled.path is not None
    compiled.path.write_bytes(compiled.path.read_bytes()[:-1])  # damaged: compiled again, not loaded
    monkeypatch.setattr(_kernel, "_kernels", {})
    assert not _kernel.kernel("float64", False, "sum").loaded


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
    order = plan_fold_orders(n)
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


@pytest.mark.clause("no-shortcut", "rs-send-chunk")
def test_plan_for_4096_workers_is_the_ring() -> None:
    """The plan at N = 4096 (compiled in bulk), against the spec's closed form typed in here."""
    n = 4096
    p = _fast.plan(n)
    assert p.cycle.order.tolist() == list(range(n))
    assert p.cycle.entries.tolist() == [[0, n, 0]]
    expected = [
        (
            _fast.Add(0, n - 1 - r, r + 1, 0 if r == 0 else None),
            _fast.Add(n - 1 - r, n, r + 1 - n, 0 if r == 0 else None),
        )
        for r in range(n - 1)
    ]
    assert list(p.rounds) == expected


def reversed_ring(patch: pytest.MonkeyPatch) -> None:
    """The ring run the other way: worker i sends to i - 1, so chunk c's fold is c, c-1, ..., c+1."""
    patch.setattr(schedule, "right", lambda i, n: (i - 1) % n)
    patch.setattr(schedule, "rs_send_chunk", lambda i, r, n: (i + r) % n)
    patch.setattr(schedule, "ag_send_chunk", lambda i, r, n: (i - 1 + r) % n)


@pytest.mark.clause("rs-send-chunk", "ag-send-chunk", "no-shortcut")
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 16, 33])
@pytest.mark.parametrize("ring", ["spec", "shifted", "reversed"])
def test_plan_in_bulk_equals_the_send_by_send_walk(n: int, ring: str) -> None:
    with pytest.MonkeyPatch.context() as patch:
        {"spec": lambda p: None, "shifted": shifted_ring, "reversed": reversed_ring}[ring](patch)
        bulk = _plan._reduce_scatter_in_bulk(n)
        rounds, owners = _plan._reduce_scatter_walk(n)
        assert bulk is not None
        assert bulk[0] == rounds
        assert bulk[1].tolist() == owners.tolist()
        assert _plan._all_gather_in_bulk(n, owners)
        _plan._all_gather_walk(n, owners)


@pytest.mark.clause("rs-send-chunk", "fold-order")
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_fast_engine_follows_a_reversed_ring(dtype: torch.dtype) -> None:
    """A cycle other than 0 -> 1 -> ... reaches the kernel (and the batched path) through the plan."""
    n, k = 5, 3
    x = (torch.randn(n, k * n, dtype=torch.float64) * 1e3).to(dtype)
    with pytest.MonkeyPatch.context() as patch:
        reversed_ring(patch)
        got = ring_all_reduce(x, engine="fast")
    want = []
    for c in range(n):
        acc = x[c, c * k : (c + 1) * k]
        for j in range(1, n):
            acc = acc + x[(c - j) % n, c * k : (c + 1) * k]
        want.append(acc)
    assert same_bits(got, torch.cat(want))


def program_folds(cycle: _fast.Cycle, k: int, chunks: int, cols: int) -> dict[tuple[int, int], list[int]]:
    """Per chunk and column, the workers the kernel's program combines into it, in order (tile by tile)."""
    steps, tiles = _kernel.program(cycle.order, cycle.entries, k, chunks, cols)
    folds: dict[tuple[int, int], list[int]] = {}
    for s_lo, s_hi, e0, ee, *_ in tiles.tolist():
        for count, a, b, *workers in steps[s_lo:s_hi].tolist():
            for c in range(a, b + 1):
                for e in range(e0, ee):
                    folds.setdefault((c, e), []).extend(workers[: abs(count)])
    return folds


@pytest.mark.clause("schedule-fast-engine", "schedule-fold-order")
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize(("k", "chunks", "cols"), [(1, 8, 1), (2, 3, 2), (3, 1, 2), (1, 1, 1)])
def test_the_kernels_program_folds_every_ring_of_the_family_in_its_order(
    n: int, k: int, chunks: int, cols: int
) -> None:
    """Both directions, every offset, blocks of chunks and column tiles: each element's workers, read off
    the program, are ``c + k, c + k + d, ...``."""
    for direction in (1, -1):
        for offset in range(-1, n + 1):
            cycle = _fast.plan(n, RingSchedule(direction, offset, "even")).cycle
            folds = program_folds(cycle, k, chunks, cols)
            assert set(folds) == {(c, e) for c in range(n) for e in range(k)}
            for (c, _), workers in folds.items():
                assert workers == [(c + offset + j * direction) % n for j in range(n)], (direction, offset, c)


@pytest.mark.clause("schedule-fast-engine")
@pytest.mark.parametrize("direction", [1, -1])
def test_the_kernel_streams_a_ring_of_either_direction_in_as_few_steps_as_the_spec_ring(
    direction: int,
) -> None:
    """A ring's chunks are at most two runs entering the cycle one step apart, up or down, so the kernel's
    program reads each worker's row once per pass over a block, as for the spec's ring (a ring of
    direction -1 was N runs of one chunk each: N^2 / 4 steps at N = 1024, 95 ms a call at N = M = 4096)."""
    n = 1024
    spec = _fast.plan(n).cycle
    spec_steps = len(_kernel.program(spec.order, spec.entries, 1, n, 1)[0])
    assert spec_steps == 2 * n - 1
    for offset in (0, -1, 5, n - 1):
        cycle = _fast.plan(n, RingSchedule(direction, offset, "even")).cycle
        assert len(cycle.entries) <= 2
        for chunks in (n, 100):
            steps = _kernel.program(cycle.order, cycle.entries, 1, chunks, 1)[0]
            blocks = -(-n // chunks)
            assert len(steps) <= 2 * blocks * spec_steps, (offset, chunks)


@pytest.mark.clause("schedule-fast-engine", "schedule-fold-order")
@pytest.mark.parametrize("op", ["sum", "max", "prod"])
@pytest.mark.parametrize(("n", "k"), [(33, 3), (7, 200)])
def test_a_ring_of_direction_minus_one_in_small_tiles_on_threads_is_its_fold(n: int, k: int, op: str) -> None:
    """Blocks that cut a mirrored run, columns cut into tiles, several threads: the bits of the fold
    ``c + k, c + k - 1, ...`` written out in ``tests/common/oracles.py``."""
    x = (torch.randn(n, n * k, dtype=torch.float64, generator=torch.Generator().manual_seed(n)) * 1e3).to(
        torch.float32
    )
    for offset in (0, -1, 4):
        ring = RingSchedule(-1, offset, "even")
        got, array = fast_in_small_tiles(x, 64, 3, op, ring)
        want = ring_fold_op(x, op, -1, offset)
        assert same_bits(got, want), offset
        assert same_bits(array, want), offset


@pytest.mark.clause("schedule-fast-engine", "schedule-fold-order")
@pytest.mark.parametrize(
    ("n", "shape", "copied"),
    [
        (32, (32,), False),  # chunks of 2 elements, then 16 empty ones
        (32, (65,), True),  # 16 chunks of 4 and one of 1: the input padded to 68 columns
        (32, (200,), False),  # 25 chunks of 8, 7 empty
        (6, (7, 3), True),  # trailing dimensions: 21 elements per worker, 5 chunks of 4 and one of 1
        (4096, (4096,), False),  # gloo's order at N = 4096 as reveal probes it: 2048 chunks of 2
    ],
)
def test_the_gloo_layout_is_folded_in_place_without_its_empty_chunks(
    n: int, shape: tuple[int, ...], copied: bool
) -> None:
    """gloo's layout puts every element in its own column of equal chunks: the kernel reads the input
    itself (or, with a short last chunk, a copy padded to that chunk's end, not to N chunks)."""
    x = torch.randn(n, *shape, generator=torch.Generator().manual_seed(n))
    length = x[0].numel()
    bounds = gloo_bounds(n, length, 4)
    k = max(hi - lo for lo, hi in bounds)
    seen: list[npt.NDArray[Any]] = []
    fold = _kernel.fold_chunks

    def recorded(x2d: npt.NDArray[Any], *args: Any, **kwargs: Any) -> bool:
        seen.append(x2d)
        return fold(x2d, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_kernel, "fold_chunks", recorded)
        got = ring_all_reduce(x, engine="fast", schedule="gloo")
        array = ring_all_reduce(x.numpy(), engine="fast", schedule="gloo")
    assert [a.shape for a in seen] == [(n, -(-length // k) * k)] * 2
    assert [np.shares_memory(a, x.numpy()) for a in seen] == [not copied] * 2
    want = schedule_fold(x, -1, -1, bounds) if n <= 32 else schedule_fold_by_worker(x, -1, -1, bounds)
    assert same_bits(got, want)
    assert same_bits(torch.from_numpy(array), want)


@pytest.mark.clause("schedule-fast-engine", "schedule-fold-order")
@pytest.mark.parametrize("offset", [0, 1])
def test_a_ring_of_direction_minus_one_at_4096_workers_is_its_fold(offset: int) -> None:
    """N = M = 4096, as ``reveal`` probes gloo's order there: the bits of the fold ``c + k, c + k - 1,
    ...``."""
    n = 4096
    x = torch.randn(n, n, generator=torch.Generator().manual_seed(offset))
    got = ring_all_reduce(x, engine="fast", schedule=RingSchedule(-1, offset, "even"))
    assert same_bits(got, schedule_fold_by_worker(x, -1, offset, [(c, c + 1) for c in range(n)]))


@pytest.mark.clause("ag-copy-not-add")
def test_an_all_gather_off_the_usual_shape_is_checked_send_by_send() -> None:
    """Worker 0 re-sends the chunk it owns in round 1 (allowed: it is complete); worker 0 still gets all."""
    n = 3
    spec_ag = schedule.ag_send_chunk
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            schedule,
            "ag_send_chunk",
            lambda i, r, n: schedule.owned_chunk(0, n) if (i, r) == (0, 1) else spec_ag(i, r, n),
        )
        owners = _plan._reduce_scatter_in_bulk(n)
        assert owners is not None
        assert not _plan._all_gather_in_bulk(n, owners[1])
        x = torch.randn(n, 2 * n, dtype=torch.float64)
        assert same_bits(ring_all_reduce(x, engine="fast"), ring_fold(x))


@pytest.mark.clause("autograd")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("ring", "shape"), [("spec", (4, 8)), ("gloo", (4, 8)), ("gloo", (4, 9)), ("openmpi-ring", (4, 3, 2))]
)
def test_fast_result_under_autograd_takes_in_place_operations(
    dtype: torch.dtype, ring: str, shape: tuple[int, ...]
) -> None:
    """Uneven layouts too: their result is the array the fold wrote, not a view of a longer one."""
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    y = ring_all_reduce(x, engine="fast", schedule=ring)
    y.mul_(2)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert same_bits(grad, torch.full_like(x, 2.0))


def _ones_jacobian(n: int, m: int) -> torch.Tensor:
    """d result[j] / d x[w, i]: 1 where i == j, for every worker ``w``."""
    return torch.eye(m, dtype=torch.float64)[:, None, :].expand(m, n, m)


FUNC_TRANSFORMS: dict[str, Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], Any]] = {
    "grad": lambda f, x: torch.func.grad(lambda t: f(t).sum())(x),
    "vmap": lambda f, x: torch.func.vmap(f)(torch.stack([x, 2 * x])),
    "vmap-dim-1": lambda f, x: torch.func.vmap(f, in_dims=1)(torch.stack([x, 2 * x], 1)),
    "jvp": lambda f, x: torch.func.jvp(f, (x,), (x.flip(1),)),
    "jacrev": lambda f, x: torch.func.jacrev(f)(x),
    "jacfwd": lambda f, x: torch.func.jacfwd(f)(x),
    "vmap-grad": lambda f, x: torch.func.vmap(torch.func.grad(lambda t: f(t).sum()))(torch.stack([x, 2 * x])),
    "hessian": lambda f, x: torch.func.hessian(lambda t: (f(t) ** 2).sum())(x),
}


@pytest.mark.clause("autograd")
@pytest.mark.parametrize("transform", list(FUNC_TRANSFORMS))
def test_fast_engine_under_torch_func_transforms(transform: str) -> None:
    """Against closed forms: the ring fold per example, the ones gradient, the identity Jacobians."""
    n, m = 4, 8
    x = torch.randn(n, m, dtype=torch.float64) * 1e3
    got = FUNC_TRANSFORMS[transform](lambda t: ring_all_reduce(t, engine="fast"), x)
    ones = torch.ones(n, m, dtype=torch.float64)
    want: Any = {
        "grad": ones,
        "vmap": torch.stack([ring_fold(x), ring_fold(2 * x)]),
        "vmap-dim-1": torch.stack([ring_fold(x), ring_fold(2 * x)]),
        "jvp": (ring_fold(x), ring_fold(x.flip(1))),
        "jacrev": _ones_jacobian(n, m),
        "jacfwd": _ones_jacobian(n, m),
        "vmap-grad": torch.stack([ones, ones]),
        # d^2 / dx[w, i] dx[v, j] of sum_j (sum_w x[w, j])^2: 2 where i == j, for every pair of workers.
        "hessian": 2 * torch.eye(m, dtype=torch.float64)[None, :, None, :].expand(n, m, n, m),
    }[transform]
    pairs = list(zip(got, want, strict=True)) if isinstance(want, tuple) else [(got, want)]
    for a, b in pairs:
        assert same_bits(a, b.contiguous())


@pytest.mark.clause("bad-input")
def test_fast_engine_under_vmap_rejects_non_finite_input() -> None:
    x = torch.ones(2, 4, 8)
    x[1, 0, 3] = float("nan")
    with pytest.raises(ValueError, match="must be finite"):
        torch.func.vmap(lambda t: ring_all_reduce(t, engine="fast"))(x)


@pytest.mark.clause("engines-same-bits", "input-unchanged")
@pytest.mark.parametrize("mode", ["r+", "r"])
def test_fast_engine_reads_a_memmap_like_a_plain_array(tmp_path: Path, mode: Any) -> None:
    path = tmp_path / "workers.f32"
    values = half_ulp_ring(4, 5, torch.float32, seed=7).numpy()
    values.tofile(path)
    x = np.memmap(path, dtype=np.float32, mode=mode, shape=values.shape)
    got = ring_all_reduce(x, engine="fast")
    assert type(got) is np.ndarray
    assert got.tobytes() == ring_all_reduce(x, engine="reference").tobytes()
    assert np.asarray(x).tobytes() == values.tobytes()


@pytest.mark.clause("bad-input")
def test_fast_engine_refuses_non_native_byte_order_like_the_reference() -> None:
    x = np.ones((2, 4), dtype=np.dtype(np.float32).newbyteorder("S"))
    for engine in ("reference", "fast"):
        with pytest.raises(TypeError, match="byte order"):
            ring_all_reduce(x, engine=engine)


# ==========================================================================================================
# The fast engine (``ring_ref._fast``) on small inputs: quick per call (``make mutation``'s tests for it).
#
# Bits are compared with the reference engine (every op, dtype, layout, ring and
# path: the compiled kernel and the batched path with tiles of any size),
# finiteness errors with the reference's exact message, the plan's faults with a
# send-by-send walk written here from the spec's rules (the first bad send of
# the first bad round, its wording as the fast engine's docstrings give it), and
# derivatives with the reference's or the documented refusal.
# ==========================================================================================================


OPS = ("sum", "prod", "max", "min", "avg")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
RINGS = [
    *(ring for ring in PRESETS.values() if isinstance(ring, RingSchedule)),
    RingSchedule(-1, 2, "even"),
    RingSchedule(1, 3, "blocks"),
    RingSchedule(-1, 1, "gloo"),
]


def values(
    n: int, m: int, dtype: torch.dtype, op: str, *, seed: int, trailing: tuple[int, ...] = ()
) -> torch.Tensor:
    """Values whose result depends on the order of the combines (ties of signed zeros for max/min)."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, m, *trailing)
    if op in ("sum", "avg"):
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(
            -8, 8, shape, generator=g
        )
    elif op == "prod":
        x = 1 + torch.randn(shape, generator=g, dtype=torch.float64) / 7
    else:
        x = torch.tensor([-0.0, 0.0, 1.0, -1.0, 0.5], dtype=torch.float64)[
            torch.randint(0, 5, shape, generator=g)
        ]
    return x.to(dtype)


def outcome(x: Any, engine: str, op: str, ring: RingSchedule | str = "spec") -> Any:
    try:
        return ring_all_reduce(x, engine=engine, op=op, schedule=ring)  # type: ignore[call-overload]
    except (ValueError, TypeError, InvariantViolation) as error:
        return error


def as_tensor(y: Any) -> torch.Tensor:
    return y if isinstance(y, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(y))


def assert_same(x: Any, op: str, ring: RingSchedule | str = "spec") -> None:
    """Both engines give the same bits and result type, or raise the same error with the same message."""
    want = outcome(x, "reference", op, ring)
    got = outcome(x, "fast", op, ring)
    if isinstance(want, Exception):
        assert type(got) is type(want) and str(got) == str(want), (got, want)
        return
    assert not isinstance(got, Exception), got
    assert type(got) is type(want)
    assert same_bits(as_tensor(got), as_tensor(want)), (op, ring)


def views(x: torch.Tensor) -> dict[str, Any]:
    """The same values in layouts that take different paths (kernel, batched), torch and numpy."""
    out: dict[str, Any] = {
        "contiguous": x,
        "transposed": x.transpose(0, 1).contiguous().transpose(0, 1),
        "sliced": torch.cat([x, x], dim=1)[:, : x.shape[1]] if x.dim() == 2 else x,
        "permuted": torch.stack([x, -x], dim=0).movedim(0, -1)[..., 0],
        "strided-trailing": torch.stack([x, x], dim=-1)[..., 0],
    }
    if x.dtype in (torch.float16, torch.float32, torch.float64):
        a = x.numpy()
        out["numpy"] = a
        out["numpy-reversed"] = np.ascontiguousarray(a[::-1])[::-1]
        out["numpy-fortran"] = np.asfortranarray(a)
        raw = np.zeros(a.nbytes + 1, dtype=np.uint8)[1:].view(a.dtype)  # not aligned
        unaligned = raw.reshape(a.shape)
        unaligned[...] = a
        out["numpy-unaligned"] = unaligned
        swapped = a.astype(a.dtype.newbyteorder(">"))
        out["numpy-big-endian"] = swapped
    return out


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("op-prod", "op-max", "op-min", "op-avg", "fold-order")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_every_op_dtype_and_layout_equals_the_reference(dtype: torch.dtype, op: str) -> None:
    for n, k, trailing in [(1, 2, ()), (2, 1, ()), (3, 2, (2,)), (5, 3, ())]:
        x = values(n, n * k, dtype, op, seed=n)
        if trailing:
            x = values(n, n * k, dtype, op, seed=n, trailing=trailing)
        for view in views(x).values():
            assert_same(view, op)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("schedule-fold-order", "schedule-layouts")
@pytest.mark.parametrize("ring", RINGS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_every_ring_and_layout_of_chunks_equals_the_reference(ring: RingSchedule, dtype: torch.dtype) -> None:
    for op in OPS:
        for n, size in [(1, 3), (2, 4), (3, 7), (4, 4), (5, 11)]:
            m = n * (size // n + 1) if ring.layout == "even" else size
            x = values(n, m, dtype, op, seed=m)
            assert_same(x, op, ring)
            if dtype != torch.bfloat16:
                assert_same(x.numpy(), op, ring)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("budget", [1, 3, 16, 50])
def test_batched_tiles_of_any_size_give_the_same_bits(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, budget: int
) -> None:
    """Tiny tiles on the batched path (float16, bfloat16, layouts the kernel cannot address, numpy)."""
    monkeypatch.setattr(_forward, "TILE_BYTES", budget)
    monkeypatch.setattr(_forward, "NUMPY_TILE_BYTES", budget)
    for op in OPS:
        for n, k in [(2, 3), (3, 4), (5, 2)]:
            x = values(n, n * k, dtype, op, seed=k, trailing=(2,))
            for name, view in views(x).items():
                if (
                    name in ("permuted", "strided-trailing", "numpy-unaligned", "numpy-fortran")
                    or name == "contiguous"
                ):
                    assert_same(view, op)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("bad-input", "input-finite")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(
    ("ring", "m"),
    [
        ("spec", 6),
        ("chain", 7),  # the kernel folds 6 elements, the 7th is the tail after them
        ("recursive-doubling", 6),
        ("gloo", 7),  # unequal chunks, padded to equal ones
    ],
)
def test_non_finite_input_is_refused_like_the_reference_wherever_it_is(
    dtype: torch.dtype, op: str, ring: str, m: int
) -> None:
    """Wherever it is, and whatever the op: a finite min or max does not prove a finite input."""
    n = 3
    base = values(n, m, dtype, op, seed=4)
    for bad in (float("nan"), float("inf"), float("-inf")):
        for w, e in [(0, 0), (1, 3), (2, m - 1)]:
            x = base.clone()
            x[w, e] = bad
            for name, view in views(x).items():
                if name != "numpy-big-endian":
                    got = outcome(view, "fast", op, ring)
                    assert isinstance(got, ValueError), (name, bad, w, e)
                    assert str(got) == str(outcome(view, "reference", op, ring)), name


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("input-finite")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "prod", "avg"])
def test_overflow_is_the_rounded_result_not_an_error(dtype: torch.dtype, op: str) -> None:
    big = torch.finfo(dtype).max
    with warnings.catch_warnings():  # numpy's overflow warnings are not the fast engine's to give
        warnings.simplefilter("error")
        for view in views(torch.full((2, 2), big, dtype=dtype)).values():
            if isinstance(view, np.ndarray) and view.dtype.isnative:
                ring_all_reduce(view, engine="fast", op=op)
    x = torch.full((3, 3), big, dtype=dtype)
    x[1, 1] = -big  # a finite total, an overflowing partial in some chunks
    for view in views(x).values():
        assert_same(view, op)
    y = torch.full((2, 2), big / 2, dtype=dtype)  # sums exactly to max: finite, on the edge
    for view in views(y).values():
        assert_same(view, op)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("input-finite")
def test_a_finite_sum_whose_check_overflows_is_not_refused() -> None:
    """The check's own reduction overflows (a false alarm): the exact scan then finds nothing to refuse."""
    big = torch.finfo(torch.float32).max
    x = torch.tensor([[big, big], [-big / 2, big]], dtype=torch.float32)
    for view in views(x).values():
        assert_same(view, "sum")
        assert_same(view, "max")


# --- the plan ----------------------------------------------------------------------------------------


def walk(  # noqa: PLR0911, PLR0912 - one rule after another, as the spec orders them
    n: int,
    right: Callable[[int], int],
    rs: Callable[[int, int], int],
    ag: Callable[[int, int], int],
    rounds: int,
) -> str | None:
    """The first fault of a schedule, simulated send by send (each round simultaneous), in the engine's
    words; ``None`` when reduce-scatter leaves every chunk complete at one worker and all-gather delivers
    every completed chunk to worker 0 forwarding only completed ones."""
    dst = [right(i) for i in range(n)]
    for i, d in enumerate(dst):
        if not 0 <= d < n:
            return f"right(i): worker {i} gets {d}, not one of 0 .. {n - 1}"
    holder: list[int | None] = [None] * n
    folded: list[set[int]] = [set() for _ in range(n)]
    for r in range(rounds):
        sent = [rs(i, r) for i in range(n)]
        for i, c in enumerate(sent):
            if not 0 <= c < n:
                return (
                    f"reduce-scatter round {r}: the chunk sent: worker {i} gets {c}, not one of 0 .. {n - 1}"
                )
        for i, c in enumerate(sent):
            where = f"reduce-scatter round {r}: worker {i} sends chunk {c} to worker {dst[i]}, "
            if c in sent[:i]:
                return where + "but that chunk is already in flight this round"
            if holder[c] is not None and holder[c] != i:
                return where + f"but its partial sum is at worker {holder[c]}"
            if dst[i] in folded[c] or (holder[c] is None and dst[i] == i):
                return where + "whose partial sum already holds the receiver's contribution"
        for i, c in enumerate(sent):
            if holder[c] is None:
                folded[c].add(i)
            folded[c].add(dst[i])
            holder[c] = dst[i]
    if n > 1:
        for c in range(n):
            if holder[c] is None or len(folded[c]) != n:
                return f"after reduce-scatter chunk {c} is not complete at any worker"
    complete = {(0 if holder[c] is None else holder[c], c) for c in range(n)}
    for r in range(rounds):
        sent = [ag(i, r) for i in range(n)]
        for i, c in enumerate(sent):
            if not 0 <= c < n:
                return f"all-gather round {r}: the chunk sent: worker {i} gets {c}, not one of 0 .. {n - 1}"
        for i, c in enumerate(sent):
            if (i, c) not in complete:
                return f"all-gather round {r}: worker {i} forwards incomplete chunk {c}"
        complete |= {(dst[i], c) for i, c in enumerate(sent)}
    missing = [c for c in range(n) if (0, c) not in complete]
    return f"after all-gather worker 0 lacks completed chunks {missing}" if missing else None


def at(table: npt.NDArray[np.int64]) -> Callable[[int, int], int]:
    """``f(i, r)``: the table's entry for sender ``i`` in round ``r``."""
    return lambda i, r: int(table[r, i])


def table_function(table: npt.NDArray[np.int64]) -> Callable[..., Any]:
    """``send_chunk(i, r, n)`` reading a table, for integers and index arrays alike."""
    return lambda i, r, n: table[r, i] + 0 * n


def spec_tables(n: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    count = schedule.rounds_per_phase(n)
    rs = np.array([[schedule.rs_send_chunk(i, r, n) for i in range(n)] for r in range(count)], dtype=np.int64)
    ag = np.array([[schedule.ag_send_chunk(i, r, n) for i in range(n)] for r in range(count)], dtype=np.int64)
    return rs.reshape(count, n), ag.reshape(count, n)


def run_patched(
    monkeypatch: pytest.MonkeyPatch, n: int, *, rs: Any, ag: Any, right: Any, rounds: int, x: torch.Tensor
) -> Any:
    monkeypatch.setattr(schedule, "rs_send_chunk", rs)
    monkeypatch.setattr(schedule, "ag_send_chunk", ag)
    monkeypatch.setattr(schedule, "right", right)
    monkeypatch.setattr(schedule, "rounds_per_phase", lambda _n: rounds)
    _fast.plan.cache_clear()
    try:
        return ring_all_reduce(x, engine="fast")
    except InvariantViolation as error:
        return error
    finally:
        monkeypatch.undo()
        _fast.plan.cache_clear()


def fold_along(
    x: torch.Tensor, n: int, rs: npt.NDArray[np.int64], right: Callable[[int], int]
) -> torch.Tensor:
    """The result of a sound reduce-scatter: each chunk folded along its sends, from its first sender."""
    k = x.shape[1] // n
    pieces = []
    for c in range(n):
        r0 = min(r for r in range(rs.shape[0]) if c in rs[r].tolist())
        i = rs[r0].tolist().index(c)
        acc = x[i, c * k : (c + 1) * k]
        for _ in range(rs.shape[0]):
            i = right(i)
            acc = acc + x[i, c * k : (c + 1) * k]
        pieces.append(acc)
    return torch.cat(pieces)


def assert_first_fault_or_fold(  # noqa: PLR0917 (a planted ring, told in full)
    monkeypatch: pytest.MonkeyPatch,
    x: torch.Tensor,
    rs: npt.NDArray[np.int64],
    ag: npt.NDArray[np.int64],
    right: Callable[..., Any],
    right_of: Callable[[int], int],
) -> None:
    """Run the plan with the send tables ``rs``, ``ag`` and neighbour ``right`` planted: it raises the
    first fault that :func:`walk` finds, word for word, or (no fault) gives the fold along the ring."""
    n, count = x.shape[0], rs.shape[0]
    want = walk(n, right_of, at(rs), at(ag), count)
    with monkeypatch.context() as patch:
        got = run_patched(
            patch, n, rs=table_function(rs), ag=table_function(ag), right=right, rounds=count, x=x
        )
    if want is None:
        assert not isinstance(got, Exception), got
        assert same_bits(got, fold_along(x, n, rs, right_of))
    else:
        assert isinstance(got, InvariantViolation) and str(got) == want, (str(got), want)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause(
    "rs-send-chunk", "ag-send-chunk", "rs-add", "ag-copy-not-add", "round-count", "no-shortcut"
)
@pytest.mark.parametrize("n", [2, 3, 4, 5])
@pytest.mark.parametrize("block", [1 << 20, 1])
def test_a_schedule_with_one_send_changed_is_refused_at_its_first_fault(
    monkeypatch: pytest.MonkeyPatch, n: int, block: int
) -> None:
    monkeypatch.setattr(_plan, "BLOCK_ENTRIES", block)  # 1: one round per block
    rng = np.random.default_rng(n)
    x = values(n, 2 * n, torch.float64, "sum", seed=n)
    rs0, ag0 = spec_tables(n)
    count = rs0.shape[0]
    cases = []
    for r in range(count):
        for i in range(n):
            for c in sorted({int(rng.integers(0, n)), -1, n}):
                for phase in ("rs", "ag"):
                    rs, ag = rs0.copy(), ag0.copy()
                    (rs if phase == "rs" else ag)[r, i] = c
                    cases.append((rs, ag))
    for rs, ag in cases:
        assert_first_fault_or_fold(monkeypatch, x, rs, ag, schedule.right, lambda i: (i + 1) % n)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("ring-topology", "round-count")
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_a_broken_ring_or_round_count_is_refused_at_its_first_fault(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    x = values(n, n, torch.float64, "sum", seed=n)
    rs0, ag0 = spec_tables(n)
    count = rs0.shape[0]
    rights: list[Callable[..., Any]] = [
        lambda i, n: (i + 2) % n,  # two cycles for even n
        lambda i, n: i,  # to itself
        lambda i, n: (i + 1) % n + (i == n - 1) * n,  # out of range
        lambda i, n: -(i + 1) % n * (i != 0),  # worker 0 to itself
        lambda i, n: 0 * i + 1 % n,  # everybody to 1
    ]
    for right in rights:
        # another single cycle of the same shape is followed by the plan; any other is refused
        assert_first_fault_or_fold(
            monkeypatch, x, rs0, ag0, right, functools.partial(lambda i, f: int(f(i, n)), f=right)
        )
    for rounds in (count - 1, count + 1):  # too few, too many
        rs = np.concatenate([rs0, rs0])[: max(rounds, 0)] if rounds > 0 else rs0[:0]
        ag = np.concatenate([ag0, ag0])[: max(rounds, 0)] if rounds > 0 else ag0[:0]
        want = walk(n, lambda i: (i + 1) % n, at(rs), at(ag), rounds)
        with monkeypatch.context() as patch:
            got = run_patched(
                patch,
                n,
                rs=table_function(rs),
                ag=table_function(ag),
                right=schedule.right,
                rounds=rounds,
                x=x,
            )
        assert want is not None
        assert isinstance(got, InvariantViolation) and str(got) == want, (str(got), want)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("ag-copy-not-add")
@pytest.mark.parametrize("n", [3, 4, 5])
def test_an_all_gather_of_another_shape_is_checked_send_by_send(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """Worker 0 sends its own completed chunk again in a later round: allowed, worker 0 still gets all."""
    x = values(n, n, torch.float64, "sum", seed=n)
    rs0, ag0 = spec_tables(n)
    ag = ag0.copy()
    ag[1, 0] = schedule.owned_chunk(0, n)
    assert walk(n, lambda i: (i + 1) % n, at(rs0), at(ag), n - 1) is None or n > 3
    with monkeypatch.context() as patch:
        got = run_patched(
            patch, n, rs=table_function(rs0), ag=table_function(ag), right=schedule.right, rounds=n - 1, x=x
        )
    want = walk(n, lambda i: (i + 1) % n, at(rs0), at(ag), n - 1)
    if want is None:
        assert same_bits(got, fold_along(x, n, rs0, lambda i: (i + 1) % n))
    else:
        assert isinstance(got, InvariantViolation) and str(got) == want


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("rs-send-chunk")
@pytest.mark.parametrize("kind", ["integers-only", "floats", "wrong-on-arrays"])
def test_schedule_functions_that_do_not_take_arrays_are_called_per_send(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A schedule function written for integers only, or other values on arrays: the plan still follows it."""
    n = 5
    x = values(n, 2 * n, torch.float64, "sum", seed=9)

    def shifted(i: Any, r: Any, n: int) -> Any:  # chunk c's fold starts at c + 1
        if kind == "integers-only":
            return int((i - r - 1) % n)
        if kind == "floats":
            return (i - r - 1) % n + 0.0 * np.asarray(i)
        if isinstance(i, int):
            return (i - r - 1) % n
        wrong = (i - r - 1) % n  # on arrays: wrong at the middle worker of the last round only
        return np.where((i == n // 2) & (r == n - 2), 0, wrong)

    def shifted_ag(i: Any, r: Any, n: int) -> Any:
        return (i - r) % n

    with monkeypatch.context() as patch:
        got = run_patched(patch, n, rs=shifted, ag=shifted_ag, right=schedule.right, rounds=n - 1, x=x)
    rs = np.array([[(i - r - 1) % n for i in range(n)] for r in range(n - 1)])
    assert same_bits(got, fold_along(x, n, rs, lambda i: (i + 1) % n))


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("no-shortcut", "fold-order")
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 9])
def test_the_plan_adds_each_chunk_once_per_worker_in_ring_order(n: int) -> None:
    order = plan_fold_orders(n)
    assert len(_fast.plan(n).rounds) == max(0, n - 1)
    for c, workers in order.items():
        assert workers == ([] if n == 1 else [(c + j) % n for j in range(n)])
    cycle = _fast.plan(n).cycle
    assert cycle.order.tolist() == list(range(n)) and cycle.entries.tolist() == [[0, n, 0]]


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("schedule-fold-order")
@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
def test_the_cycle_of_every_ring_is_each_chunks_fold_order(n: int) -> None:
    for direction in (1, -1):
        for offset in range(-2, n + 1):
            ring = RingSchedule(direction, offset, "even")
            cycle = _fast.plan(n, ring).cycle
            assert cycle.order.dtype == cycle.entries.dtype == np.int64
            enter = {}  # chunk -> its entry position; a row with stop < start is a mirrored run
            for start, stop, p in cycle.entries.tolist():
                for j, c in enumerate(range(start, stop, 1 if start < stop else -1)):
                    enter[c] = p + j
                    got = [int(cycle.order[(p + j + s) % n]) for s in range(n)]
                    assert tuple(got) == ring.fold_order(c, n), (ring, c)
            assert sorted(enter) == list(range(n))
            assert len(cycle.entries) <= 2  # runs are maximal: a ring's entries step by one but at one wrap
            for start, stop, _ in cycle.entries.tolist()[:-1]:
                top = max(start, stop - 1)  # the run's last chunk; the next one would have extended it
                step = enter[top] - enter[top - 1] if abs(start - stop) > 1 else None
                assert enter[top + 1] - enter[top] not in ({step} if step else {1, -1})
            for adds in _fast.plan(n, ring).rounds:  # each round's additions: maximal runs of the chunks
                assert adds[0].start == 0 and adds[-1].stop == n
                for a, b in itertools.pairwise(adds):
                    assert a.stop == b.start and (a.own, a.incoming) != (b.own, b.incoming)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_element_stride() -> None:
    assert _fast.element_stride((4, 8, 3), (24, 3, 1)) == 1
    assert _fast.element_stride((4, 8, 3), (24, 1, 8)) is None
    assert _fast.element_stride((4, 1, 1), (1, 5, 7)) == 1  # no elements to step over
    assert _fast.element_stride((4, 8, 1), (1, 4, 9)) == 4  # size-1 dimensions do not count
    assert _fast.element_stride((4, 8), (8, -2)) == -2
    assert _fast.element_stride((4, 2, 3), (6, 0, 0)) == 0
    assert _fast.element_stride((4, 2, 3), (6, 3, -1)) is None
    assert _fast.element_stride((4, 2, 3, 5), (30, 15, 5, 1)) == 1
    assert _fast.element_stride((4, 2, 3, 5), (30, 16, 5, 1)) is None


# --- derivatives ------------------------------------------------------------------------------------


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("autograd")
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_gradients_and_tangents_equal_the_reference(op: str, dtype: torch.dtype) -> None:
    n = 3
    x = values(n, 2 * n, dtype, "sum", seed=2, trailing=(2,))
    seed = values(2 * n, 1, dtype, "sum", seed=3, trailing=(2,)).reshape(2 * n, 2)
    grads: list[tuple[Any, Any]] = []
    for engine in ("reference", "fast"):
        leaf = x.clone().requires_grad_(True)
        y = ring_all_reduce(leaf, engine=engine, op=op)
        assert y.requires_grad and y.dtype == dtype and y.shape == (2 * n, 2)
        y.backward(seed)  # type: ignore[no-untyped-call]
        assert leaf.grad is not None
        grads.append((y.detach(), leaf.grad))
    assert same_bits(grads[0][0], grads[1][0]) and same_bits(grads[0][1], grads[1][1])
    tangent = values(n, 2 * n, dtype, "sum", seed=5, trailing=(2,))
    results = []
    for engine in ("reference", "fast"):
        with forward_ad.dual_level():
            y = ring_all_reduce(forward_ad.make_dual(x, tangent), engine=engine, op=op)  # type: ignore[call-overload, no-untyped-call]
            primal, t = forward_ad.unpack_dual(y)  # type: ignore[no-untyped-call]
            results.append((primal.clone(), t.clone()))
    assert same_bits(results[0][0], results[1][0]) and same_bits(results[0][1], results[1][1])
    for engine in ("reference", "fast"):  # a graph that the result's in-place change does not break
        leaf = x.clone().requires_grad_(True)
        y = ring_all_reduce(leaf, engine=engine, op=op)  # type: ignore[call-overload]
        y.mul_(2).sum().backward()
        grads.append((y.detach(), leaf.grad))
    assert same_bits(grads[2][1], grads[3][1])


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("autograd")
@pytest.mark.parametrize("op", ["sum", "avg", "prod", "max", "min"])
def test_torch_func_transforms(op: str) -> None:
    n = 3
    x = values(n, n, torch.float64, op, seed=7, trailing=(2,))
    batch = values(4, n * n, torch.float64, op, seed=8, trailing=(2,)).reshape(4, n, n, 2)

    def fast(t: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(t, engine="fast", op=op)

    def reference(t: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(t, engine="reference", op=op)

    got = torch.func.vmap(fast)(batch)
    want = torch.stack([reference(b) for b in batch])
    assert same_bits(got, want)
    got1 = torch.func.vmap(fast, in_dims=3, out_dims=1)(batch.movedim(0, 3))
    assert same_bits(got1, want.movedim(0, 1))
    if op in ("sum", "avg"):
        assert same_bits(
            torch.func.grad(lambda t: fast(t).sum())(x), torch.func.grad(lambda t: reference(t).sum())(x)
        )
        assert same_bits(torch.func.jacrev(fast)(x), torch.func.jacrev(reference)(x))
        assert same_bits(torch.func.jacfwd(fast)(x), torch.func.jacfwd(reference)(x))
        g = torch.func.vmap(torch.func.grad(lambda t: fast(t).sum()))(batch)
        assert same_bits(g, torch.ones_like(batch) / (n if op == "avg" else 1))
        return
    for transform in (
        lambda: torch.func.grad(lambda t: fast(t).sum())(x),
        lambda: torch.func.jacrev(fast)(x),
        lambda: torch.func.jacfwd(fast)(x),
        lambda: torch.func.jvp(fast, (x,), (x,)),
        lambda: fast(x.clone().requires_grad_(True)),
    ):
        with pytest.raises(
            ValueError, match=rf"^engine='fast' differentiates op='sum' and op='avg' only; op='{op}' "
        ):
            transform()
    with forward_ad.dual_level(), pytest.raises(ValueError) as info:
        fast(forward_ad.make_dual(x, x))  # type: ignore[no-untyped-call]
    message = str(info.value)
    for piece in (
        "on a tensor that requires grad (or carries a forward-mode tangent, or is the input of",
        "torch.func.grad, jvp, jacrev, ...) runs on engine='reference' (the default), which records",
        "the ring's graph for every op; or detach the input, or call under torch.no_grad().",
    ):
        assert piece in message
    with torch.no_grad():
        assert same_bits(fast(x.clone().requires_grad_(True)), reference(x))
    assert same_bits(fast(x.clone().requires_grad_(True).detach()), reference(x))


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("bad-input", "autograd")
@pytest.mark.parametrize("op", OPS)
def test_non_finite_input_is_refused_under_every_transform(op: str) -> None:
    n = 3
    x = values(n, n, torch.float64, op, seed=1)
    x[1, 2] = float("nan")
    want = outcome(x, "reference", op)
    assert isinstance(want, ValueError)

    def fast(t: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(t, engine="fast", op=op)

    with pytest.raises(ValueError) as info:
        torch.func.vmap(fast)(x[None])
    assert str(info.value) == str(outcome(x[..., None], "reference", op))  # the batch: a trailing dimension
    if op in ("sum", "avg"):
        for transform in (
            lambda: fast(x.clone().requires_grad_(True)),
            lambda: torch.func.grad(lambda t: fast(t).sum())(x),
        ):
            with pytest.raises(ValueError) as info:
                transform()
            assert str(info.value) == str(want)
        with forward_ad.dual_level(), pytest.raises(ValueError) as info:
            fast(forward_ad.make_dual(x, torch.zeros_like(x)))  # type: ignore[no-untyped-call]
        assert str(info.value) == str(want)
        tangent = torch.zeros_like(x)
        tangent[0, 0] = float("inf")  # tangents are not inputs: not checked
        good = values(n, n, torch.float64, op, seed=1)
        with forward_ad.dual_level():
            y = fast(forward_ad.make_dual(good, tangent))  # type: ignore[no-untyped-call]
            assert not torch.isfinite(forward_ad.unpack_dual(y).tangent).all()  # type: ignore[no-untyped-call]


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("no-aliasing", "input-unchanged")
@pytest.mark.parametrize("n", [1, 3])
def test_the_result_is_new_and_the_input_unchanged(n: int) -> None:
    for dtype in DTYPES:
        x = values(n, 2 * n, dtype, "sum", seed=1)
        before = bits(x).clone()
        for name, view in views(x).items():
            if name == "numpy-big-endian":
                continue
            y = ring_all_reduce(view, engine="fast")
            if isinstance(y, torch.Tensor):
                assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
                assert y._base is None
            else:
                assert not np.shares_memory(y, view)
        assert torch.equal(bits(x), before)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("ring-topology", "rs-add")
@pytest.mark.parametrize("n", [3, 4, 5])
def test_random_rings_are_refused_at_their_first_fault(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """``right`` any map of the workers (cycles, fixed points, several onto one), one more round or not."""
    rng = np.random.default_rng(n)
    x = values(n, n, torch.float64, "sum", seed=n)
    rs0, ag0 = spec_tables(n)
    count = rs0.shape[0]
    for _ in range(25):
        table = rng.integers(0, n, n)
        for rounds in (count, count + 1):
            rs = np.concatenate([rs0, rs0])[:rounds]
            ag = np.concatenate([ag0, ag0])[:rounds]
            want = walk(n, functools.partial(lambda i, t: int(t[i]), t=table), at(rs), at(ag), rounds)
            with monkeypatch.context() as patch:
                right = functools.partial(lambda i, n, t: t[i], t=table)
                got = run_patched(
                    patch, n, rs=table_function(rs), ag=table_function(ag), right=right, rounds=rounds, x=x
                )
            if want is None:
                assert not isinstance(got, Exception), got
            else:
                assert isinstance(got, InvariantViolation) and str(got) == want, (table, str(got), want)


def rings_for(n: int) -> list[RingSchedule]:
    return [RingSchedule(d, o, "even") for d in (1, -1) for o in range(-1, n + 1)]


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("rs-send-chunk", "ag-send-chunk")
@pytest.mark.parametrize("n", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("block", [1 << 20, 1, 9])
def test_the_walk_and_the_bulk_check_agree_on_every_ring(
    monkeypatch: pytest.MonkeyPatch, n: int, block: int
) -> None:
    """For a sound ring both give the same additions (plain integers), owners and verdict, in blocks of any
    size; an all-gather off the ring's usual shape is left to the walk."""
    monkeypatch.setattr(_plan, "BLOCK_ENTRIES", block)
    for ring in rings_for(n):
        bulk = _plan._reduce_scatter_in_bulk(n, ring)
        assert bulk is not None
        rounds, owners = _plan._reduce_scatter_walk(n, ring)
        assert rounds == bulk[0] and owners.tolist() == bulk[1].tolist()
        for adds in rounds:
            for add in adds:
                assert all(type(v) is int for v in (add.start, add.stop, add.own))
                assert add.incoming is None or type(add.incoming) is int
        assert _plan._all_gather_in_bulk(n, owners, ring)
        _plan._all_gather_walk(n, owners, ring)
    if n >= 3:
        spec_ag = schedule.ag_send_chunk
        off = lambda i, r, n: schedule.owned_chunk(0, n) if (i, r) == (0, 1) else spec_ag(i, r, n)  # noqa: E731
        monkeypatch.setattr(schedule, "ag_send_chunk", np.vectorize(off))
        owners = _plan._reduce_scatter_walk(n)[1]
        assert not _plan._all_gather_in_bulk(n, owners)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("autograd", "op-prod", "op-max", "op-min")
@pytest.mark.parametrize("op", OPS)
def test_nested_vmap_where_the_input_is_batched_at_one_level_only(op: str) -> None:
    n = 3
    a = values(2, n * n, torch.float64, op, seed=1).reshape(2, n, n)
    b = values(4, n, torch.float64, op, seed=2)

    def run(engine: str) -> torch.Tensor:
        def inner(t: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
            return ring_all_reduce(t, engine=engine, op=op) + u  # type: ignore[call-overload, no-any-return]

        return torch.func.vmap(lambda t: torch.func.vmap(lambda u: inner(t, u))(b))(a)

    got = run("fast")
    want = torch.stack([torch.stack([ring_all_reduce(t, op=op) + u for u in b]) for t in a])
    assert same_bits(got, want)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("engines-same-bits")
@pytest.mark.parametrize("op", OPS)
def test_arrays_whose_strides_are_not_whole_elements(op: str) -> None:
    """A field of a packed record array: float32 values 5 bytes apart."""
    n = 3
    x = values(n, 2 * n, torch.float32, op, seed=3).numpy()
    packed = np.zeros(x.shape, dtype=[("v", "<f4"), ("pad", "u1")])
    packed["v"] = x
    assert packed["v"].strides[1] == 5
    assert_same(packed["v"], op)


# --- the schedule's evaluation, the entry points' defaults and refusals, tiles, the kernel's import -----


def shifted_rs(i: Any, r: Any, n: int) -> Any:
    """A sound reduce-scatter other than the spec's: chunk ``c``'s fold starts at worker ``c + 1``."""
    return (i - r - 1) % n


def assert_follows_shifted(monkeypatch: pytest.MonkeyPatch, n: int, rs: Callable[..., Any]) -> None:
    """With ``rs`` planted (all-gather to match), the fast engine folds along :func:`shifted_rs`."""
    x = values(n, 2 * n, torch.float64, "sum", seed=n)
    with monkeypatch.context() as patch:
        got = run_patched(
            patch, n, rs=rs, ag=lambda i, r, n: (i - r) % n, right=schedule.right, rounds=n - 1, x=x
        )
    table = np.array([[shifted_rs(i, r, n) for i in range(n)] for r in range(n - 1)])
    assert not isinstance(got, Exception), got
    assert same_bits(got, fold_along(x, n, table, lambda i: (i + 1) % n))


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("rs-send-chunk")
@pytest.mark.parametrize(
    ("kind", "point"),
    [("ints", (2, 2)), ("ints", (4, 5)), ("ints", (0, 0)), ("ints", None), ("floats", (1, 1))],
    ids=["middle-round-third-worker", "last-round-last-worker", "first", "everywhere", "floats"],
)
def test_a_function_wrong_on_arrays_is_followed_send_by_send(
    monkeypatch: pytest.MonkeyPatch, kind: str, point: tuple[int, int] | None
) -> None:
    """Integers that differ from the plain calls on arrays at the first, middle or last round and worker (a
    third of the way through them), or everywhere; floats that differ anywhere: each send is then called."""
    n = 6

    def rs(i: Any, r: Any, n: int) -> Any:
        right = shifted_rs(i, r, n)
        if isinstance(i, int):
            return right
        if point is None:
            wrong = (i - r) % n  # the spec's schedule: sound, but not this one
        else:
            wrong = np.where((r == point[0]) & (i == point[1]), (right + 1) % n, right)
        return wrong + 0.0 if kind == "floats" else wrong

    assert_follows_shifted(monkeypatch, n, rs)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("rs-send-chunk")
def test_a_floating_point_error_on_arrays_is_no_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """A function whose array evaluation divides by zero is called send by send, without numpy's warning."""

    def rs(i: Any, r: Any, n: int) -> Any:
        if isinstance(i, int):
            return shifted_rs(i, r, n)
        return shifted_rs(i, r, n) + 0 * (1 // i)  # worker 0: an integer division by zero

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert_follows_shifted(monkeypatch, 4, rs)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("round-count")
def test_one_worker_with_a_round_has_no_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedule, "rounds_per_phase", lambda _n: 1)
    want = walk(1, lambda i: 0, lambda i, r: 0, lambda i, r: 0, 1)
    assert want is not None
    with pytest.raises(InvariantViolation) as info:
        _fast.plan(1)
    assert str(info.value) == want


class TableRing:
    """A ring read from tables (``right[i]``, ``rs[r, i]``, ``ag[r, i]``), for integers and index arrays."""

    def __init__(self, right: npt.NDArray[np.int64], rs: npt.NDArray[np.int64], ag: npt.NDArray[np.int64]):
        self.dst, self.rs, self.ag = right, rs, ag

    def right(self, i: Any, n: int) -> Any:
        return self.dst[i] + 0 * n

    def send_chunk(self, phase: schedule.Phase, i: Any, r: Any, n: int) -> Any:
        return (self.rs if phase == schedule.REDUCE_SCATTER else self.ag)[r, i] + 0 * n


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("rs-add", "ring-topology")
def test_a_fault_names_the_receiver_of_the_rings_own_right() -> None:
    """The walk over a ring running the other way names each bad send's receiver by that ring's ``right``."""
    n = 4
    ring = RingSchedule(-1, 0, "even")
    dst = np.array([ring.right(i, n) for i in range(n)], dtype=np.int64)
    rs0 = np.array([[ring.rs_send_chunk(i, r, n) for i in range(n)] for r in range(n - 1)], dtype=np.int64)
    ag = np.array([[ring.ag_send_chunk(i, r, n) for i in range(n)] for r in range(n - 1)], dtype=np.int64)
    for r in range(n - 1):
        for i in range(n):
            rs = rs0.copy()
            rs[r, i] = (rs[r, i] + 1) % n
            want = walk(n, lambda w: int(dst[w]), at(rs), at(ag), n - 1)
            assert want is not None and want.startswith("reduce-scatter")
            with pytest.raises(InvariantViolation) as info:
                _plan._reduce_scatter_walk(n, TableRing(dst, rs, ag))
            assert str(info.value) == want


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_the_kernel_is_imported_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_forward, "_kernel_module", None)
    x = values(3, 6, torch.float64, "sum", seed=1)
    assert same_bits(ring_all_reduce(x, engine="fast"), ring_all_reduce(x, engine="reference"))
    assert _forward._kernel_module is _kernel


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_tiles_hold_about_the_budget() -> None:
    """``(chunks, rows)``: everything without a budget, else as many whole chunks as fit, else one chunk
    (or one row) cut into row ranges of about the budget, never more rows than a chunk has."""
    row = 8
    assert _run.batch_tile(4, 3, row, None) == (4, 3)
    assert _run.batch_tile(4, 3, row, 2 * 3 * row + 5) == (2, 3)
    assert _run.batch_tile(4, 3, row, 3 * row + 20) == (1, 3)
    assert _run.batch_tile(4, 10, row, 4 * row + 3) == (1, 4)
    assert _run.batch_tile(4, 10, row, row - 1) == (1, 1)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("fold-order")
def test_tensors_off_the_cpu_fold_in_one_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor off the CPU has no tile budget: the batched path folds every chunk at once, the same bits
    (the tile budget stood in for, as no accelerator is run here)."""
    x = values(5, 10, torch.float16, "sum", seed=4)  # float16: the batched path
    want = ring_all_reduce(x, engine="reference")
    monkeypatch.setattr(type(_forward.TORCH), "tile_budget", lambda self, x: None)
    assert same_bits(ring_all_reduce(x, engine="fast"), want)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("bad-input", "schedule-layouts")
def test_even_layouts_refuse_what_the_others_cut() -> None:
    """M not divisible by N: refused with the reference's message on even rings, cut by blocks and gloo."""
    x = values(3, 7, torch.float32, "sum", seed=2)
    for ring in ("spec", RingSchedule(-1, 2, "even")):
        for view in (x, x.numpy()):
            want = outcome(view, "reference", "sum", ring)
            assert isinstance(want, ValueError) and "not divisible" in str(want)
            got = outcome(view, "fast", "sum", ring)
            assert type(got) is ValueError and str(got) == str(want)
    for ring in ("gloo", RingSchedule(1, 1, "blocks")):
        assert_same(x, "sum", ring)
        assert_same(x.numpy(), "sum", ring)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("fold-order")
def test_the_entry_points_default_to_the_specs_ring_and_the_sum() -> None:
    x = values(3, 6, torch.float64, "sum", seed=3)
    want = ring_all_reduce(x, engine="reference")
    assert same_bits(_fast.ring_all_reduce_torch(x), want)
    assert same_bits(torch.from_numpy(_fast.ring_all_reduce_numpy(x.numpy())), want)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("schedule-layouts", "output-shape")
def test_uneven_layouts_keep_trailing_dimensions_and_the_element_size() -> None:
    """Trailing dimensions survive the padding; gloo's chunks past its 1 MiB segments depend on the element
    size (float64 here: other bounds than for 4-byte elements)."""
    x = values(3, 7, torch.float64, "sum", seed=5, trailing=(2,))
    for ring in (RingSchedule(1, 1, "blocks"), "gloo"):
        assert_same(x, "sum", ring)
        assert_same(x.numpy(), "sum", ring)
    order = torch.tensor(
        [[1.0], [2.0**-53], [-1.0]], dtype=torch.float64
    )  # a sum that names its chunk's order
    big = order.expand(3, 800_000).contiguous()
    assert_same(big, "sum", "gloo")
    assert_same(big.numpy(), "sum", "gloo")


def unaligned(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    raw = np.zeros(a.nbytes + 1, dtype=np.uint8)[1:].view(a.dtype)
    out = raw.reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("input-finite", "bad-input")
def test_a_users_numpy_error_state_does_not_reach_the_batched_path() -> None:
    """Under ``np.errstate(all="raise")``: products that underflow, or overflow and then meet a zero (NaN),
    are the rounded results, and an input holding inf and -inf gets the usual refusal, not numpy's error."""
    inf = float("inf")
    cases = [
        (np.full((2, 2), 1e-200), "prod"),
        (np.array([[1e300] * 3, [1e300] * 3, [0.0] * 3]), "prod"),
        (np.array([[inf, 1.0], [-inf, 1.0]]), "sum"),
    ]
    for a, op in cases:
        for view in (unaligned(a), a.astype(">f8")):  # both take the batched path
            with np.errstate(all="ignore"):  # the reference's own numpy warnings are not under test here
                want = outcome(view, "reference", op)
            with np.errstate(all="raise"):
                got = outcome(view, "fast", op)
            if isinstance(want, Exception):
                assert type(got) is type(want) and str(got) == str(want)
            else:
                assert same_bits(as_tensor(got), as_tensor(want)), (a, op)


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("autograd", "schedule-fold-order")
def test_a_graph_on_every_ring_runs_that_ring() -> None:
    rings: list[tuple[RingSchedule | str, int]] = [
        (RingSchedule(-1, 2, "even"), 6),
        (RingSchedule(1, 1, "blocks"), 7),
        ("gloo", 7),
    ]
    for ring, m in rings:
        x = values(3, m, torch.float64, "sum", seed=m)
        leaf = x.clone().requires_grad_(True)
        y = ring_all_reduce(leaf, engine="fast", schedule=ring)
        assert same_bits(y.detach(), ring_all_reduce(x, engine="reference", schedule=ring)), ring
        y.sum().backward()  # type: ignore[no-untyped-call]
        assert leaf.grad is not None and same_bits(leaf.grad, torch.ones_like(x))


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("autograd", "op-prod", "op-max", "op-min")
@pytest.mark.parametrize("op", ["prod", "max", "min"])
def test_vmap_over_a_graph_runs_and_its_backward_is_refused(op: str) -> None:
    """``vmap`` over a tensor that records a graph gives the per-sample results; their backward is refused
    with the message that names the op."""
    batch = values(2, 9, torch.float64, op, seed=3).reshape(2, 3, 3)
    leaf = batch.clone().requires_grad_(True)
    y = torch.func.vmap(lambda t: ring_all_reduce(t, engine="fast", op=op))(leaf)
    assert same_bits(y.detach(), torch.stack([ring_all_reduce(b, op=op) for b in batch]))
    with pytest.raises(
        ValueError, match=rf"^engine='fast' differentiates op='sum' and op='avg' only; op='{op}' "
    ):
        y.sum().backward()  # type: ignore[no-untyped-call]


@pytest.mark.clause("engines-same-bits")
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
@pytest.mark.clause("ag-copy-not-add", "ring-topology")
def test_an_all_gather_without_one_owner_per_chunk_or_a_ring_is_left_to_the_walk() -> None:
    n = 3
    owners = _plan._reduce_scatter_walk(n)[1]
    assert _plan._all_gather_in_bulk(n, owners)
    assert not _plan._all_gather_in_bulk(n, np.array([owners[0], *owners[:-1]], dtype=np.int64))
    rs, ag = spec_tables(n)
    out_of_range = np.array([1, 2, n], dtype=np.int64)  # worker 2 sends to worker 3
    assert not _plan._all_gather_in_bulk(n, owners, TableRing(out_of_range, rs, ag))
