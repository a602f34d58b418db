"""Conformance vectors for the schedule presets (``spec/schedules.md``), a file apart from the v1 vectors.

``ring_all_reduce_presets_v1.json`` (schema ``ring_all_reduce_presets_schema_v1.json``)
holds, for each preset (``spec``, ``openmpi-ring``, ``gloo``, ``chain``, ``mpich-ring``, ``intel-ring``,
``mlx-ring``, ``recursive-doubling``) and dtype, inputs on which the preset's bits differ from every preset
published with it or before it whose order differs there (:data:`PUBLISHED`: the first rings'
vectors from one another's, the chain's from theirs, the later presets' from all before them),
with ``M`` divisible by ``N`` and not, empty chunks (gloo) and trailing dimensions.  Each vector names its
schedule and each chunk's size, and gives the input and the expected result
as bit patterns (the format of ``spec/vectors/README.md``).  Expected values
come from ``ring_all_reduce(x, schedule=preset)``; ``tests/cover/test_preset_vectors.py``
cross-checks them against an independent fold.  ``ring-ref vectors --presets --out DIR``
writes them (the v1 files come from ``ring-ref vectors --out DIR``, unchanged).

>>> doc = build()
>>> doc["numberOfTests"] == sum(len(g["tests"]) for g in doc["testGroups"])
True
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Final

import torch

from ring_ref._chunks import chunk_bounds
from ring_ref._dispatch import ring_all_reduce
from ring_ref._dtypes import FORMATS, dtype_name, to_hex
from ring_ref._order import ring_trees
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
from ring_ref.schedule import LAYOUTS, PRESETS, ChainSchedule, RingSchedule, Schedule

__all__ = ["JSON_NAME", "SCHEMA_NAME", "VERSION", "build", "contents", "schema", "write"]

VERSION: Final = 1
JSON_NAME: Final = f"ring_all_reduce_presets_v{VERSION}.json"
SCHEMA_NAME: Final = f"ring_all_reduce_presets_schema_v{VERSION}.json"
SEED: Final = 1013
COMMAND: Final = "ring-ref vectors --presets --out DIR"
SEARCH_TRIES: Final = 64

SHAPES: Final[tuple[tuple[int, int, tuple[int, ...], str], ...]] = (
    (2, 3, (), "N = 2, M odd"),
    (3, 6, (), "M divisible by N"),
    (3, 7, (), "M not divisible by N"),
    (4, 4, (), "M = N: gloo leaves the last two chunks empty"),
    (5, 12, (), "prime N, M not divisible by N"),
    (3, 5, (2,), "trailing dimension: chunks cut the flattened elements"),
)

NOTES: Final[dict[str, str]] = {
    "schedule": "{direction, offset, layout}: the ring of spec section 10 (offset as the preset defines it); "
    "{kind: chain, layout}: the chain of spec section 15 (every element the left fold over workers); "
    "{kind: recursive-doubling, layout}: recursive doubling (spec/schedules.md, every element one tree).",
    "chunkSizes": "elements of each worker in each chunk, row-major over (m, *trailingShape).",
    "input": "shape (n, m, *trailingShape), IEEE bit patterns as fixed-width lowercase hex, row-major.",
    "expected": "shape (m, *trailingShape): ring_all_reduce(input, schedule=<the group's preset>).",
}


HEADER: Final = header(
    VERSION,
    "the schedule presets of spec/ring_all_reduce.md: the rings of section 10 (spec, openmpi-ring, gloo, "
    "mpich-ring, intel-ring, mlx-ring), the chain of section 15 and recursive doubling.",
    COMMAND,
)


PUBLISHED: Final[tuple[tuple[str, ...], ...]] = (
    ("spec", "openmpi-ring", "gloo"),
    ("chain",),
    ("mpich-ring", "intel-ring"),
    ("recursive-doubling",),
    ("mlx-ring",),
)
"""The presets in the order their vectors were published: each preset's vectors tell it from the presets
published with it or before it, so that a later preset leaves the earlier vectors byte for byte."""


def _known_by(preset: str) -> list[str]:
    """The presets published with ``preset`` or before it (:data:`PUBLISHED`)."""
    at = next(k for k, names in enumerate(PUBLISHED) if preset in names)
    return [p for names in PUBLISHED[: at + 1] for p in names]


def _telling(rng: random.Random, preset: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Random values on which ``preset``'s result differs from every preset with another order here
    among those published with it or before it (:data:`PUBLISHED`).

    (Presets can coincide: OpenMPI's blocks are the spec's chunks when ``N`` divides ``M``, and for
    ``N <= 2`` every ring is the same.)
    """
    name, n, per_worker = dtype_name(dtype), shape[0], math.prod(shape) // shape[0]
    mine_trees = ring_trees(PRESETS[preset], n, per_worker, name)
    others = [
        p
        for p in _known_by(preset)
        if (trees := ring_trees(PRESETS[p], n, per_worker, name)) is not None and trees != mine_trees
    ]

    def telling(x: torch.Tensor) -> bool:
        mine = ring_all_reduce(x, schedule=preset)
        return all(differs(mine, ring_all_reduce(x, schedule=p)) for p in others)

    return search(rng, shape, dtype, spread, telling, tries=SEARCH_TRIES)


def _schedule_json(ring: Schedule) -> dict[str, Any]:
    if isinstance(ring, RingSchedule):
        return {"direction": ring.direction, "offset": ring.offset, "layout": ring.layout}
    return {
        "kind": "chain" if isinstance(ring, ChainSchedule) else "recursive-doubling",
        "layout": ring.layout,
    }


def build() -> dict[str, Any]:
    """The preset vector file as a JSON-ready object."""
    groups = []
    for preset, ring in PRESETS.items():
        for name, fmt in FORMATS.items():
            rng = random.Random(f"{SEED}:{preset}:{name}")
            tests = []
            for n, m, trailing, comment in SHAPES:
                if ring.layout == "even" and m % n:
                    continue
                x = _telling(rng, preset, (n, m, *trailing), fmt.torch_dtype)
                bounds = chunk_bounds(ring.layout, n, x[0].numel(), itemsize=fmt.bits // 8)
                tests.append(
                    {
                        "comment": comment,
                        "n": n,
                        "m": m,
                        "trailingShape": list(trailing),
                        "chunkSizes": [hi - lo for lo, hi in bounds],
                        "input": to_hex(x),
                        "expected": to_hex(ring_all_reduce(x, schedule=preset)),
                    }
                )
            groups.append(
                {
                    "preset": preset,
                    "schedule": _schedule_json(ring),
                    "dtype": name,
                    "bits": fmt.bits,
                    "tests": tests,
                }
            )
    return document(
        algorithm="RING-ALL-REDUCE-PRESETS",
        schema_name=SCHEMA_NAME,
        version=VERSION,
        header=HEADER,
        notes=dict(NOTES),
        groups=groups,
    )


def schema() -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of :func:`build`'s output."""
    hex_list = hex_list_schema("^([0-9a-f]{4}){1,4}$")
    test = strict(
        {
            "tcId": count_schema(),
            "comment": {"type": "string", "minLength": 1},
            **shape_schema(),
            "chunkSizes": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
            "input": hex_list,
            "expected": hex_list,
        }
    )
    group = strict(
        {
            "preset": {"enum": list(PRESETS)},
            "schedule": {
                "oneOf": [
                    schedule_schema(),
                    strict({"kind": {"const": "chain"}, "layout": {"enum": list(LAYOUTS)}}),
                    strict({"kind": {"const": "recursive-doubling"}, "layout": {"enum": list(LAYOUTS)}}),
                ]
            },
            "dtype": {"enum": list(FORMATS)},
            "bits": {"enum": [16, 32, 64]},
            "tests": {"type": "array", "items": test},
        }
    )
    return document_schema(
        schema_name=SCHEMA_NAME,
        title=f"ring all-reduce preset conformance vectors v{VERSION}",
        algorithm="RING-ALL-REDUCE-PRESETS",
        notes={"type": "object", "additionalProperties": {"type": "string"}},
        test_groups={"type": "array", "items": group},
    )


def contents() -> dict[str, str]:
    """File name -> text of the two preset files."""
    return json_texts({JSON_NAME: build(), SCHEMA_NAME: schema()})


def write(out_dir: Path) -> list[Path]:
    """Write the two preset files into ``out_dir`` (created if needed); return their paths."""
    return write_files(out_dir, contents())
