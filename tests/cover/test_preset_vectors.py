"""The schedule presets' conformance vectors (``spec/vectors/ring_all_reduce_presets_v1.json``).

Every expected value is re-derived without ``ring_ref``: bit patterns decoded
by reinterpreting integers, chunks from ``tests.common.oracles.blocks_bounds`` /
``gloo_bounds`` (gloo's arithmetic in bytes, as its source does) / ``ceil_bounds`` / ``floor_bounds``, results
from ``tests.common.oracles.schedule_fold`` (the chain's from ``tests.common.oracles.left_fold``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import torch

from ring_ref._cli import main
from tests.common.oracles import (
    blocks_bounds,
    ceil_bounds,
    floor_bounds,
    gloo_bounds,
    left_fold,
    same_bits,
    schedule_fold,
)
from tests.common.planted_orders import recursive_doubling
from tests.common.vector_files import VECTORS, check_regenerated, expected_of, input_of, load

JSON_FILE = VECTORS / "ring_all_reduce_presets_v1.json"
SCHEMA_FILE = VECTORS / "ring_all_reduce_presets_schema_v1.json"
GENERATED = (JSON_FILE.name, SCHEMA_FILE.name)
DOC: dict[str, Any] = load(JSON_FILE)
FIRST_RINGS = {"spec": (1, 0, "even"), "openmpi-ring": (1, 0, "blocks"), "gloo": (-1, -1, "gloo")}
LIBRARY_RINGS = {"mpich-ring": (1, 1, "ceil"), "intel-ring": (1, 0, "floor"), "mlx-ring": (-1, 0, "ceil")}
"""Published after the chain: their vectors differ from the chain's and from every ring's published with
them or before them (MLX's came after MPICH's and Intel's)."""
PUBLISHED_WITH = {"mpich-ring": ("mpich-ring", "intel-ring"), "intel-ring": ("mpich-ring", "intel-ring")}
RINGS = FIRST_RINGS | LIBRARY_RINGS
VECTOR_LIST = [(group, t) for group in DOC["testGroups"] for t in group["tests"]]


def _bounds(layout: str, n: int, s: int, itemsize: int) -> list[tuple[int, int]]:
    if layout == "blocks":
        return blocks_bounds(n, s)
    if layout == "gloo":
        return gloo_bounds(n, s, itemsize)
    if layout == "ceil":
        return ceil_bounds(n, s)
    if layout == "floor":
        return floor_bounds(n, s)
    return [(c * s // n, (c + 1) * s // n) for c in range(n)]


@pytest.mark.clause("schedule-presets", "chain-vectors", "doubling-tools")
def test_committed_files_are_what_the_generator_writes_and_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["vectors", "--presets", "--out", str(tmp_path)]) == 0
    check_regenerated(tmp_path, capsys.readouterr().out, ("--presets",), GENERATED)
    jsonschema.validate(DOC, load(SCHEMA_FILE))
    assert DOC["numberOfTests"] == len(VECTOR_LIST) == len({t["tcId"] for _, t in VECTOR_LIST})
    assert {g["preset"] for g in DOC["testGroups"]} == {*RINGS, "chain", "recursive-doubling"}


@pytest.mark.clause(
    "schedule-presets", "schedule-layouts", "schedule-fold-order", "chain-vectors", "doubling-tools"
)
@pytest.mark.parametrize("vector", VECTOR_LIST, ids=lambda v: f"{v[0]['preset']}-{v[1]['tcId']}")
def test_expected_results_match_the_independent_fold(vector: tuple[dict[str, Any], dict[str, Any]]) -> None:
    group, t = vector
    if group["preset"] == "recursive-doubling":
        assert group["schedule"] == {"kind": "recursive-doubling", "layout": "blocks"}
        x = input_of(group["dtype"], t)
        assert t["chunkSizes"] == [hi - lo for lo, hi in blocks_bounds(t["n"], x[0].numel())]
        assert same_bits(expected_of(group["dtype"], t), recursive_doubling(x))
        return
    if group["preset"] == "chain":
        assert group["schedule"] == {"kind": "chain", "layout": "blocks"}
        x = input_of(group["dtype"], t)
        assert t["chunkSizes"] == [hi - lo for lo, hi in blocks_bounds(t["n"], x[0].numel())]
        assert same_bits(expected_of(group["dtype"], t), left_fold(x, "sum"))
        return
    d, k, layout = RINGS[group["preset"]]
    assert group["schedule"] == {"direction": d, "offset": k, "layout": layout}
    x = input_of(group["dtype"], t)
    bounds = _bounds(layout, t["n"], x[0].numel(), group["bits"] // 8)
    assert t["chunkSizes"] == [hi - lo for lo, hi in bounds]
    want = schedule_fold(x, d, k, bounds)
    assert same_bits(expected_of(group["dtype"], t), want)


@pytest.mark.clause("schedule-presets", "chain-vectors", "doubling-tools")
def test_every_vector_tells_its_preset_from_the_others() -> None:
    """Each vector's bits differ from those of every ring preset whose fold order differs on that shape
    (the first rings' vectors predate the chain; the chain's differ from theirs; the libraries' rings'
    from every ring's and the chain's)."""
    for group, t in VECTOR_LIST:
        x = input_of(group["dtype"], t)
        s, size = x[0].numel(), group["bits"] // 8
        expected = expected_of(group["dtype"], t)
        if group["preset"] == "recursive-doubling":
            _tells_doubling(t, x, expected, size)
            continue
        if group["preset"] == "chain":
            for preset, (d, k, layout) in FIRST_RINGS.items():
                if (layout == "even" and t["m"] % t["n"]) or _orders(
                    (d, k, layout), t["n"], s, size
                ) == _chain_orders(t["n"], s):
                    continue
                assert not same_bits(expected, schedule_fold(x, d, k, _bounds(layout, t["n"], s, size))), (
                    preset
                )
            continue
        mine = RINGS[group["preset"]]
        if group["preset"] == "mlx-ring" and t["n"] >= 4:  # published after recursive doubling
            assert not same_bits(expected, recursive_doubling(x)), (t["tcId"], "recursive-doubling")
        if group["preset"] in LIBRARY_RINGS and _orders(mine, t["n"], s, size) != _chain_orders(t["n"], s):
            assert not same_bits(expected, left_fold(x, "sum")), (t["tcId"], "chain")
        for preset, (d, k, layout) in _told_from(group["preset"]).items():
            if layout == "even" and t["m"] % t["n"]:
                continue
            if _orders((d, k, layout), t["n"], s, size) == _orders(mine, t["n"], s, size):
                continue
            other = schedule_fold(x, d, k, _bounds(layout, t["n"], s, size))
            assert not same_bits(expected, other), (t["tcId"], preset)


def _tells_doubling(t: dict[str, Any], x: torch.Tensor, expected: torch.Tensor, size: int) -> None:
    """A recursive-doubling vector differs from the chain (``N >= 4``: at ``N = 3`` its tree is the chain's
    fold) and from every ring published before it whose order differs there."""
    s = x[0].numel()
    if t["n"] >= 4:
        assert not same_bits(expected, left_fold(x, "sum")), (t["tcId"], "chain")
    for preset, (d, k, layout) in _told_from("intel-ring").items():  # the rings published before it
        if (layout == "even" and t["m"] % t["n"]) or (
            t["n"] < 4 and _orders((d, k, layout), t["n"], s, size) == _chain_orders(t["n"], s)
        ):
            continue
        other = schedule_fold(x, d, k, _bounds(layout, t["n"], s, size))
        assert not same_bits(expected, other), (t["tcId"], preset)


def _told_from(preset: str) -> dict[str, tuple[int, int, str]]:
    """The rings a ring preset's vectors differ from: those published with it or before it."""
    if preset not in LIBRARY_RINGS:
        return FIRST_RINGS
    return FIRST_RINGS | {p: RINGS[p] for p in PUBLISHED_WITH.get(preset, tuple(LIBRARY_RINGS))}


def _chain_orders(n: int, s: int) -> list[tuple[frozenset[int], ...]]:
    """The chain's order for every element, as :func:`_orders` writes it."""
    return [(frozenset((0, 1)), *(frozenset([w]) for w in range(2, n)))] * s


def _orders(ring: tuple[int, int, str], n: int, s: int, size: int) -> list[tuple[frozenset[int], ...]]:
    """Each element's fold order, with the first two workers (which commute) as one set."""
    d, k, layout = ring
    out = []
    for c, (lo, hi) in enumerate(_bounds(layout, n, s, size)):
        order = [(c + k + j * d) % n for j in range(n)]
        key = (frozenset(order[:2]), *(frozenset([w]) for w in order[2:]))
        out.extend([key] * (hi - lo))
    return out
