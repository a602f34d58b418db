"""The findings catalogue's writer and checker (``tools/findings_pages.py``, spec ``findings.md``).

No library runs here: the results are written by hand in the shape the command line prints (``reveal
--json``, ``difftest --json``, ``invariance --json``), and the committed ``docs/findings/findings.json``
is checked against the schema and its pages against the writer.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.common.paths import DOCS
from tools import findings_pages as pages

pytestmark = pytest.mark.clause("findings-catalogue")

RING = {"direction": 1, "offset": 1, "layout": "ceil"}


def _reveal(trees: list[Any], *, ring: dict[str, Any] | None = None, matches: list[str] | None = None) -> Any:
    """A ``reveal --json`` document of ``N = 3`` in the command's own shape, as the runner caches it."""
    document = {
        "format": "ring-ref-reveal",
        "version": 3,
        "n": 3,
        "m": len(trees),
        "trees": trees,
        "ring": ring,
        "matches": matches or [],
        "classification": "ring" if ring else "trees",
    }
    return {"json": document, "error": "", "svg": "x.svg"}


FOLD_120 = {"fold": [1, 2, 0]}
FOLD_201 = {"fold": [2, 0, 1]}
PAIRS = [[0, 1], 2]


def _catalogue() -> dict[str, Any]:
    ring = _reveal([FOLD_120] * 3 + [FOLD_201] * 4, ring=RING, matches=["mpich-ring"])
    passed = {"json": {"verdict": "pass", "summary": "PASS: t matches"}, "error": ""}
    hung = {"json": None, "error": "Traceback ...\nerror: a call took longer than 30 s"}
    cells = [
        pages.cell("default", {}, 3, 7, revealed=_reveal([PAIRS] * 7), certified=passed),
        pages.cell("ring", {"V": "ring"}, 3, 7, revealed=ring, certified=passed),
        pages.cell("tree", {"V": "tree"}, 3, 7, revealed=hung, certified=None),
    ]
    invariance = [
        pages.invariance_entry(
            "default", 3, [7], {"json": {"invariant": True, "summary": "order invariant"}}
        ),
        pages.invariance_entry("tree", 3, [7], hung),
    ]
    library = {
        "key": "lib",
        "title": "Lib",
        "library": "Lib 1.0",
        "pip": "lib 1.0",
        "install": "pip install lib",
        "machine": "x86_64",
        "variable": "V",
        "algorithms": ["default", "ring", "tree"],
        "algorithms_error": "",
        "command": "make findings FINDINGS=lib",
        "generated": "2025-12-31",
        "n_planned": [2, 3],
        "scan": [{"n": 3, "sizes": [{"m": 7, "kind": "trees", "svg": ""}]}],
        "switches": [],
        "cells": cells,
        "invariance": invariance,
    }
    return {"format": pages.FORMAT, "version": 1, "generated": "2026-01-01", "libraries": {"lib": library}}


def test_a_catalogue_is_written_and_read_back(tmp_path: Path) -> None:
    document = _catalogue()
    (tmp_path / "svg").mkdir()
    for name in ("x.svg", "stale.svg"):
        (tmp_path / "svg" / name).write_text("<svg/>")
    pages.write(document, tmp_path)
    assert [p.name for p in (tmp_path / "svg").iterdir()] == ["x.svg"]  # a drawing no finding names goes
    back = json.loads((tmp_path / "findings.json").read_text())
    assert pages.problems(back) == []
    ring = back["libraries"]["lib"]["cells"][1]
    assert [(r["first"], r["last"], r["text"]) for r in ring["runs"]] == [
        (0, 2, "fold 1,2,0"),
        (3, 6, "fold 2,0,1"),
    ]
    page = (tmp_path / "lib.md").read_text()
    assert (
        "| 3 | 7 | ring (direction +1, offset 1, layout ceil)<br>`0..2: fold 1,2,0`<br>`3..6: fold 2,0,1`"
        in page
    )
    assert "| mpich-ring | pass | [svg](svg/x.svg) |" in page
    assert "**failed**: error: a call took longer than 30 s" in page  # the failure kept, with its error
    assert "- N = 3: invariant: order invariant" in page and "- N = 3: failed: error: a call took" in page
    assert "| no preset | pass |" in page  # the default's trees name no preset
    assert "- default: N = 2\n- ring: N = 2\n- tree: N = 2\n" in page  # what was not run is said
    assert page.count("Generated ") == 1  # the one line that changes between reruns
    # each page the date its library was run, the index the last run's
    assert "Generated 2025-12-31 by `make findings FINDINGS=lib`" in page
    index = (tmp_path / "index.md").read_text()
    assert "[Lib](lib.md)" in index and "Generated 2026-01-01 by `make findings`" in index
    (tmp_path / "again").mkdir()
    pages.write(back, tmp_path / "again")
    assert (tmp_path / "again" / "lib.md").read_text() == page  # deterministic


def _planted(plant: Any) -> list[str]:
    document = copy.deepcopy(_catalogue())
    plant(document["libraries"]["lib"]["cells"])
    return pages.problems(document)


def test_a_planted_wrong_finding_is_refused(tmp_path: Path) -> None:
    assert pages.problems(_catalogue()) == []

    def gap(cells: Any) -> None:
        cells[1]["runs"][1]["first"] = 4

    def short(cells: Any) -> None:
        cells[1]["runs"][1]["last"] = 5

    def uncertified(cells: Any) -> None:
        cells[1]["certified"] = None

    def unknown_preset(cells: Any) -> None:
        cells[1]["matches"] = ["no-such-preset"]

    def failure_without_error(cells: Any) -> None:
        del cells[2]["error"]

    def revealed_without_trees(cells: Any) -> None:
        del cells[0]["runs"]

    assert "do not cover the elements in order at 4..6" in " ".join(_planted(gap))
    assert "the runs cover 6 of 7 elements" in " ".join(_planted(short))
    assert "presets named without a certification" in " ".join(_planted(uncertified))
    for plant in (unknown_preset, failure_without_error, revealed_without_trees):
        assert _planted(plant), plant.__name__
    document = _catalogue()
    gap(document["libraries"]["lib"]["cells"])
    with pytest.raises(ValueError, match="not a findings catalogue"):
        pages.write(document, tmp_path)
    assert not (tmp_path / "findings.json").exists()


def test_switch_sizes_are_where_the_kind_changes() -> None:
    ring = _reveal([FOLD_120] * 3 + [FOLD_201] * 4, ring=RING)
    other_ring = _reveal([FOLD_201] * 64, ring={"direction": 1, "offset": 2, "layout": "even"})
    trees = _reveal([PAIRS] * 7)
    failed = {"json": None, "error": "error: starting 3 MPI rank(s) failed"}
    same = [pages.scan_point(7, ring), pages.scan_point(64, ring)]
    assert same[0]["kind"] == same[1]["kind"] == "ring (direction +1, offset 1)"
    scans = [
        {"n": 3, "sizes": [*same, pages.scan_point(512, trees), pages.scan_point(4096, other_ring)]},
        {"n": 4, "sizes": [pages.scan_point(9, trees), pages.scan_point(64, failed)]},
    ]
    assert pages.scan_point(64, failed)["kind"] == "failed: error: starting 3 MPI rank(s) failed"
    assert pages.switch_sizes(scans) == [[9, 64], [64, 512], [512, 4096]]
    assert pages.row_sizes(3, pages.switch_sizes(scans), 4096) == [7, 64, 512, 4096]
    assert pages.row_sizes(2, [], 4096) == [5, 4096]


def test_a_partial_run_replaces_only_its_findings() -> None:
    old = _catalogue()["libraries"]["lib"]
    new = copy.deepcopy(old)
    new["cells"] = [pages.cell("tree", {"V": "tree"}, 3, 7, revealed=_reveal([PAIRS] * 7), certified=None)]
    new["invariance"] = []
    merged = pages.merge(old, new)
    assert [(c["algorithm"], c["status"]) for c in merged["cells"]] == [
        ("default", "revealed"),
        ("ring", "revealed"),
        ("tree", "revealed"),
    ]
    assert len(merged["invariance"]) == 2
    assert pages.merge(None, new) is new


@pytest.mark.clause("findings-pinned")
def test_a_changed_order_differs_from_the_committed_finding() -> None:
    revealed = _reveal([FOLD_120] * 3 + [FOLD_201] * 4, ring=RING, matches=["mpich-ring"])
    finding = pages.cell("ring", {}, 3, 7, revealed=revealed, certified=None)
    assert pages.differences(finding, revealed["json"]) == []
    moved = copy.deepcopy(revealed["json"])
    moved["trees"][6] = FOLD_120  # one element in another order: the ring and presets may still read alike
    assert [d.split(":")[0] for d in pages.differences(finding, moved)] == ["trees_sha256"]
    renamed = {**revealed["json"], "matches": [], "ring": None, "classification": "folds"}
    assert len(pages.differences(finding, renamed)) == 3
    failed = pages.cell("ring", {}, 3, 7, revealed={"json": None, "error": "error: refused"}, certified=None)
    assert pages.differences(failed, revealed["json"]) == ["the finding is failed: error: refused"]


COMMITTED = DOCS / "findings" / "findings.json"


def test_the_committed_catalogue_is_valid(tmp_path: Path) -> None:
    """The committed JSON passes the schema and the checks, and its pages are the writer's (no hand edits)."""
    document = json.loads(COMMITTED.read_text())
    assert pages.problems(document) == []
    assert {"mpich", "gloo"} <= set(document["libraries"])
    pages.write(document, tmp_path)
    for written in sorted(tmp_path.iterdir()):
        assert written.read_text() == (COMMITTED.parent / written.name).read_text(), written.name
