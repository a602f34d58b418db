"""The fast engine (``ring_ref._fast``): bitwise equal to the reference engine, and its own invariants.

The reference engine is the oracle for bits; ``tests/common/oracles.py`` (independent
of ``ring_ref``) is a second one where the reference would be too slow.  Speed
and memory are not tested here: ``make bench`` measures them side by side.
"""

from __future__ import annotations

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

from ring_ref import InvariantViolation, _fast, _kernel, ring_all_reduce, schedule
from tests.common.fast_knobs import fast_in_small_tiles, plan_fold_orders
from tests.common.oracles import bits, exact_sum, pairwise_tree, ring_fold, same_bits
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
        patch.setattr(_fast, "TILE_BYTES", tile_bytes)
        patch.setattr(_fast, "NUMPY_TILE_BYTES", tile_bytes)
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
        bulk = _fast._reduce_scatter_in_bulk(n)
        rounds, owners = _fast._reduce_scatter_walk(n)
        assert bulk is not None
        assert bulk[0] == rounds
        assert bulk[1].tolist() == owners.tolist()
        assert _fast._all_gather_in_bulk(n, owners)
        _fast._all_gather_walk(n, owners)


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
        owners = _fast._reduce_scatter_in_bulk(n)
        assert owners is not None
        assert not _fast._all_gather_in_bulk(n, owners[1])
        x = torch.randn(n, 2 * n, dtype=torch.float64)
        assert same_bits(ring_all_reduce(x, engine="fast"), ring_fold(x))


@pytest.mark.clause("autograd")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fast_result_under_autograd_takes_in_place_operations(dtype: torch.dtype) -> None:
    x = torch.randn(4, 8, dtype=dtype, requires_grad=True)
    y = ring_all_reduce(x, engine="fast")
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
