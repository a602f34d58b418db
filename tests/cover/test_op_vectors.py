"""The reduction-op vectors (``spec/vectors/ring_all_reduce_ops_v1.json``): schema, drift, independent values,
and that every flag catches the bugs its note names.

Every expected value is re-derived here without ``ring_ref``: results with
``tests.common.oracles.ring_fold_op``, per-round buffers by folding the workers the
spec's provenance closed forms (``tests.common.oracles.spec_slot``) name for each slot
with the op's combine typed in from the spec (``tests.common.op_rings.combine``), bit
patterns decoded by reinterpreting integers.  The bugs are ``tests/common/op_rings.py``'s
planted faults and closed forms written below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref._cli import main
from tests.common.op_rings import combine, divide, op_ring
from tests.common.oracles import DTYPES, bits, ring_fold_op, same_bits, spec_slot
from tests.common.vector_files import (
    VECTORS,
    check_regenerated,
    check_schema_rejects,
    decode,
    expected_of,
    input_of,
    load,
)

JSON_FILE = VECTORS / "ring_all_reduce_ops_v1.json"
SCHEMA_FILE = VECTORS / "ring_all_reduce_ops_schema_v1.json"
GENERATED = (JSON_FILE.name, SCHEMA_FILE.name)
OPS = ("prod", "max", "min", "avg")
DOC: dict[str, Any] = load(JSON_FILE)
VECTOR_LIST = [(g["op"], g["dtype"], t) for g in DOC["testGroups"] for t in g["tests"]]
GROUPS = [
    pytest.param(g["op"], g["dtype"], g["tests"], id=f"{g['op']}-{g['dtype']}") for g in DOC["testGroups"]
]


# --- the file and its schema ---------------------------------------------------------------------


@pytest.mark.clause("op-vectors")
def test_committed_ops_vectors_validate_against_their_schema() -> None:
    schema = load(SCHEMA_FILE)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(DOC)
    assert DOC["numberOfTests"] == len(VECTOR_LIST)
    assert [t["tcId"] for _, _, t in VECTOR_LIST] == list(range(1, len(VECTOR_LIST) + 1))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("testGroups", 0, "tests", 0, "surprise"), 1),
        (("testGroups", 0, "surprise"), 1),
        (("surprise",), 1),
        (("testGroups", 0, "op"), "sum"),
        (("testGroups", 0, "op"), None),
        (("testGroups", 0, "dtype"), "float32"),
        (("testGroups", 0, "tests", 0, "input", 0), "3c00a"),
        (("testGroups", 2, "tests", 0, "input", 0), "3c00"),
        (("testGroups", 0, "tests", 0, "flags", 0), "NotANote"),
        (("testGroups", 0, "tests", 0, "flags"), []),
        (("testGroups", 0, "tests", 0, "tcId"), 0),
        (("testGroups", 0, "tests", 0, "expected"), None),
        (("testGroups", 0, "tests", 3, "rounds", 0, "phase"), "divide"),
        (("notes", "SumNotOp", "bugType"), None),
        (("notes", "SumNotOp", "bugType"), ""),
        (("notes", "NotANote"), {"bugType": "X", "description": "y"}),
        (("schema",), "ring_all_reduce_schema_v1.json"),
    ],
)
@pytest.mark.clause("op-vectors")
def test_schema_rejects_broken_files(path: tuple[str | int, ...], value: object) -> None:
    check_schema_rejects(SCHEMA_FILE, DOC, 4, path, value)


@pytest.mark.clause("op-vectors")
def test_regenerated_ops_vectors_are_byte_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["vectors", "--ops", "--out", str(tmp_path)]) == 0
    check_regenerated(tmp_path, capsys.readouterr().out, ("--ops",), GENERATED)


def test_ops_and_presets_are_one_file_each(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["vectors", "--ops", "--presets", "--out", str(tmp_path)])
    assert "not allowed with argument" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.clause("op-vectors", "op-choice", "supported-dtypes", "n1-no-rounds")
def test_every_op_and_dtype_has_its_group_and_the_structural_cases() -> None:
    assert [(g["op"], g["dtype"]) for g in DOC["testGroups"]] == [(op, d) for op in OPS for d in DTYPES]
    for group in DOC["testGroups"]:
        tests = group["tests"]
        assert {1, 2, 3, 5} <= {t["n"] for t in tests}
        assert any(t["trailingShape"] for t in tests)
        assert any(t["m"] > t["n"] for t in tests)
        assert any("rounds" in t for t in tests)
        for t in tests:
            if "rounds" in t:
                assert [(r["phase"], r["round"]) for r in t["rounds"]] == [
                    (p, r) for p in ("reduce-scatter", "all-gather") for r in range(t["n"] - 1)
                ]
    used = {f for _, _, t in VECTOR_LIST for f in t["flags"]}
    assert used == set(DOC["notes"])
    for note in DOC["notes"].values():
        assert note["bugType"] and len(note["description"]) > 40


@pytest.mark.parametrize(
    ("op", "result"), [("prod", [3.0, 8.0]), ("max", [3.0, 4.0]), ("min", [1.0, 2.0]), ("avg", [2.0, 3.0])]
)
@pytest.mark.clause("op-vectors", "worked-example")
def test_worked_example_under_every_op(op: str, result: list[float]) -> None:
    worked = [(d, t) for o, d, t in VECTOR_LIST if o == op and "OpWorkedExample" in t["flags"]]
    assert [d for d, _ in worked] == list(DTYPES)
    for dtype_name, t in worked:
        assert input_of(dtype_name, t).tolist() == [[1.0, 2.0], [3.0, 4.0]]
        assert expected_of(dtype_name, t).tolist() == result


# --- every value re-derived independently ----------------------------------------------------------


@pytest.mark.parametrize(("op", "dtype_name", "tests"), GROUPS)
@pytest.mark.clause("op-vectors", "op-prod", "op-max", "op-min", "op-avg")
def test_expected_results_match_the_independent_oracle(
    op: str, dtype_name: str, tests: list[dict[str, Any]]
) -> None:
    for t in tests:
        x = input_of(dtype_name, t)
        assert bool(torch.isfinite(x).all()), f"tcId {t['tcId']}: inputs are finite (clause input-finite)"
        assert same_bits(expected_of(dtype_name, t), ring_fold_op(x, op)), t["tcId"]


def _slot_fold(x: torch.Tensor, op: str, workers: list[int], rows: slice) -> torch.Tensor:
    acc = x[workers[0], rows].clone()
    for w in workers[1:]:
        acc = combine("sum" if op == "avg" else op, acc, x[w, rows])
    return acc


@pytest.mark.parametrize(("op", "dtype_name", "tests"), GROUPS)
@pytest.mark.clause("op-vectors", "inv-rs-provenance", "inv-ag-provenance")
def test_round_buffers_match_the_provenance_folded_by_the_op(
    op: str, dtype_name: str, tests: list[dict[str, Any]]
) -> None:
    """Slot c of worker i after a round holds the op's fold of the workers its provenance names;
    for avg, their sum.  An independent ring (tests/common/op_rings.py) reports the same buffers."""
    for t in tests:
        if "rounds" in t:
            _check_rounds(op, dtype_name, t)


def _check_rounds(op: str, dtype_name: str, t: dict[str, Any]) -> None:
    x = input_of(dtype_name, t)
    n, k = t["n"], t["m"] // t["n"]
    reported: list[tuple[str, int, torch.Tensor]] = []
    op_ring(x, op, lambda phase, r, b: reported.append((phase, r, b.clone())))
    assert [(p, r) for p, r, _ in reported] == [(r["phase"], r["round"]) for r in t["rounds"]]
    for rd, (_, _, ring_buffers) in zip(t["rounds"], reported, strict=True):
        buffers = decode(rd["buffers"], dtype_name, [n, t["m"], *t["trailingShape"]])
        assert same_bits(buffers, ring_buffers), (t["tcId"], rd["phase"], rd["round"])
        for i in range(n):
            for c in range(n):
                rows = slice(c * k, (c + 1) * k)
                want = _slot_fold(x, op, spec_slot(rd["phase"], rd["round"], i, c, n), rows)
                assert same_bits(buffers[i, rows], want), (t["tcId"], rd["phase"], rd["round"], i, c)


# --- every flag catches the bugs its note names ----------------------------------------------------


Bug = Callable[[torch.Tensor, str], torch.Tensor]


def _ring_bug(fault: str) -> Callable[[torch.Tensor, str, list[torch.Tensor]], torch.Tensor]:
    def run(x: torch.Tensor, op: str, rounds: list[torch.Tensor]) -> torch.Tensor:
        return op_ring(x, op, lambda _p, _r, b: rounds.append(b.clone()), fault=fault)

    return run


def _ring_fault_caught(fault: str, op: str, dtype_name: str, t: dict[str, Any]) -> bool:
    """The planted ring differs from the vector in its result or in some round's buffers."""
    x = input_of(dtype_name, t)
    rounds: list[torch.Tensor] = []
    result = _ring_bug(fault)(x, op, rounds)
    if not same_bits(result, expected_of(dtype_name, t)):
        return True
    shape = [t["n"], t["m"], *t["trailingShape"]]
    return any(
        not same_bits(got, decode(rd["buffers"], dtype_name, shape))
        for got, rd in zip(rounds, t.get("rounds", []), strict=False)
    )


def _chunked(x: torch.Tensor, per_chunk: Callable[[list[torch.Tensor]], torch.Tensor]) -> torch.Tensor:
    """Chunk c of the result from the rows of chunk c of every worker, listed in ring order c, c+1, ..."""
    n, k = x.shape[0], x.shape[1] // x.shape[0]
    return torch.cat([per_chunk([x[(c + s) % n, c * k : (c + 1) * k] for s in range(n)]) for c in range(n)])


def _finish(op: str, out: torch.Tensor, n: int) -> torch.Tensor:
    return divide(out, n) if op == "avg" else out


def _folded(
    op: str, terms: list[torch.Tensor], step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
) -> torch.Tensor:
    acc = terms[0].clone()
    for term in terms[1:]:
        acc = step(acc, term)
    return acc


def _plain(op: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return lambda a, b: combine("sum" if op == "avg" else op, a, b)


def _in_order(order: Callable[[int], list[int]]) -> Bug:
    """The op folded over the workers in ``order(n)`` for every chunk."""

    def bug(x: torch.Tensor, op: str) -> torch.Tensor:
        n = x.shape[0]
        acc = _folded(op, [x[w] for w in order(n)], _plain(op))
        return divide(acc, n) if op == "avg" else acc

    return bug


def _tree(x: torch.Tensor, op: str) -> torch.Tensor:
    terms = [x[w] for w in range(x.shape[0])]
    while len(terms) > 1:
        terms = [
            combine(op, terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i]
            for i in range(0, len(terms), 2)
        ]
    return terms[0]


def _saturating(x: torch.Tensor, op: str) -> torch.Tensor:
    top = torch.finfo(x.dtype).max
    out = _chunked(x, lambda terms: _folded(op, terms, lambda a, b: _plain(op)(a, b).clamp(-top, top)))
    return _finish(op, out, x.shape[0])


def _flush(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.abs() < torch.finfo(t.dtype).tiny, t * 0, t)


def _flush_to_zero(x: torch.Tensor, op: str) -> torch.Tensor:
    out = _chunked(_flush(x), lambda terms: _folded(op, terms, lambda a, b: _flush(_plain(op)(a, b))))
    out = _finish(op, out, x.shape[0])
    return _flush(out)


def _from_plus_zero(x: torch.Tensor, op: str) -> torch.Tensor:
    """The accumulator starts at +0 and every worker is combined into it (a max or min, or an avg)."""
    out = _chunked(x, lambda terms: _folded(op, [torch.zeros_like(terms[0]), *terms], _plain(op)))
    return _finish(op, out, x.shape[0])


def _zeros_as_plus(x: torch.Tensor, op: str) -> torch.Tensor:
    out = ring_fold_op(x, op)
    return torch.where(out == 0, torch.zeros_like(out), out)


def _ieee_2019(x: torch.Tensor, op: str) -> torch.Tensor:
    """IEEE 754-2019 maximum/minimum: -0 orders below +0, so max(-0, +0) = +0 and min(-0, +0) = -0."""

    def step(incoming: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        both_zero = (incoming == 0) & (own == 0)
        signs = (
            torch.signbit(incoming) & torch.signbit(own)
            if op == "max"
            else torch.signbit(incoming) | torch.signbit(own)
        )
        zero = torch.where(signs, -torch.zeros_like(own), torch.zeros_like(own))
        return torch.where(both_zero, zero, combine(op, incoming, own))

    return _chunked(x, lambda terms: _folded(op, terms, step))


def _to_float(value: Fraction) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _wider(x: torch.Tensor, op: str) -> torch.Tensor:
    """Accumulated in double (float64: exactly) in ring order, rounded to the dtype once at the end."""
    n = x.shape[0]

    def per_chunk(terms: list[torch.Tensor]) -> torch.Tensor:
        flat = [t.to(torch.float64).reshape(-1).tolist() for t in terms]
        out = []
        for e in range(len(flat[0])):
            if x.dtype == torch.float64:
                acc = Fraction(flat[0][e])
                for f in flat[1:]:
                    acc = acc * Fraction(f[e]) if op == "prod" else acc + Fraction(f[e])
                out.append(_to_float(acc / n if op == "avg" else acc))
            else:
                wide = flat[0][e]
                for f in flat[1:]:
                    wide = wide * f[e] if op == "prod" else wide + f[e]
                out.append(wide / n if op == "avg" else wide)
        return torch.tensor(out, dtype=torch.float64).to(x.dtype).reshape(terms[0].shape)

    return _chunked(x, per_chunk)


CLOSED_FORM_BUGS: dict[str, dict[str, Bug]] = {
    "RingOrder": {
        "worker order": _in_order(lambda n: list(range(n))),
        "reversed": _in_order(lambda n: list(range(n))[::-1]),
    },
    "RoundEveryMultiply": {"rounded once": _wider},
    "Overflow": {"saturating": _saturating},
    "Underflow": {"flush to zero": _flush_to_zero},
    "SignedZeroTie": {"IEEE 754-2019 maximum/minimum": _ieee_2019},
    "ExtremeValues": {"accumulator from +0": _from_plus_zero},
}
RING_FAULTS: dict[str, tuple[str, ...]] = {
    "SumNotOp": ("sum-not-op",),
    "CopyInAllGather": ("op-in-all-gather",),
    "SignedZeroTie": ("own-on-tie",),
    "AvgDividesOnce": ("divide-first", "premultiply"),
    "AvgRoundedReciprocal": ("reciprocal",),
}
SIGNED_ZERO_BUG: dict[str, Bug] = {"prod": _zeros_as_plus, "avg": _from_plus_zero}


@pytest.mark.parametrize(("op", "dtype_name", "tests"), GROUPS)
@pytest.mark.clause("op-vectors")
def test_every_flag_catches_the_bugs_its_note_names(
    op: str, dtype_name: str, tests: list[dict[str, Any]]
) -> None:
    for t in tests:
        _check_flags(op, dtype_name, t)


def _check_flags(op: str, dtype_name: str, t: dict[str, Any]) -> None:
    x = input_of(dtype_name, t)
    expected = expected_of(dtype_name, t)
    for flag in t["flags"]:
        for fault in RING_FAULTS.get(flag, ()):
            assert _ring_fault_caught(fault, op, dtype_name, t), (t["tcId"], flag, fault)
        bugs = dict(CLOSED_FORM_BUGS.get(flag, {}))
        if flag == "RingOrder" and op == "prod" and t["n"] >= 4:
            bugs["pairwise tree"] = _tree
        if flag == "SignedZero":
            bugs["signed zeros lost"] = SIGNED_ZERO_BUG[op]
        for name, bug in bugs.items():
            assert not same_bits(bug(x, op), expected), (t["tcId"], flag, name)


@pytest.mark.parametrize("op", ["prod", "avg"])
@pytest.mark.clause("op-vectors")
def test_some_overflow_vector_catches_wider_accumulation(op: str) -> None:
    for dtype_name in DTYPES:
        overflow = [t for o, d, t in VECTOR_LIST if (o, d) == (op, dtype_name) and "Overflow" in t["flags"]]
        assert any(
            not same_bits(_wider(input_of(dtype_name, t), op), expected_of(dtype_name, t)) for t in overflow
        )


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.clause("op-vectors", "op-trace")
def test_max_and_min_in_all_gather_pass_every_vector_so_none_claims_to_catch_it(op: str) -> None:
    """The equivalent fault of clause op-trace: no vector of max or min can tell it, and none says it does."""
    for o, dtype_name, t in VECTOR_LIST:
        if o == op:
            assert "CopyInAllGather" not in t["flags"]
            assert not _ring_fault_caught("op-in-all-gather", op, dtype_name, t)


def test_the_reference_engine_reproduces_every_vector() -> None:
    """The generator refuses a vector the engine disagrees on; this checks the committed file."""
    from ring_ref import ring_all_reduce

    for op, dtype_name, t in VECTOR_LIST:
        assert same_bits(ring_all_reduce(input_of(dtype_name, t), op=op), expected_of(dtype_name, t)), t[
            "tcId"
        ]


def test_decode_reads_negative_patterns() -> None:
    t = decode(["8000", "3c00"], "float16", [2])
    assert bits(t).tolist() == [-32768, 15360]
