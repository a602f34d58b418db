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
The format shared with the other vector files is :mod:`ring_ref._vectors._format`.

>>> worked = cases("float32")[0]
>>> worked.flags, worked.x.tolist()
(('WorkedExample',), [[1.0, 2.0], [3.0, 4.0]])
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Final

import torch

from ring_ref._dispatch import ring_all_reduce
from ring_ref._dtypes import FORMATS
from ring_ref._vectors._format import (
    VectorCase,
    by_chunk,
    case_schema,
    document,
    document_schema,
    drawn,
    dtype_groups,
    header,
    json_texts,
    notes_schema,
    tensor,
    uniform,
    vector,
    write_files,
)

__all__ = ["JSON_NAME", "SCHEMA_NAME", "TEXT_NAME", "VERSION", "build", "contents", "schema", "write"]

VERSION: Final = 1
SEED: Final = 4104
JSON_NAME: Final = f"ring_all_reduce_v{VERSION}.json"
SCHEMA_NAME: Final = f"ring_all_reduce_schema_v{VERSION}.json"
TEXT_NAME: Final = f"ring_all_reduce_v{VERSION}.txt"
COMMAND: Final = "ring-ref vectors --out DIR"

NOTES: Final[dict[str, dict[str, str]]] = {
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


def cases(name: str) -> list[VectorCase]:
    """Every vector of dtype ``name``, in ``tcId`` order within the dtype."""
    fmt = FORMATS[name]
    dtype = fmt.torch_dtype
    rng = random.Random(SEED + fmt.bits * 10 + fmt.precision)
    big = 2.0 ** (fmt.precision + 1)
    tie = 2.0**fmt.precision
    top, ulp, tiny = fmt.max_finite, fmt.ulp_of_max, fmt.min_subnormal
    normal = 2.0**fmt.emin
    largest_sub = normal - tiny

    def rand(shape: tuple[int, ...]) -> torch.Tensor:
        return drawn(rng, shape, dtype, uniform)

    return [
        VectorCase(
            "worked example: [1, 2] and [3, 4] give [4, 6]",
            ("WorkedExample",),
            tensor([1, 2, 3, 4], (2, 2), dtype),
        ),
        VectorCase("one worker: the result is its own values", ("SingleWorker",), rand((1, 3))),
        VectorCase(
            "one worker with a trailing dimension",
            ("SingleWorker", "TrailingDims"),
            rand((1, 2, 2)),
        ),
        VectorCase("two workers", ("Random",), rand((2, 4))),
        VectorCase("three workers, one element per chunk", ("PrimeWorkers", "Random"), rand((3, 3))),
        VectorCase(
            "five workers, two rows per chunk",
            ("PrimeWorkers", "MultiRowChunk", "Random"),
            rand((5, 10)),
        ),
        VectorCase("seven workers", ("PrimeWorkers", "Random"), rand((7, 7))),
        VectorCase("four workers, two rows per chunk", ("MultiRowChunk", "Random"), rand((4, 8))),
        VectorCase("eight workers, two rows per chunk", ("MultiRowChunk", "Random"), rand((8, 16))),
        VectorCase("trailing shape (3,)", ("TrailingDims", "Random"), rand((4, 4, 3))),
        VectorCase(
            "trailing shape (2, 2), two rows per chunk",
            ("TrailingDims", "MultiRowChunk", "Random"),
            rand((3, 6, 2, 2)),
        ),
        VectorCase("trailing shape (1,)", ("TrailingDims", "Random"), rand((2, 2, 1))),
        VectorCase(
            "ring order: chunk c is (B + -B) + 1 = 1, worker order gives 0",
            ("RingOrder", "PrimeWorkers"),
            by_chunk(3, 1, [big, -big, 1.0], dtype),
        ),
        VectorCase(
            "ring order with four workers and two rows per chunk",
            ("RingOrder", "MultiRowChunk"),
            by_chunk(4, 2, [big, -big, 1.0, 1.0], dtype),
        ),
        VectorCase(
            "each addition rounds: 2^p + 1 + 1 stays 2^p",
            ("RoundEveryAdd", "PrimeWorkers"),
            by_chunk(3, 1, [tie, 1.0, 1.0], dtype),
        ),
        VectorCase(
            "each addition rounds: 2^p + 1 + 1 + 1 stays 2^p",
            ("RoundEveryAdd",),
            by_chunk(4, 1, [tie, 1.0, 1.0, 1.0], dtype),
        ),
        VectorCase(
            "overflow: max + max = inf, -max + -max = -inf",
            ("Overflow",),
            tensor([top, -top, top, -top], (2, 2), dtype),
        ),
        VectorCase(
            "overflow by rounding: max + ulp/2 = inf (ties to even), max + ulp/4 = max",
            ("Overflow",),
            tensor([top, -top, ulp / 2, -ulp / 4], (2, 2), dtype),
        ),
        VectorCase(
            "overflow depends on the order: (max + max) + -max = inf",
            ("Overflow", "RingOrder", "PrimeWorkers"),
            by_chunk(3, 1, [top, top, -top], dtype),
        ),
        VectorCase(
            "signed zeros: -0 + -0 = -0, +0 + -0 = +0, 1 + -1 = +0",
            ("SignedZero",),
            tensor([-0.0, 0.0, -0.0, 1.0, -0.0, -0.0, 0.0, -1.0], (2, 4), dtype),
        ),
        VectorCase(
            "signed zeros: three workers of -0",
            ("SignedZero", "PrimeWorkers"),
            tensor([-0.0] * 9, (3, 3), dtype),
        ),
        VectorCase(
            "subnormals: s + s, largest subnormal + s = smallest normal, normal - largest = s, -s + s",
            ("Subnormal",),
            tensor([tiny, largest_sub, normal, -tiny, tiny, tiny, -largest_sub, tiny], (2, 4), dtype),
        ),
        VectorCase(
            "subnormals: random multiples of the smallest subnormal",
            ("Subnormal", "PrimeWorkers"),
            tensor([tiny * rng.randrange(-64, 64) for _ in range(9)], (3, 3), dtype),
        ),
    ]


HEADER: Final = header(
    VERSION,
    "ring all-reduce as specified in spec/ring_all_reduce.md (v1).",
    COMMAND,
    "input: shape (n, m, *trailingShape); expected: shape (m, *trailingShape), worker 0's final buffer.",
    "Every value is the IEEE bit pattern as fixed-width lowercase hex, flattened row-major.",
    "rounds (small cases): every worker's buffers, shape (n, m, *trailingShape), after each round.",
    "Expected values computed by the ring_ref reference (torch, CPU) and cross-checked against an "
    "independent closed-form ring fold.",
)


def build() -> dict[str, Any]:
    """The whole vector file as a JSON-ready object; expected values from :func:`ring_all_reduce`."""
    groups = [
        {
            "type": "RingAllReduceTest",
            "dtype": name,
            "bits": fmt.bits,
            "tests": [vector(case, ring_all_reduce(case.x)) for case in cases(name)],
        }
        for name, fmt in FORMATS.items()
    ]
    return document(
        algorithm="RING-ALL-REDUCE",
        schema_name=SCHEMA_NAME,
        version=VERSION,
        header=HEADER,
        notes=NOTES,
        groups=groups,
    )


def schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of :func:`build`'s output."""
    defs = dtype_groups(
        "RingAllReduceTest", lambda bits: {"type": "array", "items": case_schema(bits, list(NOTES))}
    )
    groups = [{"$ref": f"#/$defs/{group}"} for group in defs]
    return document_schema(
        schema_name=SCHEMA_NAME,
        title=f"ring all-reduce conformance vectors v{VERSION}",
        algorithm="RING-ALL-REDUCE",
        notes=notes_schema(list(NOTES)),
        test_groups={"type": "array", "items": {"oneOf": groups}},
        defs=defs,
    )


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


def contents() -> dict[str, str]:
    """File name -> text of the three v1 files."""
    doc = build()
    return {**json_texts({JSON_NAME: doc, SCHEMA_NAME: schema()}), TEXT_NAME: to_text(doc)}


def write(out_dir: Path) -> list[Path]:
    """Write the three v1 files into ``out_dir`` (created if needed); return their paths."""
    return write_files(out_dir, contents())
