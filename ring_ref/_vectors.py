"""Language-agnostic conformance vectors (``ring-ref vectors --out DIR``).

Wycheproof-style files: a header, ``notes`` explaining every flag with a
``bugType``, and test groups (one per dtype) of vectors, each with a ``tcId``,
``comment``, ``flags``, the parameters ``n``, ``m``, ``trailingShape``, the
inputs and expected output as exact bit patterns, and for small cases every
worker's buffers after every round.  Three files are written:

* ``ring_all_reduce_v1.json``: the vectors;
* ``ring_all_reduce_schema_v1.json``: their JSON schema (``additionalProperties: false`` throughout);
* ``ring_all_reduce_v1.txt``: the same vectors as whitespace-separated tokens, for readers
  without a JSON parser (``examples/c``).

A bit pattern is the element's IEEE encoding as a fixed-width lowercase hex
integer (``"3c00"`` is float16 1.0); tensors are flattened in row-major order of
their shape (``(n, m, *trailingShape)`` for inputs and buffers, ``(m,
*trailingShape)`` for the result).  Values are drawn from ``random.Random`` with
fixed seeds, so regenerated files are byte-identical.  Expected values come
from the reference: :func:`ring_ref.ring_all_reduce` on CPU for the result, and
:func:`ring_ref._tracecheck.reference_rounds` for the per-round buffers.

>>> to_hex(torch.tensor([1.0, -0.0], dtype=torch.float16))
['3c00', '8000']
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ring_ref._dispatch import ring_all_reduce
from ring_ref._dtypes import FORMATS, to_hex
from ring_ref._tracecheck import reference_rounds
from ring_ref.schedule import PHASES

VERSION = 1
SEED = 4104
JSON_NAME = f"ring_all_reduce_v{VERSION}.json"
SCHEMA_NAME = f"ring_all_reduce_schema_v{VERSION}.json"
TEXT_NAME = f"ring_all_reduce_v{VERSION}.txt"
ROUND_BUFFER_LIMIT = 96
"""Per-round buffers are included when the input has at most this many elements."""

NOTES: dict[str, dict[str, str]] = {
    "WorkedExample": {
        "bugType": "BASIC",
        "description": "The spec's worked example (clause worked-example): [1, 2] and [3, 4] give [4, 6] "
        "after reduce-scatter buffers [1, 6] and [4, 4]. Fails an average instead of a sum, or a "
        "swapped send/receive direction.",
    },
    "SingleWorker": {
        "bugType": "EDGE_CASE",
        "description": "N = 1: no round runs and the result is the worker's own values (clause "
        "n1-no-rounds). Fails implementations that divide by N - 1, loop once, or index a missing neighbour.",
    },
    "PrimeWorkers": {
        "bugType": "MODULAR_INDEXING",
        "description": "A prime N > 2: the chunk indices (i - r) mod N and (i + 1 - r) mod N visit every "
        "residue, so an off-by-one in the modular arithmetic cannot hide behind a period of N.",
    },
    "MultiRowChunk": {
        "bugType": "WRONG_LAYOUT",
        "description": "M / N > 1: a chunk is a block of M / N consecutive rows (clause chunk-layout). Fails "
        "interleaved (strided) chunking and chunks of one row.",
    },
    "TrailingDims": {
        "bugType": "WRONG_LAYOUT",
        "description": "Each worker holds (M, ...) with trailing dimensions; chunks split the leading "
        "axis only and keep trailing dimensions whole. Fails splitting the flattened tensor into N "
        "equal pieces.",
    },
    "RingOrder": {
        "bugType": "WRONG_ORDER",
        "description": "Values chosen so that chunk c's left fold in ring order c, c+1, ..., c-1 (clause "
        "fold-order) differs from the fold in worker order 0, 1, ..., N-1, from the reversed order "
        "and from a pairwise tree; for example x_c = B, x_(c+1) = -B and every other worker 1, with B "
        "so large that B + 1 rounds to B, or (max + max) + -max = inf against (-max + max) + max = max.",
    },
    "RoundEveryAdd": {
        "bugType": "WIDENED_ACCUMULATION",
        "description": "Every addition is rounded to the input dtype (clause fold-order): x_c = 2^p "
        "(p = significand bits, so the spacing there is 2) followed by ones, each of which is lost to "
        "round-half-to-even. Fails "
        "accumulating in a wider type (float32 for float16, double for float32, long double for double).",
    },
    "Overflow": {
        "bugType": "OVERFLOW",
        "description": "Sums that overflow round to infinity, the correctly rounded result (clause "
        "input-finite): max + max = inf, and max + ulp(max)/2 = inf by round-half-to-even while "
        "max + ulp(max)/4 = max. Fails saturating arithmetic, wider accumulation, or rejecting the result.",
    },
    "SignedZero": {
        "bugType": "SIGNED_ZERO",
        "description": "IEEE signed zeros: -0 + -0 = -0, -0 + +0 = +0, x + (-x) = +0. Fails implementations "
        "that start from a +0 accumulator (+0 + -0 = +0 loses the sign) or compare with ==.",
    },
    "Subnormal": {
        "bugType": "SUBNORMAL",
        "description": "Subnormal inputs and sums (gradual underflow): the smallest subnormal doubled, the "
        "largest subnormal plus the smallest reaching the smallest normal, and a normal minus a subnormal "
        "giving a subnormal. Fails flush-to-zero / denormals-are-zero modes.",
    },
    "Random": {
        "bugType": "BASIC",
        "description": "Pseudo-random values in [-8, 8) rounded to the dtype (fixed seed); checks the "
        "ordinary arithmetic of the whole schedule.",
    },
}


class Case(NamedTuple):
    """One vector before its expected values are computed."""

    comment: str
    flags: tuple[str, ...]
    x: torch.Tensor


def _tensor(values: Sequence[float], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(dtype).reshape(shape)


def _random(rng: random.Random, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    count = 1
    for d in shape:
        count *= d
    return _tensor([rng.uniform(-8.0, 8.0) for _ in range(count)], shape, dtype)


def _by_chunk(n: int, rows: int, pattern: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
    """Worker ``(c + k) mod n`` holds ``pattern[k]`` throughout chunk ``c`` (``rows`` rows per chunk)."""
    values = [[0.0] * (n * rows) for _ in range(n)]
    for c in range(n):
        for k, v in enumerate(pattern):
            for row in range(rows):
                values[(c + k) % n][c * rows + row] = v
    return _tensor([v for worker in values for v in worker], (n, n * rows), dtype)


def cases(name: str) -> list[Case]:
    """Every vector of dtype ``name``, in ``tcId`` order within the dtype."""
    fmt = FORMATS[name]
    dtype = fmt.torch_dtype
    rng = random.Random(SEED + fmt.bits * 10 + fmt.precision)
    big = 2.0 ** (fmt.precision + 1)
    tie = 2.0**fmt.precision
    top, ulp, tiny = fmt.max_finite, fmt.ulp_of_max, fmt.min_subnormal
    normal = 2.0**fmt.emin
    largest_sub = normal - tiny
    return [
        Case(
            "worked example: [1, 2] and [3, 4] give [4, 6]",
            ("WorkedExample",),
            _tensor([1, 2, 3, 4], (2, 2), dtype),
        ),
        Case("one worker: the result is its own values", ("SingleWorker",), _random(rng, (1, 3), dtype)),
        Case(
            "one worker with a trailing dimension",
            ("SingleWorker", "TrailingDims"),
            _random(rng, (1, 2, 2), dtype),
        ),
        Case("two workers", ("Random",), _random(rng, (2, 4), dtype)),
        Case("three workers, one element per chunk", ("PrimeWorkers", "Random"), _random(rng, (3, 3), dtype)),
        Case(
            "five workers, two rows per chunk",
            ("PrimeWorkers", "MultiRowChunk", "Random"),
            _random(rng, (5, 10), dtype),
        ),
        Case("seven workers", ("PrimeWorkers", "Random"), _random(rng, (7, 7), dtype)),
        Case("four workers, two rows per chunk", ("MultiRowChunk", "Random"), _random(rng, (4, 8), dtype)),
        Case("eight workers, two rows per chunk", ("MultiRowChunk", "Random"), _random(rng, (8, 16), dtype)),
        Case("trailing shape (3,)", ("TrailingDims", "Random"), _random(rng, (4, 4, 3), dtype)),
        Case(
            "trailing shape (2, 2), two rows per chunk",
            ("TrailingDims", "MultiRowChunk", "Random"),
            _random(rng, (3, 6, 2, 2), dtype),
        ),
        Case("trailing shape (1,)", ("TrailingDims", "Random"), _random(rng, (2, 2, 1), dtype)),
        Case(
            "ring order: chunk c is (B + -B) + 1 = 1, worker order gives 0",
            ("RingOrder", "PrimeWorkers"),
            _by_chunk(3, 1, [big, -big, 1.0], dtype),
        ),
        Case(
            "ring order with four workers and two rows per chunk",
            ("RingOrder", "MultiRowChunk"),
            _by_chunk(4, 2, [big, -big, 1.0, 1.0], dtype),
        ),
        Case(
            "each addition rounds: 2^p + 1 + 1 stays 2^p",
            ("RoundEveryAdd", "PrimeWorkers"),
            _by_chunk(3, 1, [tie, 1.0, 1.0], dtype),
        ),
        Case(
            "each addition rounds: 2^p + 1 + 1 + 1 stays 2^p",
            ("RoundEveryAdd",),
            _by_chunk(4, 1, [tie, 1.0, 1.0, 1.0], dtype),
        ),
        Case(
            "overflow: max + max = inf, -max + -max = -inf",
            ("Overflow",),
            _tensor([top, -top, top, -top], (2, 2), dtype),
        ),
        Case(
            "overflow by rounding: max + ulp/2 = inf (ties to even), max + ulp/4 = max",
            ("Overflow",),
            _tensor([top, -top, ulp / 2, -ulp / 4], (2, 2), dtype),
        ),
        Case(
            "overflow depends on the order: (max + max) + -max = inf",
            ("Overflow", "RingOrder", "PrimeWorkers"),
            _by_chunk(3, 1, [top, top, -top], dtype),
        ),
        Case(
            "signed zeros: -0 + -0 = -0, +0 + -0 = +0, 1 + -1 = +0",
            ("SignedZero",),
            _tensor([-0.0, 0.0, -0.0, 1.0, -0.0, -0.0, 0.0, -1.0], (2, 4), dtype),
        ),
        Case(
            "signed zeros: three workers of -0",
            ("SignedZero", "PrimeWorkers"),
            _tensor([-0.0] * 9, (3, 3), dtype),
        ),
        Case(
            "subnormals: s + s, largest subnormal + s = smallest normal, normal - largest = s, -s + s",
            ("Subnormal",),
            _tensor([tiny, largest_sub, normal, -tiny, tiny, tiny, -largest_sub, tiny], (2, 4), dtype),
        ),
        Case(
            "subnormals: random multiples of the smallest subnormal",
            ("Subnormal", "PrimeWorkers"),
            _tensor([tiny * rng.randrange(-64, 64) for _ in range(9)], (3, 3), dtype),
        ),
    ]


def vector(tc_id: int, case: Case) -> dict[str, Any]:
    """The JSON object of one vector; the expected values are computed by the reference."""
    x = case.x
    n, m, trailing = x.shape[0], x.shape[1], list(x.shape[2:])
    out: dict[str, Any] = {
        "tcId": tc_id,
        "comment": case.comment,
        "flags": list(case.flags),
        "n": n,
        "m": m,
        "trailingShape": trailing,
        "input": to_hex(x),
        "expected": to_hex(ring_all_reduce(x)),
    }
    if n > 1 and x.numel() <= ROUND_BUFFER_LIMIT:
        rounds, _ = reference_rounds(x)
        out["rounds"] = [{"phase": r.phase, "round": r.round, "buffers": to_hex(r.buffers)} for r in rounds]
    return out


HEADER = [
    f"Conformance vectors v{VERSION} for ring all-reduce as specified in spec/ring_all_reduce.md (v1).",
    "Generated by `ring-ref vectors --out DIR`; do not edit. See spec/vectors/README.md.",
    "input: shape (n, m, *trailingShape); expected: shape (m, *trailingShape), worker 0's final buffer.",
    "Every value is the IEEE bit pattern as fixed-width lowercase hex, flattened row-major.",
    "rounds (small cases): every worker's buffers, shape (n, m, *trailingShape), after each round.",
    "Expected values computed by the ring_ref reference (torch, CPU) and cross-checked against an "
    "independent closed-form ring fold.",
]


def build() -> dict[str, Any]:
    """The whole vector file as a JSON-ready object."""
    groups = []
    tc_id = 0
    for name in FORMATS:
        tests = []
        for case in cases(name):
            tc_id += 1
            tests.append(vector(tc_id, case))
        groups.append(
            {"type": "RingAllReduceTest", "dtype": name, "bits": FORMATS[name].bits, "tests": tests}
        )
    return {
        "algorithm": "RING-ALL-REDUCE",
        "schema": SCHEMA_NAME,
        "generatorVersion": str(VERSION),
        "numberOfTests": tc_id,
        "header": HEADER,
        "notes": NOTES,
        "testGroups": groups,
    }


def strict(properties: dict[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    """A schema object with exactly ``properties``, of which ``required`` (default: all) must be present."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(properties if required is None else required),
        "properties": properties,
    }


def case_schema(bits: int, flags: Sequence[str], *, min_rounds: int = 0) -> dict[str, Any]:
    """One test of a group of ``bits``-bit values: flags among ``flags``, optional rounds (at least
    ``min_rounds`` when present)."""
    count = {"type": "integer", "minimum": 1}
    hex_list = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "string", "pattern": f"^[0-9a-f]{{{bits // 4}}}$"},
    }
    round_obj = strict(
        {"phase": {"enum": list(PHASES)}, "round": {"type": "integer", "minimum": 0}, "buffers": hex_list}
    )
    return strict(
        {
            "tcId": count,
            "comment": {"type": "string", "minLength": 1},
            "flags": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": list(flags)}},
            "n": count,
            "m": count,
            "trailingShape": {"type": "array", "items": count},
            "input": hex_list,
            "expected": hex_list,
            "rounds": {
                "type": "array",
                **({"minItems": min_rounds} if min_rounds else {}),
                "items": round_obj,
            },
        },
        ["tcId", "comment", "flags", "n", "m", "trailingShape", "input", "expected"],
    )


def document_schema(
    *,
    schema_name: str,
    title: str,
    algorithm: str,
    notes: dict[str, Any],
    test_groups: dict[str, Any],
    defs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The schema (draft 2020-12) of a vector document: its header fields, ``notes`` and ``test_groups``."""
    top = strict(
        {
            "algorithm": {"const": algorithm},
            "schema": {"const": schema_name},
            "generatorVersion": {"type": "string"},
            "numberOfTests": {"type": "integer", "minimum": 1},
            "header": {"type": "array", "items": {"type": "string"}},
            "notes": notes,
            "testGroups": test_groups,
        }
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": schema_name,
        "title": title,
        **top,
        **({"$defs": defs} if defs is not None else {}),
    }


def notes_schema(flags: Sequence[str]) -> dict[str, Any]:
    """``notes``: for each flag used, its ``bugType`` and ``description``."""
    text = {"type": "string", "minLength": 1}
    note = strict({"bugType": text, "description": text})
    return {"type": "object", "propertyNames": {"enum": list(flags)}, "additionalProperties": note}


def schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of :func:`build`'s output."""
    defs: dict[str, Any] = {}
    groups = []
    for name, fmt in FORMATS.items():
        defs[f"{name}Group"] = strict(
            {
                "type": {"const": "RingAllReduceTest"},
                "dtype": {"const": name},
                "bits": {"const": fmt.bits},
                "tests": {"type": "array", "items": case_schema(fmt.bits, list(NOTES))},
            }
        )
        groups.append({"$ref": f"#/$defs/{name}Group"})
    return document_schema(
        schema_name=SCHEMA_NAME,
        title=f"ring all-reduce conformance vectors v{VERSION}",
        algorithm="RING-ALL-REDUCE",
        notes=notes_schema(list(NOTES)),
        test_groups={"type": "array", "items": {"oneOf": groups}},
        defs=defs,
    )


def dumps(obj: Any, indent: int = 0) -> str:
    """Deterministic JSON: objects one member per line, arrays of scalars on one line.

    >>> print(dumps({"a": [1, "x"], "b": {"c": []}}))
    {
      "a": [1, "x"],
      "b": {
        "c": []
      }
    }
    """
    pad = "  " * (indent + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        members = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(members) + "\n" + "  " * indent + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [pad + dumps(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    return json.dumps(obj, ensure_ascii=False)


def to_text(doc: dict[str, Any]) -> str:
    """The vectors as whitespace-separated tokens (format in ``spec/vectors/README.md``)."""
    lines = [f"# {line}" for line in doc["header"]]
    lines.append(f"vectors {doc['numberOfTests']}")
    for group in doc["testGroups"]:
        for t in group["tests"]:
            params = [t["tcId"], group["dtype"], t["n"], t["m"], len(t["trailingShape"]), *t["trailingShape"]]
            lines.append(" ".join(["test", *map(str, params)]))
            lines.append(" ".join(["flags", str(len(t["flags"])), *t["flags"]]))
            lines.append(" ".join(["input", str(len(t["input"])), *t["input"]]))
            lines.append(" ".join(["expected", str(len(t["expected"])), *t["expected"]]))
            rounds = t.get("rounds", [])
            lines.append(f"rounds {len(rounds)}")
            lines.extend(
                " ".join(["round", r["phase"], str(r["round"]), str(len(r["buffers"])), *r["buffers"]])
                for r in rounds
            )
            lines.append("end")
    return "\n".join(lines) + "\n"


def write_files(out_dir: Path, contents: dict[str, str]) -> list[Path]:
    """Write ``contents`` (file name -> text) into ``out_dir`` (created if needed); return the paths."""
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(
            f"{out_dir} is a file, not a directory: pass a directory (created if missing)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in contents.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8", newline="\n")
        paths.append(path)
    return paths


def write(out_dir: Path) -> list[Path]:
    """Write the three vector files into ``out_dir`` (created if needed); return their paths."""
    doc = build()
    return write_files(
        out_dir, {JSON_NAME: dumps(doc) + "\n", SCHEMA_NAME: dumps(schema()) + "\n", TEXT_NAME: to_text(doc)}
    )
