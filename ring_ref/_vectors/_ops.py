"""Conformance vectors for the reduction ops of ``spec/operations.md``, a file apart from the v1 vectors.

``ring_all_reduce_ops_v1.json`` (schema ``ring_all_reduce_ops_schema_v1.json``)
holds, for each op other than ``sum`` (``prod``, ``max``, ``min``, ``avg``; the
v1 file covers ``sum``) and each dtype, Wycheproof-style vectors in the v1
format: ``tcId``, ``comment``, ``flags`` (each explained in ``notes`` with a
``bugType``), ``n``, ``m``, ``trailingShape``, the input and the expected
result as bit patterns and, for small cases, every worker's buffers after
every round.  The inputs are chosen to catch real bugs: summing instead of the
op, the sign of zero that wins a ``max``/``min`` tie, a product rounded once or
in another order, ``avg`` dividing every contribution first or by a rounded
reciprocal, the op applied in all-gather, overflow, underflow and signed zeros.

The expected result is the clause ``op-*`` closed form computed here, chunk by
chunk over the fold order ``c, c+1, ..., c-1`` (independent of the reference
engine's rounds), and the generator refuses to write a vector on which the
reference engine (:func:`ring_ref.ring_all_reduce` with ``op``) disagrees; the
per-round buffers come from :func:`ring_ref._tracecheck.reference_rounds`.
``tests/cover/test_op_vectors.py`` re-derives every value with
``tests/common/oracles.py``, which imports nothing from ``ring_ref``.

>>> doc = build()
>>> doc["numberOfTests"] == sum(len(g["tests"]) for g in doc["testGroups"])
True
>>> sorted({g["op"] for g in doc["testGroups"]})
['avg', 'max', 'min', 'prod']
"""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import torch

from ring_ref._dispatch import ring_all_reduce
from ring_ref._dtypes import FORMATS, FloatFormat
from ring_ref._ops import Op, finish_torch, torch_combine
from ring_ref._vectors._format import (
    VectorCase,
    by_chunk,
    case_schema,
    differs,
    document,
    document_schema,
    drawn,
    dtype_groups,
    header,
    json_texts,
    notes_schema,
    search,
    tensor,
    uniform,
    vector,
    write_files,
)

__all__ = ["JSON_NAME", "OPS_COVERED", "SCHEMA_NAME", "VERSION", "build", "contents", "schema", "write"]

VERSION: Final = 1
JSON_NAME: Final = f"ring_all_reduce_ops_v{VERSION}.json"
SCHEMA_NAME: Final = f"ring_all_reduce_ops_schema_v{VERSION}.json"
SEED: Final = 9017
OPS_COVERED: Final[tuple[Op, ...]] = ("prod", "max", "min", "avg")
COMMAND: Final = "ring-ref vectors --ops --out DIR"
SEARCH_TRIES: Final = 500

NOTES: Final[dict[str, dict[str, str]]] = {
    "OpWorkedExample": {
        "bugType": "BASIC",
        "description": (
            "The spec's worked example under the op: [1, 2] and [3, 4] give prod [3, 8], max [3, 4], "
            "min [1, 2], avg [2, 3]. Fails summing ([4, 6]), the other extreme, or an average not "
            "divided by N."
        ),
    },
    "SumNotOp": {
        "bugType": "WRONG_OP",
        "description": (
            "Values whose op result differs from their sum (for avg: from the undivided sum). Fails "
            "an implementation that adds in reduce-scatter whatever the op, or forgets avg's "
            "division."
        ),
    },
    "SingleWorker": {
        "bugType": "EDGE_CASE",
        "description": (
            "N = 1: no round runs and the result is the worker's own values (avg: divided by 1, the "
            "same bits). Fails dividing by N - 1, or combining a worker with itself (x * x, x + x)."
        ),
    },
    "PrimeWorkers": {
        "bugType": "MODULAR_INDEXING",
        "description": (
            "A prime N > 2: the chunk indices (i - r) mod N visit every residue, so an off-by-one in "
            "the modular arithmetic cannot hide behind a period of N."
        ),
    },
    "MultiRowChunk": {
        "bugType": "WRONG_LAYOUT",
        "description": (
            "M / N > 1: a chunk is a block of M / N consecutive rows (clause chunk-layout). Fails "
            "interleaved chunking."
        ),
    },
    "TrailingDims": {
        "bugType": "WRONG_LAYOUT",
        "description": (
            "Each worker holds (M, ...) with trailing dimensions; chunks split the leading axis only."
        ),
    },
    "Random": {
        "bugType": "BASIC",
        "description": (
            "Pseudo-random values (fixed seed) rounded to the dtype: prod of magnitudes in [0.5, 2), "
            "so no product overflows; max, min and avg in [-8, 8)."
        ),
    },
    "CopyInAllGather": {
        "bugType": "OP_IN_ALL_GATHER",
        "description": (
            "All-gather copies whatever the op: a receiver that multiplies (prod) or adds (avg) the "
            "finished chunk into its own slot gets other bits, in the result or in the rounds. (For "
            "max and min the mistake changes nothing: a receiver's own partial extreme never beats "
            "the finished one and equals it only as the same element, so no vector can catch it.)"
        ),
    },
    "RingOrder": {
        "bugType": "WRONG_ORDER",
        "description": (
            "Values whose result in the ring's fold order c, c+1, ..., c-1 differs from the fold in "
            "worker order 0, 1, ..., N-1 and its reverse (and, for prod with N >= 4, a pairwise "
            "tree): products that round differently, overflow or underflow in one order only, avg of "
            "(B + -B) + 1, and for max and min the zero met first."
        ),
    },
    "RoundEveryMultiply": {
        "bugType": "WIDENED_ACCUMULATION",
        "description": (
            "prod: each multiplication is rounded to the dtype (clause op-prod). Values whose fold in"
            " the dtype differs from the product accumulated in a wider type (double; for float64 the"
            " exact product) and rounded once."
        ),
    },
    "Overflow": {
        "bugType": "OVERFLOW",
        "description": (
            "Results beyond the largest finite value round to infinity: prod max x 2 = inf, avg of "
            "max and max = inf / 2 = inf (dividing first would stay finite), max + ulp/2 = inf. Fails"
            " saturating arithmetic, dividing first and wider accumulation."
        ),
    },
    "Underflow": {
        "bugType": "SUBNORMAL",
        "description": (
            "Gradual underflow: prod smallest normal x 0.5 is subnormal, smallest subnormal x 0.5 is "
            "0 (ties to even) and x 0.75 is the smallest subnormal; avg of subnormal sums rounds at "
            "the bottom of the range. Fails flush-to-zero / denormals-are-zero modes."
        ),
    },
    "SignedZero": {
        "bugType": "SIGNED_ZERO",
        "description": (
            "IEEE signed zeros: prod -0 x 3 = -0, -0 x -1 = +0, -1 x +0 = -0; avg -0 + -0 = -0, -0 / "
            "N = -0, 1 + -1 = +0. Fails writing +0 for every zero, and avg accumulators started from "
            "+0."
        ),
    },
    "SignedZeroTie": {
        "bugType": "SIGNED_ZERO",
        "description": (
            "max and min keep the zero met first in the fold order (clause op-max): the receiver "
            "stores own only if own > incoming (own < incoming), so max(-0, +0) is whichever came "
            "first. Fails keeping own on a tie (numpy.maximum(incoming, own), own >= incoming), IEEE "
            "754-2019 maximum/minimum (which order -0 below +0), and folding in worker order."
        ),
    },
    "ExtremeValues": {
        "bugType": "WRONG_IDENTITY",
        "description": (
            "max of values all negative, down to -max finite, and min of values all positive, up to "
            "+max finite, with subnormals. Fails an accumulator started from 0 or from a finite "
            "sentinel of another dtype instead of the first value."
        ),
    },
    "AvgDividesOnce": {
        "bugType": "WRONG_ROUNDING",
        "description": (
            "avg is the ring's sum divided by N once, rounded once (clause op-avg). Values on which "
            "that differs from dividing every contribution by N before the ring and from multiplying "
            "every contribution by 1/N rounded to the dtype before the ring (NCCL's PreMulSum for "
            "floating-point ncclAvg)."
        ),
    },
    "AvgRoundedReciprocal": {
        "bugType": "WRONG_ROUNDING",
        "description": (
            "avg divides by N: values on which sum / N differs from sum x (1/N rounded to the dtype),"
            " with N not a power of two."
        ),
    },
}


def closed_form(x: torch.Tensor, op: Op) -> torch.Tensor:
    """Clause ``op-*``: chunk ``c`` folded over workers ``c, c+1, ..., c-1`` by ``combine(incoming, own)``.

    ``avg`` divides the folded sum by ``N`` once.  Runs no round of the ring.
    """
    n, m = x.shape[0], x.shape[1]
    k = m // n
    combine = torch_combine(op)
    pieces = []
    for c in range(n):
        acc = x[c, c * k : (c + 1) * k].clone()
        for step in range(1, n):
            acc = combine(acc, x[(c + step) % n, c * k : (c + 1) * k])
        pieces.append(acc)
    return finish_torch(op, torch.cat(pieces), n)


def _fold(terms: list[torch.Tensor], op: Op) -> torch.Tensor:
    combine = torch_combine(op)
    acc = terms[0].clone()
    for t in terms[1:]:
        acc = combine(acc, t)
    return acc


def _tree(terms: list[torch.Tensor], op: Op) -> torch.Tensor:
    combine = torch_combine(op)
    while len(terms) > 1:
        terms = [
            combine(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i]
            for i in range(0, len(terms), 2)
        ]
    return terms[0].clone()


def _other_orders(x: torch.Tensor, op: Op) -> list[torch.Tensor]:
    """The op over the workers in worker order, reversed and (N >= 4) as a pairwise tree."""
    workers = [x[i] for i in range(x.shape[0])]
    orders = [_fold(workers, op), _fold(workers[::-1], op)]
    if len(workers) >= 4 and op == "prod":
        orders.append(_tree(workers, op))
    return [finish_torch(op, t, len(workers)) for t in orders]


def _rounded_once(x: torch.Tensor) -> torch.Tensor:
    """The product over axis 0 in double (float64: exactly), rounded once to the dtype."""
    if x.dtype != torch.float64:
        return torch.prod(x.to(torch.float64), 0).to(x.dtype)
    flat = x.reshape(x.shape[0], -1).tolist()
    exact = []
    for j in range(len(flat[0])):
        product = Fraction(1)
        for row in flat:
            product *= Fraction(row[j])
        exact.append(float(product))
    return torch.tensor(exact, dtype=torch.float64).reshape(x.shape[1:])


def _avg_done_wrong(x: torch.Tensor) -> list[torch.Tensor]:
    """avg divided each contribution first, premultiplied by fl(1/N), and the sum multiplied by fl(1/N)."""
    n = x.shape[0]
    inverse = torch.tensor(1.0 / n, dtype=torch.float64).to(x.dtype)
    divided = (x.to(torch.float64) / n).to(x.dtype)
    return [closed_form(divided, "sum"), closed_form(x * inverse, "sum"), closed_form(x, "sum") * inverse]


def _near_one(rng: random.Random) -> float:
    return rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** rng.randint(-1, 0)


def _common(op: Op, rng: random.Random, dtype: torch.dtype) -> list[VectorCase]:
    """The cases every op has: the worked example, one worker, primes, chunks of rows, trailing dimensions."""
    draw = _near_one if op == "prod" else uniform

    def rand(shape: tuple[int, ...]) -> torch.Tensor:
        return drawn(rng, shape, dtype, draw)

    gather = ("CopyInAllGather",) if op in ("prod", "avg") else ()
    return [
        VectorCase(
            f"worked example under {op}",
            ("OpWorkedExample", "SumNotOp"),
            tensor([1, 2, 3, 4], (2, 2), dtype),
        ),
        VectorCase("one worker: the result is its own values", ("SingleWorker",), rand((1, 3))),
        VectorCase("one worker with a trailing dimension", ("SingleWorker", "TrailingDims"), rand((1, 2, 2))),
        VectorCase("two workers", ("Random", "SumNotOp", *gather), rand((2, 4))),
        VectorCase(
            "three workers, one element per chunk",
            ("PrimeWorkers", "Random", "SumNotOp", *gather),
            rand((3, 3)),
        ),
        VectorCase(
            "five workers, two rows per chunk",
            ("PrimeWorkers", "MultiRowChunk", "Random", "SumNotOp", *gather),
            rand((5, 10)),
        ),
        VectorCase("trailing shape (3,)", ("TrailingDims", "Random", "SumNotOp", *gather), rand((4, 4, 3))),
        VectorCase(
            "trailing shape (2, 2), two rows per chunk",
            ("TrailingDims", "MultiRowChunk", "Random", "SumNotOp"),
            rand((3, 6, 2, 2)),
        ),
    ]


def _prod_cases(rng: random.Random, fmt: FloatFormat) -> list[VectorCase]:
    dtype = fmt.torch_dtype
    top, tiny, normal = fmt.max_finite, fmt.min_subnormal, fmt.smallest_normal

    def order_telling(x: torch.Tensor) -> bool:
        ring = closed_form(x, "prod")
        return all(differs(ring, other) for other in _other_orders(x, "prod"))

    def rounding_telling(x: torch.Tensor) -> bool:
        return differs(closed_form(x, "prod"), _rounded_once(x))

    def full(rng: random.Random) -> float:
        return rng.choice((-1.0, 1.0)) * (1.0 + rng.random())

    return [
        VectorCase(
            "ring order: the product rounds differently in worker order, reversed and as a tree",
            ("RingOrder",),
            search(rng, (4, 4), dtype, full, order_telling, tries=SEARCH_TRIES),
        ),
        VectorCase(
            "ring order with five workers",
            ("RingOrder", "PrimeWorkers"),
            search(rng, (5, 5), dtype, full, order_telling, tries=SEARCH_TRIES),
        ),
        VectorCase(
            "each multiplication rounds: the fold differs from the product rounded once",
            ("RoundEveryMultiply", "PrimeWorkers"),
            search(rng, (3, 3), dtype, full, rounding_telling, tries=SEARCH_TRIES),
        ),
        VectorCase(
            "overflow: max x 2 = inf, 2 x -max = -inf",
            ("Overflow",),
            tensor([top, -top, 2.0, 2.0], (2, 2), dtype),
        ),
        VectorCase(
            "overflow depends on the order: (max x 2) x 0.5 = inf, (0.5 x max) x 2 = max",
            ("Overflow", "RingOrder", "PrimeWorkers"),
            by_chunk(3, 1, [top, 2.0, 0.5], dtype),
        ),
        VectorCase(
            "underflow: normal x 0.5 is subnormal, s x 0.5 = +0 (ties to even), -s x 0.5 = -0, s x 0.75 = s",
            ("Underflow", "SignedZero", "MultiRowChunk"),
            tensor([normal, tiny, -tiny, tiny, 0.5, 0.5, 0.5, 0.75], (2, 4), dtype),
        ),
        VectorCase(
            "underflow depends on the order: (s x 0.5) x 4 = 0, (4 x s) x 0.5 = 2s",
            ("RingOrder", "PrimeWorkers"),
            by_chunk(3, 1, [tiny, 0.5, 4.0], dtype),
        ),
        VectorCase(
            "signed zeros: -0 x 3 = -0, -0 x -1 = +0, -1 x +0 = -0, -0 x 3 = -0",
            ("SignedZero", "MultiRowChunk"),
            tensor([-0.0, -0.0, 0.0, 3.0, 3.0, -1.0, -1.0, -0.0], (2, 4), dtype),
        ),
    ]


def _extreme_cases(op: Op, fmt: FloatFormat) -> list[VectorCase]:
    """max and min: signed-zero ties and extreme values; ``s`` mirrors the values for min."""
    dtype = fmt.torch_dtype
    s = -1.0 if op == "max" else 1.0
    top, tiny = fmt.max_finite, fmt.min_subnormal
    return [
        VectorCase(
            "the spec's example: worker 0 = [-0, -0], worker 1 = [+0, +0] give [-0, +0]",
            ("SignedZeroTie", "RingOrder"),
            tensor([-0.0, -0.0, 0.0, 0.0], (2, 2), dtype),
        ),
        VectorCase(
            "three workers: chunk 0 folds -0, +0, +0; chunk 1 +0, v, -0; chunk 2 v, -0, +0",
            ("SignedZeroTie", "RingOrder", "PrimeWorkers"),
            tensor([-0.0, -0.0, -0.0, 0.0, 0.0, 0.0, 0.0, s, s], (3, 3), dtype),
        ),
        VectorCase(
            "ties next to values: two rows per chunk",
            ("SignedZeroTie", "MultiRowChunk"),
            tensor([-0.0, 0.0, -s, -0.0, 0.0, -0.0, -0.0, -2 * s], (2, 4), dtype),
        ),
        VectorCase(
            f"{'all negative' if op == 'max' else 'all positive'}: max finite, subnormals, small integers",
            ("ExtremeValues", "PrimeWorkers"),
            tensor([s * v for v in (top, tiny, top, top, 2.0, top, top, 3.0, tiny)], (3, 3), dtype),
        ),
    ]


def _avg_cases(rng: random.Random, fmt: FloatFormat) -> list[VectorCase]:
    dtype = fmt.torch_dtype
    top, ulp, tiny, normal = fmt.max_finite, fmt.ulp_of_max, fmt.min_subnormal, fmt.smallest_normal
    big = 2.0 ** (fmt.precision + 1)

    def once_telling(x: torch.Tensor) -> bool:
        right = closed_form(x, "avg")
        return all(differs(right, wrong) for wrong in _avg_done_wrong(x))

    def small_integer(rng: random.Random) -> float:
        return float(rng.randint(1, 9))

    return [
        VectorCase(
            "the spec's example: 1, 1, 3 sum to 5, divided once by 3",
            ("AvgDividesOnce", "AvgRoundedReciprocal", "PrimeWorkers"),
            by_chunk(3, 1, [1.0, 1.0, 3.0], dtype),
        ),
        VectorCase(
            "divided once: three workers of small integers",
            ("AvgDividesOnce", "AvgRoundedReciprocal", "PrimeWorkers", "MultiRowChunk"),
            search(rng, (3, 6), dtype, small_integer, once_telling, tries=SEARCH_TRIES),
        ),
        VectorCase(
            "divided once: five workers of small integers",
            ("AvgDividesOnce", "AvgRoundedReciprocal", "PrimeWorkers"),
            search(rng, (5, 5), dtype, small_integer, once_telling, tries=SEARCH_TRIES),
        ),
        VectorCase(
            "overflow: max + max = inf, inf / 2 = inf; dividing first gives max",
            ("Overflow", "AvgDividesOnce"),
            tensor([top, -top, top, -top], (2, 2), dtype),
        ),
        VectorCase(
            "overflow by rounding: max + ulp/2 = inf (ties to even), max + ulp/4 = max, then / 2",
            ("Overflow",),
            tensor([top, top, ulp / 2, ulp / 4], (2, 2), dtype),
        ),
        VectorCase(
            "signed zeros: (-0 + -0) / 2 = -0, (-0 + +0) / 2 = +0, (-1 + 1) / 2 = +0",
            ("SignedZero", "MultiRowChunk"),
            tensor([-0.0, -0.0, 1.0, -0.0, -0.0, 0.0, -1.0, -0.0], (2, 4), dtype),
        ),
        VectorCase(
            "subnormals: s / 2 = +0, normal / 2 subnormal, 3s / 2 = 2s (ties to even), -s / 2 = -0",
            ("Underflow", "AvgDividesOnce", "MultiRowChunk"),
            tensor([tiny, normal, 2 * tiny, -tiny, 0.0, 0.0, tiny, -0.0], (2, 4), dtype),
        ),
        VectorCase(
            "ring order: (B + -B) + 1 = 1, then / 3; worker order gives 0",
            ("RingOrder", "PrimeWorkers"),
            by_chunk(3, 1, [big, -big, 1.0], dtype),
        ),
    ]


def cases(op: Op, name: str) -> list[VectorCase]:
    """Every vector of ``op`` and dtype ``name``, in ``tcId`` order within the group."""
    fmt = FORMATS[name]
    rng = random.Random(f"{SEED}:{op}:{name}")
    common = _common(op, rng, fmt.torch_dtype)
    if op == "prod":
        return common + _prod_cases(rng, fmt)
    if op == "avg":
        return common + _avg_cases(rng, fmt)
    return common + _extreme_cases(op, fmt)


def _checked(case: VectorCase, op: Op) -> dict[str, Any]:
    """The test of ``case``: the closed form's result, refused unless the reference engine agrees."""
    expected = closed_form(case.x, op)
    if differs(expected, ring_all_reduce(case.x, op=op)):
        raise AssertionError(f"{op}, {case.comment}: the closed form and the reference disagree")
    return vector(case, expected, op)


HEADER: Final = header(
    VERSION,
    "the reduction ops of spec/ring_all_reduce.md section 9 (prod, max, min, avg; sum is "
    "ring_all_reduce_v1.json).",
    COMMAND,
    "input: shape (n, m, *trailingShape); expected: shape (m, *trailingShape), worker 0's final buffer "
    "(for avg: after the one division by n).",
    "Every value is the IEEE bit pattern as fixed-width lowercase hex, flattened row-major.",
    "rounds (small cases): every worker's buffers after each round; for avg they hold the ring's sums.",
    "Expected values: the clause op-* closed form, checked against the ring_ref reference engine and "
    "against the independent oracle of tests/oracles.py.",
)


def build() -> dict[str, Any]:
    """The ops vector file as a JSON-ready object."""
    groups: list[dict[str, Any]] = [
        {
            "type": "RingAllReduceOpTest",
            "op": op,
            "dtype": name,
            "bits": fmt.bits,
            "tests": [_checked(case, op) for case in cases(op, name)],
        }
        for op in OPS_COVERED
        for name, fmt in FORMATS.items()
    ]
    used = {flag for group in groups for test in group["tests"] for flag in test["flags"]}
    return document(
        algorithm="RING-ALL-REDUCE-OPS",
        schema_name=SCHEMA_NAME,
        version=VERSION,
        header=HEADER,
        notes={flag: note for flag, note in NOTES.items() if flag in used},
        groups=groups,
    )


def schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of :func:`build`'s output."""
    defs = dtype_groups(
        "RingAllReduceOpTest",
        lambda bits: {"type": "array", "minItems": 1, "items": case_schema(bits, list(NOTES), min_rounds=2)},
        {"op": {"enum": list(OPS_COVERED)}},
    )
    groups = [
        {"if": {"properties": {"dtype": {"const": name}}}, "then": {"$ref": f"#/$defs/{name}Group"}}
        for name in FORMATS
    ]
    group = {
        "type": "object",
        "required": ["dtype"],
        "properties": {"dtype": {"enum": list(FORMATS)}},
        "allOf": groups,
        "description": "One op and one dtype, checked by the group of that dtype in $defs.",
    }
    return document_schema(
        schema_name=SCHEMA_NAME,
        title=f"ring all-reduce reduction-op conformance vectors v{VERSION}",
        algorithm="RING-ALL-REDUCE-OPS",
        notes=notes_schema(list(NOTES)),
        test_groups={"type": "array", "minItems": 1, "items": group},
        defs=defs,
    )


def contents() -> dict[str, str]:
    """File name -> text of the two ops files."""
    return json_texts({JSON_NAME: build(), SCHEMA_NAME: schema()})


def write(out_dir: Path) -> list[Path]:
    """Write the two ops files into ``out_dir`` (created if needed); return their paths."""
    return write_files(out_dir, contents())
