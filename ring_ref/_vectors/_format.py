"""What every conformance vector file shares: the envelope, the schema builders, the layout on disk.

A vector file (``spec/vectors``) is a Wycheproof-style document: ``algorithm``,
``schema``, ``generatorVersion``, ``numberOfTests``, ``header`` (whose second
line names the command that writes it), ``notes`` and ``testGroups``, the tests
numbered by ``tcId`` from 1 over the whole file.  This module builds that
envelope (:func:`header`, :func:`document`) and its schema
(:func:`document_schema`, :func:`strict`, :func:`case_schema`, ...), a test's
object with the reference's buffers after every round (:func:`vector`), the
seeded inputs the generators draw (:func:`drawn`, :func:`search`,
:func:`by_chunk`), and writes the files byte for byte the same on every run
(:func:`dumps`, :func:`write_files`).  A bit pattern is the element's IEEE
encoding as a fixed-width lowercase hex integer, tensors flattened row-major:

>>> vector(VectorCase("one worker", ("SingleWorker",), torch.tensor([[1.0, -0.0]], dtype=torch.float16)),
...        torch.tensor([1.0, -0.0], dtype=torch.float16))["expected"]
['3c00', '8000']

The files themselves are built by ``_sums`` (the v1 sums), ``_ops`` (the other
reduction ops) and ``_presets`` (the schedule presets).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, NamedTuple

import torch

from ring_ref._dtypes import FORMATS, bits, to_hex
from ring_ref._ops import Op
from ring_ref._tracecheck import reference_rounds
from ring_ref.schedule import LAYOUTS, PHASES

ROUND_BUFFER_LIMIT: Final = 96
"""Per-round buffers are included when ``n > 1`` and the input has at most this many elements."""


class VectorCase(NamedTuple):
    """One vector before its expected values are computed."""

    comment: str
    flags: tuple[str, ...]
    x: torch.Tensor


# --- inputs ----------------------------------------------------------------------------------------


def tensor(values: Sequence[float], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """``values`` (row-major) rounded to ``dtype`` and shaped ``shape``.

    >>> tensor([1.0, 2.0 ** -30], (2, 1), torch.float16).flatten().tolist()
    [1.0, 0.0]
    """
    return torch.tensor(values, dtype=torch.float64).to(dtype).reshape(shape)


def spread(rng: random.Random) -> float:
    """Both signs, full significands, 2^-6 .. 2^6: additions round, so orders differ in the bits."""
    return rng.choice((-1.0, 1.0)) * (1.0 + rng.random()) * 2.0 ** rng.randint(-6, 6)


def uniform(rng: random.Random) -> float:
    """A value in ``[-8, 8)``."""
    return rng.uniform(-8.0, 8.0)


def drawn(
    rng: random.Random, shape: tuple[int, ...], dtype: torch.dtype, draw: Callable[[random.Random], float]
) -> torch.Tensor:
    """A tensor of ``shape`` whose elements, in row-major order, are ``draw(rng)`` rounded to ``dtype``."""
    return tensor([draw(rng) for _ in range(math.prod(shape))], shape, dtype)


def search(
    rng: random.Random,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    draw: Callable[[random.Random], float],
    telling: Callable[[torch.Tensor], bool],
    *,
    tries: int,
) -> torch.Tensor:
    """The first of up to ``tries`` inputs :func:`drawn` in turn on which ``telling`` holds."""
    for _ in range(tries):
        x = drawn(rng, shape, dtype, draw)
        if telling(x):
            return x
    raise AssertionError(f"no telling input of shape {shape} for {dtype} in {tries} draws")


def by_chunk(n: int, rows: int, pattern: Sequence[float], dtype: torch.dtype) -> torch.Tensor:
    """Worker ``(c + k) mod n`` holds ``pattern[k]`` throughout chunk ``c`` (``rows`` rows per chunk).

    >>> by_chunk(3, 1, [5.0, 6.0], torch.float32).tolist()
    [[5.0, 0.0, 6.0], [6.0, 5.0, 0.0], [0.0, 6.0, 5.0]]
    """
    values = [[0.0] * (n * rows) for _ in range(n)]
    for c in range(n):
        for k, v in enumerate(pattern):
            for row in range(rows):
                values[(c + k) % n][c * rows + row] = v
    return tensor([v for worker in values for v in worker], (n, n * rows), dtype)


def differs(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` differ in any bit (so ``-0.0`` differs from ``+0.0``)."""
    return not torch.equal(bits(a), bits(b))


# --- the document ----------------------------------------------------------------------------------


def vector(case: VectorCase, expected: torch.Tensor, op: Op = "sum") -> dict[str, Any]:
    """The JSON object of one test, less its ``tcId`` (:func:`document` numbers the tests).

    Small cases (``n > 1``, at most :data:`ROUND_BUFFER_LIMIT` elements) carry
    the reference's buffers after every round under ``op``.
    """
    x = case.x
    n = x.shape[0]
    out: dict[str, Any] = {
        "comment": case.comment,
        "flags": list(case.flags),
        "n": n,
        "m": x.shape[1],
        "trailingShape": list(x.shape[2:]),
        "input": to_hex(x),
        "expected": to_hex(expected),
    }
    if n > 1 and x.numel() <= ROUND_BUFFER_LIMIT:
        rounds, _ = reference_rounds(x, op)
        out["rounds"] = [{"phase": r.phase, "round": r.round, "buffers": to_hex(r.buffers)} for r in rounds]
    return out


def header(version: int, subject: str, command: str, *details: str) -> list[str]:
    """The ``header`` lines: what the file holds, the ``command`` that writes it, then ``details``.

    >>> header(1, "x.", "ring-ref vectors --out DIR")[1]
    'Generated by `ring-ref vectors --out DIR`; do not edit. See spec/vectors/README.md.'
    """
    return [
        f"Conformance vectors v{version} for {subject}",
        f"Generated by `{command}`; do not edit. See spec/vectors/README.md.",
        *details,
    ]


def document(
    *,
    algorithm: str,
    schema_name: str,
    version: int,
    header: list[str],
    notes: dict[str, Any],
    groups: list[dict[str, Any]],
) -> dict[str, Any]:
    """The vector file as a JSON-ready object; the tests of ``groups`` (each group's last member,
    ``tests``) are numbered ``tcId`` 1, 2, ... in order.

    >>> groups = [{"dtype": "x", "tests": [{"n": 1}, {"n": 2}]}, {"dtype": "y", "tests": [{"n": 3}]}]
    >>> doc = document(algorithm="A", schema_name="s", version=1, header=[], notes={}, groups=groups)
    >>> doc["numberOfTests"], [[t["tcId"] for t in g["tests"]] for g in doc["testGroups"]]
    (3, [[1, 2], [3]])
    """
    tc_ids = itertools.count(1)
    numbered = [{**g, "tests": [{"tcId": next(tc_ids), **t} for t in g["tests"]]} for g in groups]
    return {
        "algorithm": algorithm,
        "schema": schema_name,
        "generatorVersion": str(version),
        "numberOfTests": next(tc_ids) - 1,
        "header": header,
        "notes": notes,
        "testGroups": numbered,
    }


# --- the schemas -----------------------------------------------------------------------------------


def strict(properties: dict[str, Any], required: Sequence[str] | None = None) -> dict[str, Any]:
    """A schema object with exactly ``properties``, of which ``required`` (default: all) must be present."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(properties if required is None else required),
        "properties": properties,
    }


def schedule_schema() -> dict[str, Any]:
    """A ring of the schedule family: ``{direction, offset, layout}``."""
    return strict(
        {
            "direction": {"enum": [1, -1]},
            "offset": {"type": "integer"},
            "layout": {"enum": list(LAYOUTS)},
        }
    )


def count_schema() -> dict[str, Any]:
    """A positive integer: ``tcId``, ``n``, ``m``, a trailing dimension."""
    return {"type": "integer", "minimum": 1}


def hex_list_schema(pattern: str) -> dict[str, Any]:
    """A non-empty list of bit patterns, each matching ``pattern``."""
    return {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": pattern}}


def shape_schema() -> dict[str, Any]:
    """A test's parameters: ``n``, ``m`` and ``trailingShape``."""
    trailing = {"type": "array", "items": count_schema()}
    return {"n": count_schema(), "m": count_schema(), "trailingShape": trailing}


def case_schema(bits: int, flags: Sequence[str], *, min_rounds: int = 0) -> dict[str, Any]:
    """One test of a group of ``bits``-bit values: flags among ``flags``, optional rounds (at least
    ``min_rounds`` when present)."""
    hex_list = hex_list_schema(f"^[0-9a-f]{{{bits // 4}}}$")
    round_obj = strict(
        {"phase": {"enum": list(PHASES)}, "round": {"type": "integer", "minimum": 0}, "buffers": hex_list}
    )
    return strict(
        {
            "tcId": count_schema(),
            "comment": {"type": "string", "minLength": 1},
            "flags": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": list(flags)}},
            **shape_schema(),
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


def dtype_groups(
    test_type: str, tests: Callable[[int], dict[str, Any]], members: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``$defs`` of one group schema per dtype, ``<dtype>Group``: ``type`` ``test_type``, ``members``,
    the dtype's name and width, and ``tests(bits)``."""
    return {
        f"{name}Group": strict(
            {
                "type": {"const": test_type},
                **(members or {}),
                "dtype": {"const": name},
                "bits": {"const": fmt.bits},
                "tests": tests(fmt.bits),
            }
        )
        for name, fmt in FORMATS.items()
    }


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
            "numberOfTests": count_schema(),
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


# --- the files -------------------------------------------------------------------------------------


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


def json_texts(documents: dict[str, Any]) -> dict[str, str]:
    """File name -> :func:`dumps` text (with a final newline) of each of ``documents``."""
    return {name: dumps(doc) + "\n" for name, doc in documents.items()}


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
