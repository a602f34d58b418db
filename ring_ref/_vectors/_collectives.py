"""Conformance vectors for reduce-scatter and all-gather alone, a file for each.

Specified in ``spec/reduce_scatter_all_gather.md``.

``ring_reduce_scatter_v1.json`` holds, per ring (``spec``: ``(+1, +1, even)``;
``gloo``: ``(-1, -1, gloo)``, the presets with ``k = d``) and dtype, inputs
``(N, M, ...)`` and each rank's shard ``(N, M / N, ...)`` of the sum; for
``N >= 3`` the inputs are chosen so that the shards differ in some bit from
the spec's all-reduce ring ``(+1, 0)`` cut into rows, and for ``N >= 4`` from
the ring run the other way, so an implementation that folds from ``r`` instead
of ``r + d`` fails them.  ``ring_all_gather_v1.json`` holds, per dtype, shards
of NaN payloads (quiet and signalling), signed zeros, subnormals, infinities
and random bits, and the gathered buffer, which must match bit for bit.
Expected values come from ``ring_reduce_scatter`` and ``ring_all_gather``;
``tests/cover/test_collective_vectors.py`` re-derives them without the package.
``ring-ref vectors --collectives --out DIR`` writes the four files.

>>> doc = build_reduce_scatter()
>>> doc["numberOfTests"] == sum(len(g["tests"]) for g in doc["testGroups"])
True
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Final

import torch

from ring_ref._dispatch import ring_all_gather, ring_all_reduce, ring_reduce_scatter
from ring_ref._dtypes import FORMATS, INT_OF_SIZE, to_hex
from ring_ref._vectors._format import (
    count_schema,
    differs,
    document,
    document_schema,
    header,
    hex_list_schema,
    json_texts,
    schedule_schema,
    search,
    shape_schema,
    spread,
    strict,
    write_files,
)
from ring_ref.schedule import PRESETS, RingSchedule, reduce_scatter_ring

__all__ = [
    "AG_JSON_NAME",
    "AG_SCHEMA_NAME",
    "RS_JSON_NAME",
    "RS_SCHEMA_NAME",
    "VERSION",
    "build_all_gather",
    "build_reduce_scatter",
    "contents",
    "schema_all_gather",
    "schema_reduce_scatter",
    "write",
]

VERSION: Final = 1
RS_JSON_NAME: Final = f"ring_reduce_scatter_v{VERSION}.json"
RS_SCHEMA_NAME: Final = f"ring_reduce_scatter_schema_v{VERSION}.json"
AG_JSON_NAME: Final = f"ring_all_gather_v{VERSION}.json"
AG_SCHEMA_NAME: Final = f"ring_all_gather_schema_v{VERSION}.json"
SEED: Final = 1201
COMMAND: Final = "ring-ref vectors --collectives --out DIR"
SEARCH_TRIES: Final = 64
RS_PRESETS: Final = ("spec", "gloo")

RS_SHAPES: Final[tuple[tuple[int, int, tuple[int, ...], str], ...]] = (
    (1, 2, (), "N = 1: the shard is the input"),
    (2, 4, (), "N = 2: the two orders of two workers commute"),
    (3, 6, (), "N = 3: shard r folds r + d, r + 2d, r"),
    (4, 8, (), "N = 4: the direction shows"),
    (5, 10, (), "prime N"),
    (3, 3, (2,), "trailing dimension"),
)
"""``(N, M, trailing, comment)``; every ``S / N`` is even, so gloo's layout cuts equal chunks."""

AG_SHAPES: Final[tuple[tuple[int, int, tuple[int, ...], str], ...]] = (
    (1, 3, (), "N = 1: the gathered buffer is the shard"),
    (2, 4, (), "N = 2"),
    (3, 2, (2,), "trailing dimension"),
    (4, 3, (), "N = 4, odd S"),
    (5, 2, (), "prime N"),
)
"""``(N, S, trailing, comment)``."""

SPECIAL_BITS: Final[dict[str, tuple[int, ...]]] = {
    "float16": (0x7E01, 0x7C01, 0xFE55, 0x8000, 0x0001, 0x83FF, 0x7C00, 0xFC00),
    "bfloat16": (0x7FC1, 0x7F81, 0xFFA5, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80),
    "float32": (0x7FC00001, 0x7F800001, 0xFFC12345, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000),
    "float64": (0x7FF8000000000001, 0x7FF0000000000001, 0x8000000000000000, 0x1, 0x800FFFFFFFFFFFFF),
}
"""Per dtype: NaN payloads (quiet and signalling, either sign), -0.0, subnormals, infinities."""

RS_NOTES: Final[dict[str, str]] = {
    "schedule": "{direction, offset, layout}: the ring of spec section 12 (offset = direction).",
    "input": "shape (n, m, *trailingShape), IEEE bit patterns as fixed-width lowercase hex, row-major.",
    "expected": "shape (n, m / n, *trailingShape): row r is rank r's shard, chunk r folded in the order "
    "r + d, r + 2d, ..., r (mod n), every addition rounded to the dtype.",
}
AG_NOTES: Final[dict[str, str]] = {
    "input": "shape (n, s, *trailingShape): row r is rank r's shard, bit patterns as hex, row-major.",
    "expected": "shape (n * s, *trailingShape): the shards in rank order, every bit unchanged (NaN "
    "payloads, signed zeros, subnormals, infinities).",
}


def _telling(
    rng: random.Random, ring: RingSchedule, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """Random values whose shards differ from the spec's all-reduce ring (``N >= 3``) and from the ring
    of the other direction (``N >= 4``), cut into rows; for smaller ``N`` any values."""
    n = shape[0]
    others = [RingSchedule(1, 0)] if n >= 3 else []
    if n >= 4:
        others.append(RingSchedule(-ring.direction, -ring.direction))

    def telling(x: torch.Tensor) -> bool:
        mine = ring_reduce_scatter(x, schedule=ring)
        return all(differs(mine, ring_all_reduce(x, schedule=o).reshape(mine.shape)) for o in others)

    return search(rng, shape, dtype, spread, telling, tries=SEARCH_TRIES)


def build_reduce_scatter() -> dict[str, Any]:
    """The reduce-scatter vector file as a JSON-ready object."""
    groups = []
    for preset in RS_PRESETS:
        for name, fmt in FORMATS.items():
            rng = random.Random(f"{SEED}:{preset}:{name}")
            tests = []
            for n, m, trailing, comment in RS_SHAPES:
                ring = reduce_scatter_ring(preset, n)
                x = _telling(rng, ring, (n, m, *trailing), fmt.torch_dtype)
                tests.append(
                    {
                        "comment": comment,
                        "n": n,
                        "m": m,
                        "trailingShape": list(trailing),
                        "input": to_hex(x),
                        "expected": to_hex(ring_reduce_scatter(x, schedule=ring)),
                    }
                )
            d, k, layout = reduce_scatter_ring(preset, 1)
            groups.append(
                {
                    "preset": preset,
                    "schedule": {"direction": d, "offset": k, "layout": layout},
                    "dtype": name,
                    "bits": fmt.bits,
                    "tests": tests,
                }
            )
    return document(
        algorithm="RING-REDUCE-SCATTER",
        schema_name=RS_SCHEMA_NAME,
        version=VERSION,
        header=header(VERSION, "ring reduce-scatter, spec/ring_all_reduce.md section 12.", COMMAND),
        notes=dict(RS_NOTES),
        groups=groups,
    )


def _shards(rng: random.Random, shape: tuple[int, ...], name: str) -> torch.Tensor:
    """Shards whose elements are, by turns, a special bit pattern of the dtype and random bits."""
    fmt = FORMATS[name]
    specials = SPECIAL_BITS[name]
    words = [
        specials[j % len(specials)] if j % 2 == 0 else rng.getrandbits(fmt.bits)
        for j in range(math.prod(shape))
    ]
    signed = [w - (1 << fmt.bits) if w >> (fmt.bits - 1) else w for w in words]
    return torch.tensor(signed, dtype=INT_OF_SIZE[fmt.bits // 8]).view(fmt.torch_dtype).reshape(shape)


def build_all_gather() -> dict[str, Any]:
    """The all-gather vector file as a JSON-ready object."""
    groups = []
    for name, fmt in FORMATS.items():
        rng = random.Random(f"{SEED}:all-gather:{name}")
        tests = []
        for n, s, trailing, comment in AG_SHAPES:
            shards = _shards(rng, (n, s, *trailing), name)
            tests.append(
                {
                    "comment": comment,
                    "n": n,
                    "m": s,
                    "trailingShape": list(trailing),
                    "input": to_hex(shards),
                    "expected": to_hex(ring_all_gather(shards)),
                }
            )
        groups.append({"dtype": name, "bits": fmt.bits, "tests": tests})
    return document(
        algorithm="RING-ALL-GATHER",
        schema_name=AG_SCHEMA_NAME,
        version=VERSION,
        header=header(
            VERSION,
            "ring all-gather, spec/ring_all_reduce.md section 12.",
            COMMAND,
            "Each test's m is S, the rows of one shard.",
        ),
        notes=dict(AG_NOTES),
        groups=groups,
    )


def _test_schema() -> dict[str, Any]:
    hex_list = hex_list_schema("^([0-9a-f]{4}){1,4}$")
    return strict(
        {
            "tcId": count_schema(),
            "comment": {"type": "string", "minLength": 1},
            **shape_schema(),
            "input": hex_list,
            "expected": hex_list,
        }
    )


def _schema(name: str, title: str, algorithm: str, group: dict[str, Any]) -> dict[str, Any]:
    return document_schema(
        schema_name=name,
        title=title,
        algorithm=algorithm,
        notes={"type": "object", "additionalProperties": {"type": "string"}},
        test_groups={"type": "array", "items": group},
    )


def schema_reduce_scatter() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of :func:`build_reduce_scatter`'s output."""
    group = strict(
        {
            "preset": {"enum": [name for name, ring in PRESETS.items() if isinstance(ring, RingSchedule)]},
            "schedule": schedule_schema(),
            "dtype": {"enum": list(FORMATS)},
            "bits": {"enum": [16, 32, 64]},
            "tests": {"type": "array", "items": _test_schema()},
        }
    )
    return _schema(
        RS_SCHEMA_NAME, f"ring reduce-scatter conformance vectors v{VERSION}", "RING-REDUCE-SCATTER", group
    )


def schema_all_gather() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of :func:`build_all_gather`'s output."""
    group = strict(
        {
            "dtype": {"enum": list(FORMATS)},
            "bits": {"enum": [16, 32, 64]},
            "tests": {"type": "array", "items": _test_schema()},
        }
    )
    return _schema(
        AG_SCHEMA_NAME, f"ring all-gather conformance vectors v{VERSION}", "RING-ALL-GATHER", group
    )


def contents() -> dict[str, str]:
    """File name -> text of the four files."""
    return json_texts(
        {
            RS_JSON_NAME: build_reduce_scatter(),
            RS_SCHEMA_NAME: schema_reduce_scatter(),
            AG_JSON_NAME: build_all_gather(),
            AG_SCHEMA_NAME: schema_all_gather(),
        }
    )


def write(out_dir: Path) -> list[Path]:
    """Write the four files into ``out_dir`` (created if needed); return their paths."""
    return write_files(out_dir, contents())
