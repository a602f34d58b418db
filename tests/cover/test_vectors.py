"""The conformance vectors: schema, no drift, coverage and independent cross-checks.

The C consumer has its own module, ``tests/nocover/test_c_consumer.py``.

Every expected value in ``spec/vectors`` is re-derived here without
``ring_ref``: results with ``tests.common.oracles.ring_fold``, per-round buffers with
the spec's provenance closed forms folded in the dtype, bit patterns decoded by
reinterpreting integers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref._cli import main
from ring_ref._vectors import _ops, _presets, _sums
from tests.common.oracles import DTYPES, exact_sum, ring_fold, spec_slot
from tests.common.vector_files import (
    VECTORS,
    check_regenerated,
    check_schema_rejects,
    decode,
    encode,
    input_of,
    load,
)

JSON_FILE = VECTORS / "ring_all_reduce_v1.json"
SCHEMA_FILE = VECTORS / "ring_all_reduce_schema_v1.json"
TEXT_FILE = VECTORS / "ring_all_reduce_v1.txt"
GENERATED = (JSON_FILE.name, SCHEMA_FILE.name, TEXT_FILE.name)
MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}


DOC: dict[str, Any] = load(JSON_FILE)
VECTOR_LIST = [(group["dtype"], t) for group in DOC["testGroups"] for t in group["tests"]]


def _ids(v: tuple[str, dict[str, Any]]) -> str:
    return f"{v[0]}-tc{v[1]['tcId']}"


@pytest.mark.clause("fold-order", "input-finite")
def test_committed_vectors_validate_against_their_schema() -> None:
    schema = load(SCHEMA_FILE)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(DOC)
    assert DOC["numberOfTests"] == len(VECTOR_LIST)
    assert [t["tcId"] for _, t in VECTOR_LIST] == list(range(1, len(VECTOR_LIST) + 1))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("testGroups", 0, "tests", 0, "surprise"), 1),
        (("testGroups", 0, "tests", 0, "input", 0), "3c00a"),
        (("testGroups", 2, "tests", 0, "input", 0), "3c00"),
        (("testGroups", 0, "tests", 0, "flags", 0), "NotANote"),
        (("notes", "Random", "bugType"), None),
        (("notes", "Random", "bugType"), ""),
        (("testGroups", 0, "tests", 0, "flags"), []),
    ],
)
def test_schema_rejects_broken_files(path: tuple[str | int, ...], value: object) -> None:
    check_schema_rejects(SCHEMA_FILE, DOC, 1, path, value)


def test_regenerated_vectors_are_byte_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vectors", "--out", str(tmp_path)]) == 0
    check_regenerated(tmp_path, capsys.readouterr().out, (), GENERATED)


@pytest.mark.parametrize("write", [_sums.write, _ops.write, _presets.write], ids=["sums", "ops", "presets"])
def test_writing_into_a_file_is_refused_before_anything_is_written(
    tmp_path: Path, write: Callable[[Path], list[Path]]
) -> None:
    target = tmp_path / "not_a_dir"
    target.write_text("keep me", encoding="utf-8")
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        write(target)
    assert target.read_text(encoding="utf-8") == "keep me"


@pytest.mark.clause("n1-no-rounds", "worked-example", "chunk-layout", "supported-dtypes")
def test_vectors_cover_the_required_cases() -> None:
    assert [g["dtype"] for g in DOC["testGroups"]] == list(DTYPES)
    for group in DOC["testGroups"]:
        tests = group["tests"]
        ns = {t["n"] for t in tests}
        assert {1, 2, 3, 5, 7} <= ns
        assert any(t["trailingShape"] for t in tests)
        assert any(t["m"] > t["n"] for t in tests)
        flags = {f for t in tests for f in t["flags"]}
        assert flags == set(DOC["notes"])
    worked = [t for dt, t in VECTOR_LIST if dt == "float32" and "WorkedExample" in t["flags"]]
    assert len(worked) == 1
    assert decode(worked[0]["input"], "float32", [2, 2]).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert decode(worked[0]["expected"], "float32", [2]).tolist() == [4.0, 6.0]
    after_rs = worked[0]["rounds"][0]
    assert (after_rs["phase"], decode(after_rs["buffers"], "float32", [2, 2]).tolist()) == (
        "reduce-scatter",
        [[1.0, 6.0], [4.0, 4.0]],
    )


def test_every_note_explains_a_flag_with_a_bug_type() -> None:
    used = {f for _, t in VECTOR_LIST for f in t["flags"]}
    assert used == set(DOC["notes"])
    for note in DOC["notes"].values():
        assert note["bugType"]
        assert len(note["description"]) > 40


@pytest.mark.parametrize("vector", VECTOR_LIST, ids=_ids)
@pytest.mark.clause("fold-order", "return-worker-zero")
def test_expected_results_match_the_independent_ring_fold(vector: tuple[str, dict[str, Any]]) -> None:
    dtype_name, t = vector
    x = input_of(dtype_name, t)
    assert encode(ring_fold(x)) == t["expected"]


@pytest.mark.parametrize("vector", [v for v in VECTOR_LIST if "rounds" in v[1]], ids=_ids)
@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "simultaneous-rounds")
def test_per_round_buffers_match_the_provenance_closed_form(vector: tuple[str, dict[str, Any]]) -> None:
    dtype_name, t = vector
    x = input_of(dtype_name, t)
    n, k = t["n"], t["m"] // t["n"]
    order = [("reduce-scatter", r) for r in range(n - 1)] + [("all-gather", r) for r in range(n - 1)]
    assert [(rd["phase"], rd["round"]) for rd in t["rounds"]] == order
    for rd in t["rounds"]:
        want = torch.empty_like(x)
        for i in range(n):
            for c in range(n):
                workers = spec_slot(rd["phase"], rd["round"], i, c, n)
                acc = x[workers[0], c * k : (c + 1) * k]
                for w in workers[1:]:
                    acc = acc + x[w, c * k : (c + 1) * k]
                want[i, c * k : (c + 1) * k] = acc
        assert rd["buffers"] == encode(want), (rd["phase"], rd["round"])


def _flagged(flag: str) -> list[tuple[str, dict[str, Any]]]:
    return [v for v in VECTOR_LIST if flag in v[1]["flags"]]


def _worker_order_fold(x: torch.Tensor) -> torch.Tensor:
    acc = x[0]
    for w in range(1, x.shape[0]):
        acc = acc + x[w]
    return acc


def _tree_fold(x: torch.Tensor) -> torch.Tensor:
    parts: list[torch.Tensor] = list(x)
    while len(parts) > 1:
        pairs = [parts[j] + parts[j + 1] for j in range(0, len(parts) - 1, 2)]
        parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


@pytest.mark.parametrize("vector", _flagged("RingOrder"), ids=_ids)
@pytest.mark.clause("fold-order")
def test_ring_order_vectors_tell_ring_order_from_other_orders(vector: tuple[str, dict[str, Any]]) -> None:
    dtype_name, t = vector
    x = input_of(dtype_name, t)
    for other in (_worker_order_fold(x), _tree_fold(x), _worker_order_fold(x.flip(0))):
        assert encode(other) != t["expected"]


@pytest.mark.parametrize("vector", _flagged("RoundEveryAdd"), ids=_ids)
@pytest.mark.clause("fold-order")
def test_round_every_add_vectors_differ_from_exact_accumulation(vector: tuple[str, dict[str, Any]]) -> None:
    dtype_name, t = vector
    x = input_of(dtype_name, t)
    exact = torch.tensor([float(v) for v in exact_sum(x)], dtype=torch.float64).to(x.dtype)
    assert encode(exact) != t["expected"]


@pytest.mark.clause("input-finite")
def test_edge_case_flags_hold_what_they_claim() -> None:
    def exponent_field(h: str, dtype_name: str) -> tuple[int, int]:
        v, mb = int(h, 16), MANTISSA_BITS[dtype_name]
        width = len(h) * 4
        return (v >> mb) & ((1 << (width - 1 - mb)) - 1), v & ((1 << mb) - 1)

    for dtype_name, t in _flagged("Overflow"):
        assert any(
            exponent_field(h, dtype_name) == ((1 << (len(h) * 4 - 1 - MANTISSA_BITS[dtype_name])) - 1, 0)
            for h in t["expected"]
        ), t["tcId"]
        assert torch.isfinite(input_of(dtype_name, t)).all()
    assert any(dt == "float16" for dt, _ in _flagged("Overflow"))
    for _, t in _flagged("SignedZero"):
        negative_zero = "8" + "0" * (len(t["expected"][0]) - 1)
        assert negative_zero in t["input"], t["tcId"]
        assert negative_zero in t["expected"], t["tcId"]
    for dtype_name, t in _flagged("Subnormal"):
        subnormal = [
            h
            for h in t["input"] + t["expected"]
            if exponent_field(h, dtype_name)[0] == 0 and exponent_field(h, dtype_name)[1] != 0
        ]
        assert subnormal, t["tcId"]


def test_text_companion_holds_the_same_vectors() -> None:
    tokens = [
        line.split()
        for line in TEXT_FILE.read_text(encoding="utf-8").splitlines()
        if not line.startswith("#")
    ]
    assert tokens[0] == ["vectors", str(DOC["numberOfTests"])]
    lines = iter(tokens[1:])
    for dtype_name, t in VECTOR_LIST:
        assert next(lines) == [
            "test",
            str(t["tcId"]),
            dtype_name,
            str(t["n"]),
            str(t["m"]),
            str(len(t["trailingShape"])),
            *map(str, t["trailingShape"]),
        ]
        assert next(lines) == ["flags", str(len(t["flags"])), *t["flags"]]
        assert next(lines) == ["input", str(len(t["input"])), *t["input"]]
        assert next(lines) == ["expected", str(len(t["expected"])), *t["expected"]]
        rounds = t.get("rounds", [])
        assert next(lines) == ["rounds", str(len(rounds))]
        for rd in rounds:
            assert next(lines) == [
                "round",
                rd["phase"],
                str(rd["round"]),
                str(len(rd["buffers"])),
                *rd["buffers"],
            ]
        assert next(lines) == ["end"]
    assert next(lines, None) is None
