"""Reduce-scatter's and all-gather's conformance vectors (``spec/vectors/ring_reduce_scatter_v1.json``,
``ring_all_gather_v1.json``; clause ``collective-vectors``).

Every expected value is re-derived without ``ring_ref``: bit patterns decoded by
reinterpreting integers, shards from ``tests.common.oracles.reduce_scatter_fold``; the
gathered buffer is the shards' bit patterns in order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref._cli import main
from tests.common.oracles import bits, reduce_scatter_fold, ring_fold, same_bits
from tests.common.vector_files import VECTORS, check_regenerated, decode, expected_of, input_of, load

RS_FILE = VECTORS / "ring_reduce_scatter_v1.json"
AG_FILE = VECTORS / "ring_all_gather_v1.json"
GENERATED = (
    "ring_reduce_scatter_v1.json",
    "ring_reduce_scatter_schema_v1.json",
    "ring_all_gather_v1.json",
    "ring_all_gather_schema_v1.json",
)
RS_DOC: dict[str, Any] = load(RS_FILE)
AG_DOC: dict[str, Any] = load(AG_FILE)
RINGS = {"spec": (1, 1, "even"), "gloo": (-1, -1, "gloo")}
RS_VECTORS = [(g, t) for g in RS_DOC["testGroups"] for t in g["tests"]]
AG_VECTORS = [(g, t) for g in AG_DOC["testGroups"] for t in g["tests"]]


@pytest.mark.clause("collective-vectors")
def test_committed_files_are_what_the_generator_writes_and_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["vectors", "--collectives", "--out", str(tmp_path)]) == 0
    check_regenerated(tmp_path, capsys.readouterr().out, ("--collectives",), GENERATED)
    jsonschema.validate(RS_DOC, load(VECTORS / "ring_reduce_scatter_schema_v1.json"))
    jsonschema.validate(AG_DOC, load(VECTORS / "ring_all_gather_schema_v1.json"))
    assert {g["preset"] for g in RS_DOC["testGroups"]} == set(RINGS)
    assert {g["dtype"] for g in AG_DOC["testGroups"]} == {"float16", "bfloat16", "float32", "float64"}


@pytest.mark.clause("collective-vectors", "rsc-fold-order")
@pytest.mark.parametrize("vector", RS_VECTORS, ids=lambda v: f"{v[0]['preset']}-{v[1]['tcId']}")
def test_reduce_scatter_vectors_are_the_fold_from_r_plus_d(
    vector: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    group, t = vector
    d, k, layout = RINGS[group["preset"]]
    assert group["schedule"] == {"direction": d, "offset": k, "layout": layout}
    x = input_of(group["dtype"], t)
    n, m = t["n"], t["m"]
    expected = expected_of(group["dtype"], t).reshape(n, m // n, *t["trailingShape"])
    assert same_bits(expected, reduce_scatter_fold(x, "sum", d))
    if n >= 3:  # folding chunk r from r (the spec's all-reduce ring) fails the vector
        assert not same_bits(expected, ring_fold(x.reshape(n, m, -1)).reshape(expected.shape))
    if n >= 4:  # so does the other direction
        assert not same_bits(expected, reduce_scatter_fold(x, "sum", -d))


@pytest.mark.clause("collective-vectors", "agc-copy")
@pytest.mark.parametrize("vector", AG_VECTORS, ids=lambda v: f"{v[0]['dtype']}-{v[1]['tcId']}")
def test_all_gather_vectors_are_the_shards_bit_for_bit(vector: tuple[dict[str, Any], dict[str, Any]]) -> None:
    group, t = vector
    assert t["expected"] == t["input"]  # row-major (n, s, ...) is row-major (n s, ...)
    shards = input_of(group["dtype"], t)
    gathered = decode(t["expected"], group["dtype"], [t["n"] * t["m"], *t["trailingShape"]])
    assert torch.equal(bits(gathered), bits(shards).reshape(gathered.shape))
    assert bool((~torch.isfinite(shards)).any()), "every test carries NaNs or infinities"
