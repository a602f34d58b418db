"""Every row of the spec's ``bad-input`` table: the documented exception, a message
naming the problem, and the input left as it was."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref._ranks._rules import rank_tensor_problem
from ring_ref.schedule import Collective, RingSchedule
from tests.common.paths import SPEC, SPEC_DIR

pytestmark = pytest.mark.clause(
    "bad-input", "input-shape", "supported-dtypes", "input-finite", "engines-same-bits"
)


def _snapshot(x: object) -> object:
    """Bytes, strides and dtype of an input (its repr for non-arrays)."""
    if isinstance(x, torch.Tensor):
        if x.is_sparse or x.is_nested or x.is_meta:
            return None
        return (x.contiguous().reshape(-1).view(torch.uint8).clone(), x.stride(), x.dtype)
    if isinstance(x, np.ndarray):
        return (np.asarray(x).tobytes() if x.dtype != object else x.tolist(), x.strides, x.dtype)
    return repr(x)


def _unchanged(x: object, snap: object) -> bool:
    if snap is None:
        return True
    if isinstance(x, torch.Tensor):
        assert isinstance(snap, tuple)
        same_bytes = bool(torch.equal(x.contiguous().reshape(-1).view(torch.uint8), snap[0]))
        return same_bytes and x.stride() == snap[1] and x.dtype == snap[2]
    if isinstance(x, np.ndarray):
        assert isinstance(snap, tuple)
        now = np.asarray(x).tobytes() if x.dtype != object else x.tolist()
        return bool(now == snap[0]) and (x.strides, x.dtype) == snap[1:]
    return repr(x) == snap


NOT_AN_ARRAY = "expects worker_tensors as one torch.Tensor or numpy.ndarray"

CASES: list[tuple[str, Any, type[Exception], str]] = [
    ("list", [[1.0, 2.0], [3.0, 4.0]], TypeError, "torch.stack"),
    ("tuple-of-tensors", (torch.ones(2), torch.ones(2)), TypeError, NOT_AN_ARRAY),
    ("scalar", 3.0, TypeError, NOT_AN_ARRAY),
    ("none", None, TypeError, NOT_AN_ARRAY),
    ("torch-1d", torch.ones(4), ValueError, "at least 2 dimensions"),
    ("torch-0d", torch.tensor(1.0), ValueError, "at least 2 dimensions"),
    ("numpy-1d", np.ones(4), ValueError, "at least 2 dimensions"),
    ("torch-n0", torch.ones(0, 4), ValueError, "N = 0"),
    ("numpy-n0", np.ones((0, 4)), ValueError, "N = 0"),
    ("torch-m0", torch.ones(2, 0), ValueError, "M = 0"),
    ("numpy-m0", np.ones((2, 0, 3)), ValueError, "M = 0"),
    ("torch-trailing-0", torch.ones(2, 2, 0), ValueError, "trailing dimensions must be positive"),
    ("numpy-trailing-0", np.ones((2, 2, 3, 0)), ValueError, "trailing dimensions must be positive"),
    ("torch-indivisible", torch.ones(2, 5), ValueError, "M = 5 is not divisible by N = 2"),
    ("numpy-indivisible", np.ones((4, 6)), ValueError, "M = 6 is not divisible by N = 4"),
    ("torch-int", torch.ones(2, 2, dtype=torch.int64), TypeError, "unsupported dtype"),
    ("torch-bool", torch.ones(2, 2, dtype=torch.bool), TypeError, "unsupported dtype"),
    ("torch-complex", torch.ones(2, 2, dtype=torch.complex64), TypeError, "unsupported dtype"),
    ("torch-float8", torch.ones(2, 2).to(torch.float8_e4m3fn), TypeError, "unsupported dtype"),
    ("numpy-int", np.ones((2, 2), dtype=np.int32), TypeError, "unsupported dtype"),
    ("numpy-bool", np.ones((2, 2), dtype=bool), TypeError, "unsupported dtype"),
    ("numpy-complex", np.ones((2, 2), dtype=np.complex128), TypeError, "unsupported dtype"),
    ("numpy-longdouble", np.ones((2, 2), dtype=np.longdouble), TypeError, "unsupported dtype"),
    ("numpy-object", np.array([[1.0, 2.0], [3.0, 4.0]], dtype=object), TypeError, "unsupported dtype"),
    ("torch-nan", torch.tensor([[1.0, float("nan")], [3.0, 4.0]]), ValueError, "must be finite"),
    ("torch-inf", torch.tensor([[1.0, 2.0], [float("-inf"), 4.0]]), ValueError, "must be finite"),
    ("numpy-nan", np.array([[1.0, np.nan], [3.0, 4.0]], dtype=np.float16), ValueError, "must be finite"),
    ("torch-sparse", torch.eye(2).to_sparse(), TypeError, "dense strided tensor"),
    (
        "torch-nested",
        torch.nested.nested_tensor([torch.ones(2), torch.ones(2)]),
        TypeError,
        "dense strided tensor",
    ),
    ("torch-meta", torch.empty(2, 2, device="meta"), ValueError, "meta device"),
    (
        "numpy-masked",
        np.ma.masked_array(np.ones((2, 2)), mask=np.array([[False, True], [False, False]])),
        TypeError,
        "ndarray subclass",
    ),
    ("numpy-matrix", np.asmatrix(np.ones((2, 2))), TypeError, "ndarray subclass"),
    ("numpy-big-endian", np.ones((2, 2), dtype=">f4"), TypeError, "byte order is the problem"),
]


CASES.append(("unknown-engine", torch.ones(2, 2), ValueError, "unknown engine"))
CASES.append(("unknown-op", torch.ones(2, 2), ValueError, "unknown reduction op"))


@pytest.mark.parametrize(("x", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_bad_input_raises_documented_error(x: Any, error: type[Exception], message: str, engine: str) -> None:
    snap = _snapshot(x)
    with pytest.raises(error, match=re.escape(message)):
        engine_arg = "no-such-engine" if message == "unknown engine" else engine
        op = "no-such-op" if message == "unknown reduction op" else "sum"
        ring_all_reduce(x, engine=engine_arg, op=op)  # type: ignore[call-overload]
    assert _unchanged(x, snap)


def test_messages_name_the_fix() -> None:
    with pytest.raises(ValueError, match=r"Pad M to a multiple of 2 \(e\.g\. 6\)"):
        ring_all_reduce(torch.ones(2, 5))
    with pytest.raises(TypeError, match=r"x\.to\(torch\.float32\)"):
        ring_all_reduce(torch.ones(2, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"the first at index \(1, 0\)"):
        ring_all_reduce(np.array([[1.0, 2.0], [np.inf, 4.0]]))


def test_every_table_row_of_the_spec_is_tested() -> None:
    text = SPEC.read_text(encoding="utf-8")
    table = text[text.index("### `bad-input`") :].split("\n## ")[0]
    rows = [
        line.split("|")[3].strip()
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| case")
    ]
    assert len(rows) >= 10
    tested = [c[3] for c in CASES]
    for cell in rows:
        pattern = re.escape(cell.split("`")[1]).replace("<M>", r"\d+").replace("<N>", r"\d+")
        assert any(re.search(pattern, message) for message in tested), f"untested row: {cell}"


@pytest.mark.parametrize("engine", ["reference", "fast"])
def test_memmap_inputs_are_reduced_like_plain_arrays(tmp_path: Path, engine: str) -> None:
    plain = np.arange(36, dtype=np.float32).reshape(3, 6, 2) / 7
    mapped = np.memmap(tmp_path / "x.bin", dtype=np.float32, mode="w+", shape=plain.shape)
    mapped[:] = plain
    got = ring_all_reduce(mapped, engine=engine)  # type: ignore[call-overload]
    assert type(got) is np.ndarray
    assert got.tobytes() == ring_all_reduce(plain).tobytes()
    assert np.array_equal(np.asarray(mapped), plain)


def test_byte_order_message_names_the_fix() -> None:
    with pytest.raises(TypeError, match=re.escape("x.astype(x.dtype.newbyteorder('='))")):
        ring_all_reduce(np.ones((2, 2), dtype=">f8"))
    with pytest.raises(TypeError, match="unsupported dtype"):
        ring_all_reduce(np.ones((2, 2), dtype=">i4"))


SAME_PROBLEM: list[tuple[str, list[Any], Any]] = [
    ("indivisible", [torch.ones(2, 5), np.ones((2, 5))], torch.ones(5)),
    ("int dtype", [torch.ones(2, 2, dtype=torch.int32)], torch.ones(2, dtype=torch.int32)),
    ("meta", [torch.ones(2, 2, device="meta")], torch.ones(2, device="meta")),
    ("sparse", [torch.eye(2).to_sparse()], torch.eye(2).to_sparse()),
]


@pytest.mark.parametrize(
    ("stacked", "per_rank"), [c[1:] for c in SAME_PROBLEM], ids=[c[0] for c in SAME_PROBLEM]
)
def test_every_entry_point_words_the_same_problem_the_same_way(stacked: list[Any], per_rank: Any) -> None:
    """The reference, the fast engine, numpy and the distributed ring's per-rank check agree word for word."""
    messages = set()
    for x in stacked:
        for engine in ("reference", "fast"):
            with pytest.raises((TypeError, ValueError)) as caught:
                ring_all_reduce(x, engine=engine)
            messages.add(str(caught.value))
    problem = rank_tensor_problem(per_rank, 2, "gloo")
    assert problem is not None
    messages.add(problem.message)
    assert len(messages) == 1, messages


def test_non_finite_message_counts_every_bad_element_and_names_the_first() -> None:
    x = torch.zeros(3, 6)
    x[1, 4] = float("inf")
    x[2, 0] = float("nan")
    x[1, 5] = float("-inf")
    for engine in ("reference", "fast"):
        with pytest.raises(
            ValueError, match=re.escape("3 element(s) are NaN or infinite, the first at index (1, 4)")
        ):
            ring_all_reduce(x, engine=engine)
    with pytest.raises(
        ValueError, match=re.escape("2 element(s) are NaN or infinite, the first at index (0, 1)")
    ):
        ring_all_reduce(np.array([[0.0, np.nan], [np.inf, 0.0]]))


# --- reduce-scatter and all-gather on ranks (spec/reduce_scatter_all_gather.md, dist-shards-bad-input) ---

SHARD_CASES: list[tuple[str, str, Any, Any, object, type[Exception], str]] = [
    # (id, collective, output, input, schedule=, exception, message fragment), on N = 3 ranks
    (
        "output-list",
        "reduce-scatter",
        [0.0],
        torch.zeros(3),
        None,
        TypeError,
        "output: expects a torch.Tensor",
    ),
    (
        "output-dtype",
        "all-gather",
        torch.zeros(3, dtype=torch.float64),
        torch.zeros(1),
        None,
        TypeError,
        "output: a torch.strided torch.float64 tensor on cpu, but the input is a torch.strided torch.float32",
    ),
    (
        "rs-shape",
        "reduce-scatter",
        torch.zeros(2),
        torch.zeros(3),
        None,
        ValueError,
        "the output has shape (2,)",
    ),
    ("ag-shape", "all-gather", torch.zeros(3, 2), torch.zeros(1), None, ValueError, "gives shape (3,)"),
    ("rows", "reduce-scatter", torch.zeros(1), torch.zeros(4), None, ValueError, "is not divisible by N = 3"),
    (
        "offset",
        "reduce-scatter",
        torch.zeros(1),
        torch.zeros(3),
        RingSchedule(1, 0, "even"),
        ValueError,
        "leave chunk r at rank r, which a ring does only when its offset equals its direction",
    ),
    (  # gloo's layout cuts 3 float32 elements into chunks of 2, 1 and 0
        "layout",
        "reduce-scatter",
        torch.zeros(1),
        torch.zeros(3),
        "gloo",
        ValueError,
        "into chunks of [2, 1, 0] elements, not 3 equal shards",
    ),
    (
        "output-overlap",
        "all-gather",
        torch.zeros(1, 2).expand(3, 2),
        torch.zeros(1, 2),
        None,
        ValueError,
        "lets elements share memory",
    ),
    (
        "rs-nan",
        "reduce-scatter",
        torch.zeros(1),
        torch.tensor([0.0, float("nan"), 1.0]),
        None,
        ValueError,
        "finite",
    ),
]


def _shards_problem(
    collective: str, output: Any, tensor: Any, schedule: object
) -> tuple[type[Exception], str]:
    from ring_ref._ranks._check import Shards, ring_for
    from ring_ref._ranks._rules import rank_shards_problem

    the = Collective(collective)
    ring, bad = ring_for(Shards(the, output, tensor), schedule, 3)
    problem = bad if ring is None else rank_shards_problem(the, output, tensor, 3, "gloo", ring)
    assert problem is not None
    return problem.kind, problem.message


@pytest.mark.clause("dist-shards-bad-input")
@pytest.mark.parametrize("case", SHARD_CASES, ids=[c[0] for c in SHARD_CASES])
def test_each_shards_row_gets_its_exception_and_message(
    case: tuple[str, str, Any, Any, object, type[Exception], str],
) -> None:
    _, collective, output, tensor, schedule, error, fragment = case
    kind, message = _shards_problem(collective, output, tensor, schedule)
    assert (kind, fragment in message) == (error, True), message


@pytest.mark.clause("dist-shards-bad-input")
def test_good_shards_pass_and_inputs_are_only_read() -> None:
    """Well-shaped pairs pass, on every preset whose layout cuts equal shards; an all-gather takes
    any value and an input whose elements share memory (it is only read)."""
    from ring_ref._ranks._check import Shards, ring_for
    from ring_ref._ranks._rules import rank_shards_problem

    pairs = [
        ("reduce-scatter", torch.zeros(2, 2), torch.zeros(6, 2)),
        ("all-gather", torch.zeros(6, 2), torch.full((2, 2), float("nan"))),
        ("all-gather", torch.zeros(3, 2), torch.zeros(1, 1).expand(1, 2)),
    ]
    for collective, output, tensor in pairs:
        for schedule in (None, "spec", "openmpi-ring", RingSchedule(-1, -1, "even")):
            ring, bad = ring_for(Shards(Collective(collective), output, tensor), schedule, 3)
            assert bad is None and ring is not None
            assert rank_shards_problem(Collective(collective), output, tensor, 3, "gloo", ring) is None


@pytest.mark.clause("dist-shards-bad-input")
def test_every_row_of_the_shards_table_is_tested() -> None:
    text = (SPEC_DIR / "reduce_scatter_all_gather.md").read_text(encoding="utf-8")
    table = text[text.index("### `dist-shards-bad-input`") :].split("\n### ")[0]
    rows = [
        line.split("|")[3].strip()
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith("| case")
    ]
    assert len(rows) >= 7
    tested = [c[-1] for c in SHARD_CASES]
    for cell in rows:
        pattern = re.escape(cell.split("`")[1]).replace("<N>", r"\d+")
        assert any(re.search(pattern, fragment) for fragment in tested), f"untested row: {cell}"


@pytest.mark.clause("dist-shards-bad-input")
def test_the_numpy_twin_words_the_shards_rows_alike() -> None:
    """``ring_ref.mpi``'s check: the same rows for arrays, plus a read-only output; good pairs pass."""
    from ring_ref._ranks._rules import rank_array_shards_problem

    spec, f32 = RingSchedule(1, 1, "even"), np.float32
    read_only = np.zeros(1, np.float32)
    read_only.flags.writeable = False
    rows = [
        ("reduce-scatter", [0.0], np.zeros(3, f32), TypeError, "output: expects a numpy.ndarray"),
        ("all-gather", np.zeros(3), np.zeros(1, f32), TypeError, "output: dtype float64, but the input's"),
        ("reduce-scatter", np.zeros(2, f32), np.zeros(3, f32), ValueError, "has shape (2,)"),
        ("reduce-scatter", np.zeros(1, f32), np.zeros(4, f32), ValueError, "by N = 3"),
        ("reduce-scatter", read_only, np.zeros(3, f32), ValueError, "output: the sum is written in place"),
        (
            "reduce-scatter",
            np.zeros(1),
            np.array([0.0, np.inf, 1.0]),
            ValueError,
            "input: inputs must be finite",
        ),
    ]
    for collective, output, array, error, fragment in rows:
        problem = rank_array_shards_problem(Collective(collective), output, array, 3, spec)
        assert problem is not None and (problem.kind, fragment in problem.message) == (error, True), problem
    assert rank_array_shards_problem(Collective.ALL_GATHER, np.zeros(3), np.array([np.nan]), 3, spec) is None
    assert (
        rank_array_shards_problem(Collective.REDUCE_SCATTER, np.zeros((1, 2)), np.zeros((3, 2)), 3, spec)
        is None
    )
