"""The bad-input table's words (problem and fix) and its boundaries (``ring_ref._validate``).

Each refusal is checked word for word as ``ring_ref._validate`` words it for
every entry point: the stacked torch and numpy inputs, one rank's tensor of
the distributed ring (``rank_tensor_problem``) and one rank's array of the
MPI ring (``rank_array_problem``).  The smallest inputs the table accepts
(``N = 1``, ``M = 1``, a trailing dimension of 1) are checked to pass, and
the overlap rule is checked on layouts that do and do not share memory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import as_strided

from ring_ref import ring_all_reduce
from ring_ref._ranks._rules import (
    rank_array_problem,
    rank_array_shards_problem,
    rank_shards_problem,
    rank_tensor_problem,
    shards_problem,
)
from ring_ref._validate import (
    check_numpy,
    check_numpy_structure,
    check_ring_size,
    check_torch,
    check_torch_structure,
    scan_blocks,
    torch_finite,
)
from ring_ref.schedule import SPEC, Collective, RingSchedule

pytestmark = pytest.mark.clause("bad-input", "input-shape", "supported-dtypes", "input-finite")

CAST = (
    "Cast first, e.g. x.to(torch.float32) or x.astype(numpy.float32); for complex inputs reduce "
    "the real and imaginary parts as a trailing axis of size 2."
)


def _message(call: Callable[[], object], kind: type[Exception]) -> str:
    with pytest.raises(kind) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("shape", [(1, 1), (1, 1, 1), (1, 3), (3, 3, 1), (2, 2, 1, 3)])
def test_the_smallest_accepted_shapes_pass_every_entry_point(shape: tuple[int, ...]) -> None:
    n, m = shape[0], shape[1]
    for x in (torch.ones(shape), np.ones(shape)):
        assert ring_all_reduce(x).shape == shape[1:]
    assert check_torch(torch.ones(shape)) == (n, m)
    assert check_numpy(np.ones(shape)) == (n, m)
    assert rank_tensor_problem(torch.ones(shape[1:]), n, "gloo") is None
    assert rank_array_problem(np.ones(shape[1:]), n) is None
    check_ring_size(n, m)


def test_unsupported_dtypes_name_the_supported_list_of_their_own_library() -> None:
    torch_words = _message(lambda: ring_all_reduce(torch.ones(2, 2, dtype=torch.int32)), TypeError)
    assert torch_words == (
        "unsupported dtype torch.int32; the ring sums floating-point values only "
        f"(torch.float16, bfloat16, float32, float64). {CAST}"
    )
    numpy_words = _message(lambda: ring_all_reduce(np.ones((2, 2), dtype=np.int32)), TypeError)
    assert numpy_words == (
        "unsupported dtype int32; the ring sums floating-point values only "
        f"(numpy.float16, float32, float64). {CAST}"
    )
    per_rank = rank_tensor_problem(torch.ones(2, dtype=torch.int32), 2, "gloo")
    assert per_rank is not None and per_rank.message == torch_words
    per_rank_array = rank_array_problem(np.ones(2, dtype=np.int32), 2)
    assert per_rank_array is not None and per_rank_array.message == numpy_words


def test_layout_and_device_refusals_word_for_word() -> None:
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(2)])
    assert _message(lambda: ring_all_reduce(nested), TypeError) == (
        "worker_tensors must be a dense strided tensor; got layout torch.strided (nested). "
        "Convert with .to_dense() first."
    )
    meta = torch.empty(2, 2, device="meta")
    assert _message(lambda: ring_all_reduce(meta), ValueError) == (
        "the tensor is on the meta device and holds no values to reduce."
    )


def test_numpy_subclass_and_byte_order_refusals_word_for_word() -> None:
    masked = np.ma.masked_array(np.ones((2, 2)))
    assert _message(lambda: ring_all_reduce(masked), TypeError) == (
        "worker_tensors is a MaskedArray, an ndarray subclass whose semantics (masks, matrix products) "
        "the ring cannot preserve. Pass a plain array: numpy.asarray(x) "
        "(or x.filled(...) for a masked array)."
    )
    swapped = np.ones((2, 2), dtype=">f8")
    words = (
        "the array's byte order is the problem: dtype >f8 is not in this machine's native byte order, "
        "and the result must keep the input's dtype. Convert first: x.astype(x.dtype.newbyteorder('='))."
    )
    assert _message(lambda: ring_all_reduce(swapped), TypeError) == words
    per_rank = rank_array_problem(np.ones(2, dtype=">f8"), 2)
    assert per_rank is not None and (per_rank.kind, per_rank.message) == (TypeError, words)


@pytest.mark.parametrize("got", [[[1.0, 2.0]], (1.0, 2.0), None])
def test_the_structure_checks_name_what_they_got(got: Any) -> None:
    name = type(got).__name__
    for check in (check_torch_structure, check_numpy_structure, check_torch, check_numpy):
        assert f"; got {name}." in _message(lambda: check(got), TypeError)  # noqa: B023


def test_a_0d_tensor_is_scanned_too() -> None:
    torch_finite(torch.tensor(1.0))
    assert _message(lambda: torch_finite(torch.tensor(float("nan"))), ValueError) == (
        "inputs must be finite: 1 element(s) are NaN or infinite, the first at index (). "
        "Clean or mask them before the all-reduce."
    )


LONG = 3 * (1 << 20) + 5
"""Elements of a long one-dimensional buffer: a rank's flat gradient bucket, say."""


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(LONG),
        lambda: torch.ones(2 * LONG)[::2],  # strided
        lambda: torch.ones(3, LONG // 3 + 1).t(),  # transposed: many short leading slices
    ],
    ids=["flat", "strided", "transposed"],
)
def test_a_long_tensor_is_scanned_in_a_few_blocks_not_element_by_element(
    make: Callable[[], torch.Tensor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NaN at the very end of a long rank tensor is found and named, and the scan asks
    ``torch.isfinite`` a bounded number of times (one call per element took 30 s for a million
    elements, past a peer's timeout in the distributed ring's refusal)."""
    x = make()
    flat_index = x.numel() - 1
    where = np.unravel_index(flat_index, tuple(x.shape))
    x[tuple(int(i) for i in where)] = float("nan")
    calls = 0
    isfinite = torch.isfinite

    def counted(t: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        assert calls <= 64, "the scan asks torch.isfinite once per small slice"
        return isfinite(t)

    monkeypatch.setattr(torch, "isfinite", counted)
    problem = rank_tensor_problem(x, 1, "gloo")
    assert problem is not None and problem.message == (
        f"inputs must be finite: 1 element(s) are NaN or infinite, the first at index "
        f"{tuple(int(i) for i in where)}. Clean or mask them before the all-reduce."
    )


def test_a_long_array_is_scanned_in_a_few_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.ones(LONG)
    x[-1] = np.inf
    calls = 0
    isfinite = np.isfinite

    def counted(a: Any) -> Any:
        nonlocal calls
        calls += 1
        assert calls <= 64, "the scan asks numpy.isfinite once per small slice"
        return isfinite(a)

    monkeypatch.setattr(np, "isfinite", counted)
    problem = rank_array_problem(x, 1)
    assert problem is not None and f"the first at index ({LONG - 1},)" in problem.message


@pytest.mark.parametrize(
    ("shape", "limit", "expected"),
    [
        ((7,), 3, [(3,), (3,), (1,)]),
        ((2, 5), 4, [(4,), (1,), (4,), (1,)]),  # one slice larger than the limit: its blocks
        ((4, 2), 5, [(2, 2), (2, 2)]),
        ((3, 0), 1, [(3, 0)]),  # nothing to scan: one empty block
        ((), 1, [()]),
    ],
)
def test_scan_blocks_cover_the_input_in_order_within_the_limit(
    shape: tuple[int, ...], limit: int, expected: list[tuple[int, ...]]
) -> None:
    x = np.arange(int(np.prod(shape))).reshape(shape)
    blocks = list(scan_blocks(x, limit))
    assert [b.shape for b in blocks] == expected
    assert np.concatenate([b.reshape(-1) for b in blocks]).tolist() == list(range(x.size))


# --- one rank's buffer: the overlap rule -------------------------------------------------------

DISTINCT = [  # (shape, element strides): no two elements share memory
    ((4,), (1,)),
    ((1, 4), (0, 1)),  # a size-1 dimension may have any stride
    ((2, 3), (3, 1)),
    ((3, 2), (1, 3)),  # transposed
    ((2, 2, 2), (1, 2, 4)),
    ((2, 2), (5, 2)),  # a strided slice
]
SHARED = [  # (shape, element strides): some two elements share memory
    ((2,), (0,)),  # expand
    ((2, 3), (2, 1)),  # rows overlap by one element
    ((2, 2, 2), (1, 2, 3)),  # (0, 0, 1) and (1, 1, 0) are both element 3
    ((3, 2), (1, 1)),
]


def _tensor(shape: tuple[int, ...], strides: tuple[int, ...]) -> torch.Tensor:
    return torch.zeros(16).as_strided(shape, strides)


def _array(shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray[Any, Any]:
    base = np.zeros(16)
    return as_strided(base, shape, tuple(s * base.itemsize for s in strides))


@pytest.mark.parametrize(("shape", "strides"), DISTINCT)
def test_layouts_with_distinct_elements_are_accepted(
    shape: tuple[int, ...], strides: tuple[int, ...]
) -> None:
    n = shape[0]
    assert rank_tensor_problem(_tensor(shape, strides), n, "gloo") is None
    assert rank_array_problem(_array(shape, strides), n) is None
    assert rank_array_problem(_array(shape, strides)[::-1], n) is None  # negative byte strides


@pytest.mark.parametrize(("shape", "strides"), SHARED)
def test_layouts_that_share_memory_are_refused_naming_the_strides(
    shape: tuple[int, ...], strides: tuple[int, ...]
) -> None:
    n = shape[0]
    problem = rank_tensor_problem(_tensor(shape, strides), n, "gloo")
    assert problem is not None and (problem.kind, problem.message) == (
        ValueError,
        f"the sum is written in place, but the layout (strides {strides}) lets elements share memory, "
        "as after expand(). Pass a tensor with distinct elements, e.g. t.clone().",
    )
    array = _array(shape, strides)
    byte_strides = tuple(8 * s for s in strides)
    problem = rank_array_problem(array, n)
    assert problem is not None and (problem.kind, problem.message) == (
        ValueError,
        f"the sum is written in place, but the layout (shape {shape}, byte strides {byte_strides}) lets "
        "elements share memory, as after numpy.lib.stride_tricks.as_strided(). Pass an array with "
        "distinct elements, e.g. a.copy().",
    )


def test_elements_overlapping_within_their_bytes_are_refused() -> None:
    base = np.zeros(4)
    half_step = as_strided(base, (3,), (4,))  # float64 elements 4 bytes apart
    problem = rank_array_problem(half_step, 3)
    assert problem is not None and "byte strides (4,)) lets elements share memory" in problem.message


# --- one rank's array (the MPI ring) ------------------------------------------------------------


def test_one_rank_array_gets_the_stacked_words_plus_its_own_rows(tmp_path: Path) -> None:
    not_array = rank_array_problem(torch.zeros(4), 2)
    assert not_array is not None and (not_array.kind, not_array.message) == (
        TypeError,
        "expects a numpy.ndarray of shape (M, ...); got Tensor.",
    )
    zero_d = rank_array_problem(np.array(1.0), 2)
    assert zero_d is not None and (zero_d.kind, zero_d.message) == (
        ValueError,
        "needs an array of shape (M, ...) with at least 1 dimension; got a 0-d array.",
    )
    indivisible = rank_array_problem(np.zeros((5, 2)), 2)
    assert indivisible is not None and indivisible.message.startswith("M = 5 is not divisible by N = 2")
    read_only = rank_array_problem(np.broadcast_to(np.zeros(1), (4,)), 2)
    assert read_only is not None and (read_only.kind, read_only.message) == (
        ValueError,
        "the sum is written in place, but the array is read-only (flags.writeable is False, as for "
        "numpy.broadcast_to()). Pass a writeable array, e.g. a.copy().",
    )
    bad = np.zeros(4)
    bad[1:3] = (np.inf, np.nan)
    found = rank_array_problem(bad, 2)
    assert found is not None and (found.kind, found.message) == (
        ValueError,
        "inputs must be finite: 2 element(s) are NaN or infinite, the first at index (1,). "
        "Clean or mask them before the all-reduce.",
    )
    assert rank_array_problem(bad, 2, finite=False) is None
    mapped = np.memmap(tmp_path / "rank.bin", dtype=np.float32, mode="w+", shape=(4,))
    assert rank_array_problem(mapped, 2) is None
    assert rank_array_problem(np.ma.masked_array(np.zeros(4)), 2) is not None


def test_one_rank_tensor_refusals_carry_the_tables_exception_types() -> None:
    device = rank_tensor_problem(torch.zeros(4), 2, "nccl")
    assert device is not None and device.kind is ValueError
    bad = torch.zeros(4)
    bad[3] = float("-inf")
    found = rank_tensor_problem(bad, 2, "gloo")
    assert found is not None and (found.kind, found.message) == (
        ValueError,
        "inputs must be finite: 1 element(s) are NaN or infinite, the first at index (3,). "
        "Clean or mask them before the all-reduce.",
    )


def test_the_even_layout_is_the_default_and_only_it_needs_m_divisible_by_n() -> None:
    words = "M = 5 is not divisible by N = 2"
    assert words in _message(lambda: check_torch(torch.ones(2, 5)), ValueError)
    assert words in _message(lambda: check_numpy(np.ones((2, 5))), ValueError)
    assert words in _message(lambda: check_torch_structure(torch.ones(2, 5)), ValueError)
    assert words in _message(lambda: check_numpy_structure(np.ones((2, 5))), ValueError)
    assert check_torch_structure(torch.ones(2, 5), divisible=False) == (2, 5)
    assert check_numpy_structure(np.ones((2, 5)), divisible=False) == (2, 5)
    assert check_torch(torch.ones(2, 5), divisible=False) == (2, 5)
    assert check_numpy(np.ones((2, 5)), divisible=False) == (2, 5)
    indivisible = rank_array_problem(np.zeros(5), 2)
    assert indivisible is not None and words in indivisible.message
    assert rank_array_problem(np.zeros(5), 2, divisible=False) is None
    indivisible = rank_tensor_problem(torch.zeros(5), 2, "gloo")
    assert indivisible is not None and words in indivisible.message
    assert rank_tensor_problem(torch.zeros(5), 2, "gloo", divisible=False) is None
    empty = rank_tensor_problem(torch.zeros(0, 3), 2, "gloo", divisible=False)
    assert empty is not None and empty.message.startswith("M = 0 rows")


# --- schedule= (clause schedule-bad-input) ------------------------------------------------------

CHOOSE = (
    "choose a preset ('spec', 'openmpi-ring', 'gloo', 'chain', 'mpich-ring', 'intel-ring', 'mlx-ring', "
    "'recursive-doubling') or a "
    "ring_ref.schedule.RingSchedule(direction, offset, layout) or ChainSchedule(layout)."
)


@pytest.mark.clause("schedule-bad-input")
def test_schedule_refusals_word_for_word() -> None:
    x = torch.ones(2, 4)
    assert _message(lambda: ring_all_reduce(x, schedule=3), TypeError) == (  # type: ignore[call-overload]
        f"schedule must be a preset name or a RingSchedule; got int; {CHOOSE}"
    )
    assert _message(lambda: ring_all_reduce(x, schedule="ring"), ValueError) == (
        f"unknown schedule 'ring'; {CHOOSE}"
    )
    rows = RingSchedule(1, 0, "rows")  # type: ignore[arg-type]
    assert _message(lambda: ring_all_reduce(x, schedule=rows), ValueError) == (
        "unknown schedule layout 'rows'; choose one of even, blocks, gloo, ceil, floor."
    )


@pytest.mark.clause("schedule-bad-input")
@pytest.mark.parametrize("direction", [1.0, -1.0, 2, 0])
def test_a_direction_that_is_not_the_int_plus_or_minus_1_is_refused_before_the_ring_runs(
    direction: object,
) -> None:
    for layout in ("even", "blocks"):
        schedule = RingSchedule(direction, 1, layout)  # type: ignore[arg-type]
        assert _message(lambda: ring_all_reduce(torch.ones(2, 4), schedule=schedule), ValueError) == (  # noqa: B023
            f"schedule direction must be +1 (worker i sends to i + 1) or -1 (to i - 1); got {direction!r}."
        )


# --- one rank's reduce-scatter and all-gather arguments (ring_ref._ranks._rules), word for word ----------


def test_a_ranks_shards_are_refused_word_for_word() -> None:
    rs, ag = Collective.REDUCE_SCATTER, Collective.ALL_GATHER
    found = [
        shards_problem(rs, 3, (5,), (1,), SPEC),  # 5 rows: the next multiple of 3 is 6
        shards_problem(rs, 4, (8, 3), (8, 3), SPEC),  # 8 rows over 4 ranks: 2 each, whole rows
        shards_problem(ag, 2, (3,), (3,), SPEC),
        shards_problem(rs, 2, (6,), (3,), RingSchedule(-1, -1, "gloo")),  # gloo cuts 6 float32 as 4 and 2
    ]
    assert [p.message if p is not None else None for p in found] == [
        "reduce-scatter gives every rank M / N rows, but M = 5 is not divisible by N = 3; pad M to a "
        "multiple of 3 (e.g. 6).",
        "the output has shape (8, 3); a reduce-scatter of an input of shape (8, 3) over N = 4 ranks gives "
        "shape (2, 3). Pass an output of that shape.",
        "the output has shape (3,); an all-gather of an input of shape (3,) over N = 2 ranks gives shape "
        "(6,). Pass an output of that shape.",
        "the 'gloo' layout cuts the 6 elements of shape (6,) into chunks of [4, 2] elements, not 2 equal "
        "shards of shape (3,); use a ring whose layout gives equal shards here (e.g. schedule='spec' or "
        "'openmpi-ring').",
    ]
    cpu = rank_shards_problem(rs, torch.zeros(2), torch.zeros(4), 2, "nccl", SPEC)  # the input's device first
    assert cpu is not None and cpu.message == "input: the nccl backend needs cuda tensors; got a cpu tensor."
    wide = rank_shards_problem(rs, torch.zeros(2, dtype=torch.float64), torch.zeros(4), 2, "gloo", SPEC)
    assert wide is not None and wide.message == (
        "output: a torch.strided torch.float64 tensor on cpu, but the input is a torch.strided "
        "torch.float32 tensor on cpu; pass a dense output of the input's dtype on its device."
    )
    nested = torch.nested.nested_tensor([torch.zeros(1), torch.zeros(1)])
    refused = rank_shards_problem(rs, nested, torch.zeros(4), 2, "gloo", SPEC)
    assert refused is not None and refused.kind is TypeError and refused.message.startswith("output: a ")
    listed = rank_array_shards_problem(rs, [0.0], np.zeros(4), 2, SPEC)
    assert listed is not None and listed.message == "output: expects a numpy.ndarray; got list."
    narrow = rank_array_shards_problem(rs, np.zeros(2, np.float32), np.zeros(4), 2, SPEC)
    assert narrow is not None and narrow.message == (
        "output: dtype float32, but the input's is float64; pass an output of the input's dtype."
    )


def test_a_shards_input_is_only_read_so_it_may_be_read_only_or_share_memory() -> None:
    frozen = np.arange(4.0)
    frozen.flags.writeable = False
    assert rank_array_shards_problem(Collective.REDUCE_SCATTER, np.zeros(2), frozen, 2, SPEC) is None
    shared = as_strided(np.arange(1.0), shape=(4,), strides=(0,))  # one element seen four times
    assert rank_array_problem(shared, 2, written=False) is None
    assert rank_array_problem(shared, 2) is not None  # written in place: refused
