"""Reduce-scatter and all-gather as collectives of their own (spec/reduce_scatter_all_gather.md).

Expected values come from ``tests/common/oracles.py`` (``reduce_scatter_fold``: the left
fold ``r + d, r + 2d, ..., r`` written directly on tensors, importing nothing from
``ring_ref``) or are written out by hand here; all-gather's expected bits are laid
out by a loop in the test.
"""

from __future__ import annotations

import inspect
import struct
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ring_ref import (
    OPS,
    Engine,
    RingSchedule,
    ring_all_gather,
    ring_all_reduce,
    ring_reduce_scatter,
)
from ring_ref.core import fold, gather_state, never_combine, provenance_state, run_ring
from ring_ref.invariants import InvariantViolation
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, SPEC, Phase, reduce_scatter_ring
from tests.common.oracles import INT_OF_BITS, bits, reduce_scatter_fold, ring_fold_op, same_bits
from tests.common.strategies import ALL_DTYPES, worker_tensors
from tests.cover.test_spec_clauses import SPEC_PY

ENGINES: tuple[Engine, Engine] = ("reference", "fast")
TWO24 = float(2**24)


def _rs_ring(n: int, direction: int, wraps: int, layout: Any) -> RingSchedule:
    """A ring with ``k = d`` (mod ``n``): the offset ``d + wraps n``."""
    return RingSchedule(direction, direction + wraps * n, layout)


RING_CASES: dict[str, st.SearchStrategy[Any]] = {
    "x": worker_tensors(max_n=6),
    "op": st.sampled_from(OPS),
    "direction": st.sampled_from((1, -1)),
    "wraps": st.integers(-1, 1),
    "layout": st.sampled_from(("even", "blocks")),
}
"""An input, an op and a ring with ``k = d``: offset ``d + wraps N``, a layout that cuts equal chunks."""


def _numpy_twin(got: Any) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(got))


# --- reduce-scatter's values ------------------------------------------------------------------


@pytest.mark.clause("rsc-fold-order")
@given(**RING_CASES)
def test_reduce_scatter_is_the_left_fold_from_r_plus_d(
    x: torch.Tensor, op: str, direction: int, wraps: int, layout: str
) -> None:
    expected = reduce_scatter_fold(x, op, direction)
    ring = _rs_ring(x.shape[0], direction, wraps, layout)
    for engine in ENGINES:
        got = ring_reduce_scatter(x, schedule=ring, op=op, engine=engine)
        assert same_bits(got, expected), (engine, ring)
        if x.dtype != torch.bfloat16:
            got_np = ring_reduce_scatter(x.numpy(), schedule=ring, op=op, engine=engine)
            assert same_bits(_numpy_twin(got_np), expected), (engine, ring, "numpy")


@pytest.mark.clause("rsc-fold-order", "rs-ag-theorem")
@pytest.mark.parametrize("engine", ENGINES)
def test_reduce_scatter_by_hand_folds_from_r_plus_1(engine: Engine) -> None:
    """Chunk ``c``: worker ``c + 1`` holds ``2^24``, ``c + 2`` holds ``1``, ``c`` holds ``-2^24``.

    The fold ``c + 1, c + 2, c`` rounds ``2^24 + 1`` to ``2^24`` (float32) and ends at 0;
    the spec's all-reduce ring folds ``c, c + 1, c + 2`` and ends at 1.
    """
    x = torch.tensor(
        [
            [-TWO24, 1.0, TWO24],
            [TWO24, -TWO24, 1.0],
            [1.0, TWO24, -TWO24],
        ]
    )
    shards = ring_reduce_scatter(x, engine=engine)
    assert shards.tolist() == [[0.0], [0.0], [0.0]]
    assert ring_all_reduce(x, engine).tolist() == [1.0, 1.0, 1.0]
    assert ring_all_gather(shards, engine=engine).tolist() == [0.0, 0.0, 0.0]
    # N = 4 tells the directions apart: chunk c holds 2^24 at c + 1, 1 at c + 2, -2^24 at c + 3, 0 at c
    z = torch.tensor([[[0.0, TWO24, 1.0, -TWO24][(w - c) % 4] for c in range(4)] for w in range(4)])
    # d = +1: ((2^24 + 1) - 2^24) + 0 = 0, as 2^24 + 1 rounds to 2^24
    assert ring_reduce_scatter(z, engine=engine).tolist() == [[0.0]] * 4
    # d = -1: ((-2^24 + 1) + 2^24) + 0 = 1, every step exact
    assert ring_reduce_scatter(z, schedule=RingSchedule(-1, -1), engine=engine).tolist() == [[1.0]] * 4


@pytest.mark.clause("rsc-ring")
@pytest.mark.parametrize("engine", ENGINES)
def test_presets_run_with_offset_equal_to_direction(engine: Engine) -> None:
    """``"openmpi-ring"`` is ``(+1, +1, blocks)``, ``"gloo"`` ``(-1, -1, gloo)``: each equals its ring
    with ``k = d`` run through ``ring_all_reduce``, cut into rows, and the hand-typed fold."""
    x = torch.randn(4, 8, 3, generator=torch.Generator().manual_seed(5))
    for name, ring in (
        (None, RingSchedule(1, 1, "even")),
        ("spec", RingSchedule(1, 1, "even")),
        ("openmpi-ring", RingSchedule(1, 1, "blocks")),
        ("gloo", RingSchedule(-1, -1, "gloo")),
    ):
        got = ring_reduce_scatter(x, schedule=name, engine=engine)
        assert same_bits(got, ring_all_reduce(x, engine, schedule=ring).reshape(4, 2, 3)), name
        assert same_bits(got, reduce_scatter_fold(x, "sum", ring.direction)), name


# --- all-gather copies ------------------------------------------------------------------------

_SPECIAL_BITS = {
    16: [0x7E01, 0x7C01, 0xFE55, 0x8000, 0x0001, 0x83FF, 0x7C00, 0xFC00],
    32: [0x7FC00001, 0x7F800001, 0xFFC12345, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000],
    64: [0x7FF8000000000001, 0x7FF0000000000001, 0x8000000000000000, 0x0000000000000001],
}
"""NaN payloads (quiet and signalling, either sign), -0.0, subnormals, infinities, as bit patterns."""

_BF16_SPECIAL = [0x7FC1, 0x7F81, 0xFFA5, 0x8000, 0x0001, 0x807F, 0x7F80]


@st.composite
def _shards(draw: st.DrawFn) -> torch.Tensor:
    """``(N, S, ...)`` shards of any bits, specials mixed in."""
    dtype = draw(st.sampled_from(ALL_DTYPES))
    width = torch.finfo(dtype).bits
    n, s = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    trailing = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    count = n * s * int(np.prod(trailing, dtype=np.int64))
    specials = _BF16_SPECIAL if dtype == torch.bfloat16 else _SPECIAL_BITS[width]
    words = draw(
        st.lists(st.sampled_from(specials) | st.integers(0, 2**width - 1), min_size=count, max_size=count)
    )
    signed = [w - 2**width if w >= 2 ** (width - 1) else w for w in words]
    return torch.tensor(signed, dtype=INT_OF_BITS[width]).view(dtype).reshape(n, s, *trailing)


@pytest.mark.clause("agc-copy")
@given(shards=_shards(), direction=st.sampled_from((1, -1)), wraps=st.integers(-1, 1))
def test_all_gather_copies_every_bit_into_rank_order(
    shards: torch.Tensor, direction: int, wraps: int
) -> None:
    n, s = shards.shape[0], shards.shape[1]
    expected = torch.empty((n * s, *shards.shape[2:]), dtype=bits(shards).dtype)
    for r in range(n):  # rank r's shard lands in rows r S .. (r + 1) S - 1
        expected[r * s : (r + 1) * s] = bits(shards[r])
    before = bits(shards).clone()
    ring = _rs_ring(n, direction, wraps, "even")
    for engine in ENGINES:
        for schedule in (None, ring):
            got = ring_all_gather(shards, schedule=schedule, engine=engine)
            assert got.dtype == shards.dtype
            assert torch.equal(bits(got), expected), (engine, schedule)
            if shards.dtype != torch.bfloat16:
                got_np = ring_all_gather(shards.numpy(), schedule=schedule, engine=engine)
                assert got_np.dtype == shards.numpy().dtype
                assert torch.equal(bits(_numpy_twin(got_np)), expected), (engine, schedule, "numpy")
    assert torch.equal(bits(shards), before)


@pytest.mark.clause("agc-copy")
@pytest.mark.parametrize("engine", ENGINES)
def test_all_gather_by_hand(engine: Engine) -> None:
    nan_payload = struct.unpack("<f", struct.pack("<I", 0x7FC0BEEF))[0]
    shards = torch.tensor([[[1.0, -0.0]], [[nan_payload, 1e-45]], [[float("-inf"), 3.0]]])
    got = ring_all_gather(shards, engine=engine)
    assert got.shape == (3, 2)
    assert [struct.pack("<f", v) for v in got.reshape(-1).tolist()] == [
        struct.pack("<f", v) for v in (1.0, -0.0, nan_payload, 1e-45, float("-inf"), 3.0)
    ]
    assert bits(got)[1, 0].item() == 0x7FC0BEEF


# --- the theorem ------------------------------------------------------------------------------


@pytest.mark.clause("rs-ag-theorem")
@given(**RING_CASES)
def test_all_gather_after_reduce_scatter_is_all_reduce(
    x: torch.Tensor, op: str, direction: int, wraps: int, layout: str
) -> None:
    n = x.shape[0]
    ring = _rs_ring(n, direction, wraps, layout)
    folded = ring_fold_op(x, op, direction, direction)  # chunk c folded c + d, c + 2d, ..., c
    for engine in ENGINES:
        composed = ring_all_gather(ring_reduce_scatter(x, schedule=ring, op=op, engine=engine), schedule=ring)
        assert same_bits(composed, ring_all_reduce(x, engine, op=op, schedule=ring)), engine
        assert same_bits(composed, folded), engine


# --- the interface: shapes, dtype, device, autograd, no aliasing ----------------------------


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def _disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _storage_span(a), _storage_span(b)
    return a1 <= b0 or b1 <= a0


@pytest.mark.clause("rsc-shape")
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("n", [1, 2, 4])
def test_shapes_dtype_no_aliasing_and_input_unchanged(engine: Engine, n: int) -> None:
    x = torch.randn(n, 2 * n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    before = x.clone()
    shards = ring_reduce_scatter(x, engine=engine)
    assert shards.shape == (n, 2, 3)
    assert shards.dtype == torch.float64
    assert shards.device == x.device
    assert _disjoint(shards, x)
    gathered = ring_all_gather(shards, engine=engine)
    assert gathered.shape == (2 * n, 3)
    assert _disjoint(gathered, shards)
    assert torch.equal(x, before)
    a = x.numpy()
    shards_np = ring_reduce_scatter(a, engine=engine)
    assert isinstance(shards_np, np.ndarray)
    assert shards_np.shape == (n, 2, 3)
    assert not np.shares_memory(shards_np, a)
    gathered_np = ring_all_gather(shards_np, engine=engine)
    assert gathered_np.shape == (2 * n, 3)
    assert not np.shares_memory(gathered_np, shards_np)


@pytest.mark.clause("rsc-shape")
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_gradients_flow_through_both(engine: Engine, op: str) -> None:
    n, m = 3, 6
    x = torch.randn(n, m, generator=torch.Generator().manual_seed(1), requires_grad=True)
    w = torch.arange(m, dtype=torch.float32).reshape(n, m // n) + 1
    (ring_reduce_scatter(x, op=op, engine=engine) * w).sum().backward()  # type: ignore[no-untyped-call]
    assert x.grad is not None
    scale = 1 / n if op == "avg" else 1.0
    for i in range(n):  # every worker's element j reaches the shard holding row j with weight w
        assert torch.allclose(x.grad[i], w.reshape(m) * scale)
    shards = torch.randn(n, 2, generator=torch.Generator().manual_seed(2), requires_grad=True)
    v = torch.arange(2 * n, dtype=torch.float32)
    (ring_all_gather(shards, engine=engine) * v).sum().backward()  # type: ignore[no-untyped-call]
    assert shards.grad is not None
    assert torch.equal(shards.grad, v.reshape(n, 2))


@pytest.mark.clause("rsc-shape")
def test_reference_differentiates_max_and_fast_refuses_it() -> None:
    x = torch.tensor([[1.0, 5.0], [3.0, 2.0]], requires_grad=True)
    ring_reduce_scatter(x, op="max").sum().backward()  # type: ignore[no-untyped-call]
    assert x.grad is not None
    assert x.grad.tolist() == [[0.0, 1.0], [1.0, 0.0]]
    with pytest.raises(ValueError, match="engine='fast' differentiates op='sum' and op='avg' only"):
        ring_reduce_scatter(x, op="max", engine="fast")


# --- rejected input ---------------------------------------------------------------------------

_NAN = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])


@pytest.mark.clause("rsc-bad-input")
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("x", "kwargs", "kind", "words"),
    [
        ([[1.0], [2.0]], {}, TypeError, "ring_reduce_scatter expects x as one torch.Tensor or numpy"),
        (torch.ones(4), {}, ValueError, r"x must have shape \(N, M, \.\.\.\)"),
        (torch.ones(2, 3), {}, ValueError, "M = 3 is not divisible by N = 2, so the 2 shards"),
        (torch.ones(2, 3), {"schedule": "openmpi-ring"}, ValueError, "Pad M to a multiple of 2 \\(e.g. 4\\)"),
        (
            torch.ones(4, 4),
            {"schedule": "gloo"},
            ValueError,
            "the layout 'gloo' cuts .* 2, 2, 0, 0 for N = 4",
        ),
        (
            torch.ones(4, 4),
            {"schedule": SPEC},
            ValueError,
            r"offset equals its direction.*RingSchedule\(1, 1",
        ),
        (torch.ones(3, 3), {"schedule": RingSchedule(-1, 1)}, ValueError, r"RingSchedule\(-1, -1, 'even'\)"),
        (torch.ones(2, 2), {"schedule": "ring"}, ValueError, "unknown schedule 'ring'"),
        (torch.ones(2, 2), {"schedule": RingSchedule(2, 2)}, ValueError, "schedule direction must be"),
        (torch.ones(2, 2, dtype=torch.int32), {}, TypeError, "unsupported dtype torch.int32"),
        (_NAN, {}, ValueError, r"inputs must be finite: 1 element\(s\)"),
        (torch.ones(2, 2), {"op": "median"}, ValueError, "unknown reduction op 'median'"),
    ],
)
def test_reduce_scatter_refuses_bad_input_by_name(
    engine: Engine, x: Any, kwargs: dict[str, Any], kind: type[Exception], words: str
) -> None:
    before = x.clone() if isinstance(x, torch.Tensor) else None
    with pytest.raises(kind, match=words):
        ring_reduce_scatter(x, engine=engine, **kwargs)
    if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
        with pytest.raises(kind, match=words):
            ring_reduce_scatter(x.numpy(), engine=engine, **kwargs)
    if before is not None:
        assert torch.equal(
            bits(x) if x.dtype.is_floating_point else x, bits(before) if x.dtype.is_floating_point else before
        )


@pytest.mark.clause("agc-bad-input")
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    ("shards", "kwargs", "kind", "words"),
    [
        ((1.0, 2.0), {}, TypeError, "ring_all_gather expects shards as one torch.Tensor"),
        (torch.ones(4), {}, ValueError, r"shards must have shape \(N, S, \.\.\.\)"),
        (torch.ones(2, 0), {}, ValueError, r"S = 0 rows"),
        (
            torch.ones(4, 1),
            {"schedule": "gloo"},
            ValueError,
            "the layout 'gloo' cuts .* 2, 2, 0, 0 for N = 4",
        ),
        (torch.ones(3, 1), {"schedule": RingSchedule(1, 0)}, ValueError, r"RingSchedule\(1, 1, 'even'\)"),
        (torch.ones(2, 1, dtype=torch.int64), {}, TypeError, "unsupported dtype torch.int64"),
    ],
)
def test_all_gather_refuses_bad_input_by_name(
    engine: Engine, shards: Any, kwargs: dict[str, Any], kind: type[Exception], words: str
) -> None:
    with pytest.raises(kind, match=words):
        ring_all_gather(shards, engine=engine, **kwargs)


@pytest.mark.clause("rsc-bad-input")
def test_unknown_engine_is_refused() -> None:
    for call in (ring_reduce_scatter, ring_all_gather):
        with pytest.raises(ValueError, match="unknown engine 'gpu'"):
            call(torch.ones(2, 2), engine="gpu")  # type: ignore[call-overload]


@pytest.mark.clause("engines-same-bits")
def test_every_collective_takes_the_engine_second_by_position_or_by_name() -> None:
    """``engine`` is one parameter in the same place in all three collectives: the second, positional or
    keyword (``ring_all_reduce(x, "fast")`` as released); ``op`` and ``schedule`` keyword-only."""
    x = torch.arange(32.0).reshape(4, 8)
    for call in (ring_all_reduce, ring_reduce_scatter, ring_all_gather):
        parameters = list(inspect.signature(call).parameters.values())
        assert parameters[1].name == "engine", call
        assert parameters[1].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, call
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[2:]), call
        assert same_bits(call(x, "fast"), call(x, engine="fast")), call
        assert same_bits(call(x, "fast"), call(x)), call


@pytest.mark.clause("rsc-ring")
def test_any_offset_congruent_to_the_direction_is_accepted() -> None:
    x = torch.arange(8.0).reshape(2, 4)
    want = [[4.0, 6.0], [8.0, 10.0]]
    for ring in (RingSchedule(1, 1), RingSchedule(1, 3), RingSchedule(-1, 1), RingSchedule(1, -1)):
        assert ring_reduce_scatter(x, schedule=ring).tolist() == want, ring  # N = 2: d = -d mod 2
    one = torch.tensor([[1.5, 2.5]])
    assert ring_reduce_scatter(one, schedule=SPEC).tolist() == [[1.5, 2.5]]  # N = 1: any offset
    with pytest.raises(ValueError, match="leaves chunk 1 at rank 0 for N = 4"):
        ring_reduce_scatter(torch.ones(4, 4), schedule=RingSchedule(-1, 2))


# --- the core runs each phase alone, checking the phase's invariants -----------------------------


@pytest.mark.clause("rsc-phase")
@pytest.mark.parametrize("n", range(1, 8))
@pytest.mark.parametrize("direction", [1, -1])
def test_reduce_scatter_alone_leaves_the_fold_from_r_plus_d_at_rank_r(n: int, direction: int) -> None:
    ring = RingSchedule(direction, direction)
    seen: list[tuple[Phase, int]] = []
    final = run_ring(
        provenance_state(n),
        fold,
        lambda phase, r, _s, _p: seen.append((phase, r)),
        schedule=ring,
        phases=(REDUCE_SCATTER,),
    )
    assert seen == [(REDUCE_SCATTER, r) for r in range(n - 1)]
    for r in range(n):
        assert final[r][r] == tuple((r + j * direction) % n for j in range(1, n + 1))


@pytest.mark.clause("agc-copy")
@pytest.mark.parametrize("n", range(1, 8))
@pytest.mark.parametrize("direction", [1, -1])
def test_all_gather_alone_puts_rank_r_shard_in_every_slot_r(n: int, direction: int) -> None:
    labels = [f"shard {r}" for r in range(n)]
    seen: list[tuple[Phase, int]] = []
    final = run_ring(
        gather_state(labels),
        never_combine,
        lambda phase, r, _s, _p: seen.append((phase, r)),
        schedule=RingSchedule(direction, direction),
        phases=(ALL_GATHER,),
    )
    assert seen == [(ALL_GATHER, r) for r in range(n - 1)]
    assert final == tuple(tuple(labels) for _ in range(n))


class _ShiftedGather(RingSchedule):
    """A planted fault: all-gather sends the chunk it should send one round later."""

    def ag_send_chunk(self, i: int, r: int, n: int) -> int:
        return super().ag_send_chunk(i, r + 1, n)


class _ShiftedScatter(RingSchedule):
    """A planted fault: reduce-scatter sends the chunk of the next round."""

    def rs_send_chunk(self, i: int, r: int, n: int) -> int:
        return super().rs_send_chunk(i, r + 1, n)


@pytest.mark.clause("rsc-phase")
def test_each_phase_alone_is_checked_by_its_invariants() -> None:
    with pytest.raises(InvariantViolation, match="after all-gather round 0"):
        run_ring(
            gather_state(list(range(4))), never_combine, schedule=_ShiftedGather(1, 1), phases=(ALL_GATHER,)
        )
    with pytest.raises(InvariantViolation, match="after reduce-scatter round 0"):
        run_ring(provenance_state(4), fold, schedule=_ShiftedScatter(1, 1), phases=(REDUCE_SCATTER,))
    with pytest.raises(AssertionError, match="never combines"):
        run_ring(provenance_state(2), never_combine, phases=(REDUCE_SCATTER,))
    with pytest.raises(ValueError, match="phases must be"):
        run_ring(provenance_state(2), fold, phases=(ALL_GATHER, REDUCE_SCATTER))


@pytest.mark.clause("rsc-ring")
@pytest.mark.parametrize("n", range(1, 10))
def test_shard_order_matches_spec_code(n: int) -> None:
    for d in (1, -1):
        for layout in ("even", "blocks", "gloo"):
            ring = reduce_scatter_ring(RingSchedule(*SPEC_PY["collective_ring"](d, layout)), n)
            assert ring == RingSchedule(d, d, layout)
            for r in range(n):
                assert ring.owned_chunk(r, n) == r
                assert ring.fold_order(r, n) == SPEC_PY["rs_shard_order"](r, n, d)


@pytest.mark.clause("rsc-shape", "agc-copy")
@pytest.mark.gpu
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_collectives_on_cuda_keep_device_and_bits(dtype: torch.dtype, engine: Engine) -> None:
    """Run by `make gpu-check` on a machine with CUDA; `make verify` deselects it."""
    assert torch.cuda.is_available(), "make gpu-check needs a CUDA device"
    x = (torch.randn(8, 64, 3, dtype=torch.float64) * 100).to(dtype)
    shards = ring_reduce_scatter(x.cuda(), engine=engine)
    assert shards.device == x.cuda().device
    assert same_bits(shards.cpu(), reduce_scatter_fold(x, "sum", 1))
    width = torch.finfo(dtype).bits
    raw = torch.randint(-(2**15), 2**15, (8, 5, 3), dtype=INT_OF_BITS[width]).view(dtype)  # any bits
    gathered = ring_all_gather(raw.cuda(), engine=engine)
    assert gathered.device == x.cuda().device
    assert torch.equal(bits(gathered.cpu()), bits(raw).reshape(40, 3))


@pytest.mark.clause("agc-copy")
def test_the_fast_all_gather_is_a_c_ordered_copy_whatever_the_shards_strides() -> None:
    shards = torch.arange(24.0).reshape(4, 2, 3).permute(1, 2, 0)  # (N, S, 4): the last dim outermost
    want = torch.tensor([[float(t * 6 + r * 3 + s) for t in range(4)] for r in range(2) for s in range(3)])
    got = ring_all_gather(shards, engine="fast")
    assert got.is_contiguous() and torch.equal(got, want)
    assert got.untyped_storage().data_ptr() != shards.untyped_storage().data_ptr()
    array = shards.numpy()
    gathered = ring_all_gather(array, engine="fast")
    assert gathered.flags.c_contiguous and np.array_equal(gathered, want.numpy())
    assert not np.shares_memory(gathered, array)
