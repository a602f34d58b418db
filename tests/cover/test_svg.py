"""The ring picture (``ring-ref trace --format svg``): well-formed, one panel per round, right content.

Expected contents are typed in from the spec (send formulas, contribution
counts); nothing here renders the SVG, it is parsed as XML.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ring_ref._svg import rounds_svg, slot_colour
from ring_ref._trace import trace
from tests.common.oracles import spec_slot
from tests.common.paths import ROOT

NS = "{http://www.w3.org/2000/svg}"
DOC = ROOT / "docs" / "ring-n4.svg"


def spec_count(phase: str, r: int, i: int, c: int, n: int) -> int:
    """How many contributions slot c of worker i holds (clauses inv-rs/ag-provenance)."""
    return 1 if phase == "start" else len(spec_slot(phase, r, i, c, n))


def _panels(n: int) -> list[ET.Element]:
    root = ET.fromstring(rounds_svg(trace(n)))
    assert root.tag == f"{NS}svg"
    return [g for g in root.iter(f"{NS}g") if g.get("class") == "panel"]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.clause("round-count")
def test_one_panel_per_round(n: int) -> None:
    labels = [(g.get("data-phase"), int(g.get("data-round", "x"))) for g in _panels(n)]
    want = [("start", -1)]
    want += [("reduce-scatter", r) for r in range(n - 1)] + [("all-gather", r) for r in range(n - 1)]
    assert labels == want


@pytest.mark.parametrize("n", [2, 3, 4, 7])
@pytest.mark.clause("rs-send-chunk", "ag-send-chunk", "inv-finished-chunks")
def test_panels_draw_the_spec_sends_and_slots(n: int) -> None:
    for panel in _panels(n):
        phase, r = panel.get("data-phase", ""), int(panel.get("data-round", "x"))
        arrows = [
            (int(p.get("data-src", "x")), int(p.get("data-dst", "x")), int(p.get("data-chunk", "x")))
            for p in panel.iter(f"{NS}path")
            if p.get("class") == "send"
        ]
        if phase == "start":
            assert arrows == []
        else:
            shift = 0 if phase == "reduce-scatter" else 1
            assert arrows == [(i, (i + 1) % n, (i + shift - r) % n) for i in range(n)]
        slots = [s for s in panel.iter(f"{NS}rect") if "slot" in (s.get("class") or "").split()]
        assert len(slots) == n * n
        for s in slots:
            i, c, count = (int(s.get(k, "x")) for k in ("data-worker", "data-chunk", "data-count"))
            assert count == spec_count(phase, r, i, c, n)
            assert s.get("fill") == slot_colour(count, n)
            assert ("finished" in (s.get("class") or "").split()) == (count == n)


def test_colours_are_distinct_and_ordered_from_pale_to_dark() -> None:
    n = 6
    colours = [slot_colour(k, n) for k in range(1, n + 1)]
    assert len(set(colours)) == n
    lightness = [sum(int(col[j : j + 2], 16) for j in (1, 3, 5)) for col in colours]
    assert lightness == sorted(lightness, reverse=True)


def test_committed_n4_picture_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == rounds_svg(trace(4)), (
        "docs/ring-n4.svg is stale: regenerate with `ring-ref trace -n 4 --format svg > docs/ring-n4.svg`"
    )
