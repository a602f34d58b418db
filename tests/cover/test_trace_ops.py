"""Traces of every reduction op (clause ``op-trace``): the table, the JSON trace and its schema, the SVG.

The expected tables and documents are written out here from the spec (the
schedule, the provenance closed forms, the combines of spec/operations.md), not produced by
``ring_ref``.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from ring_ref._cli import main
from ring_ref._svg import rounds_svg
from ring_ref._trace import render_table, trace, trace_json
from tests.common.oracles import spec_slot
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "trace.schema.json").read_text(encoding="utf-8"))
NS = "{http://www.w3.org/2000/svg}"
OPS = ("sum", "prod", "max", "min", "avg")
RS_OPERATION = {"sum": "add", "prod": "multiply", "max": "max", "min": "min", "avg": "add"}

PROD_N2 = """\
op: prod (spec section 9, clause op-prod)

start: every slot holds only its own worker's value
             chunk 0 chunk 1
  worker 0:  0       0
  worker 1:  1       1

reduce-scatter round 0 (receiver multiplies into the slot): 0->1 chunk 0, 1->0 chunk 1
             chunk 0 chunk 1
  worker 0:  0       1x0*
  worker 1:  0x1*    1

all-gather round 0 (receiver copies into the slot): 0->1 chunk 1, 1->0 chunk 0
             chunk 0 chunk 1
  worker 0:  0x1*    1x0*
  worker 1:  0x1*    1x0*

axbxc = contributions of workers a, b, c multiplied in that order;  * = finished chunk"""

AVG_N2 = """\
op: avg (spec section 9, clause op-avg)

start: every slot holds only its own worker's value
             chunk 0  chunk 1
  worker 0:  0        0
  worker 1:  1        1

reduce-scatter round 0 (receiver adds into the slot): 0->1 chunk 0, 1->0 chunk 1
             chunk 0  chunk 1
  worker 0:  0        1+0*
  worker 1:  0+1*     1

all-gather round 0 (receiver copies into the slot): 0->1 chunk 1, 1->0 chunk 0
             chunk 0  chunk 1
  worker 0:  0+1*     1+0*
  worker 1:  0+1*     1+0*

divide (op avg): every worker divides every slot by N = 2, rounded once to the dtype; nothing is sent
             chunk 0  chunk 1
  worker 0:  (0+1)/2* (1+0)/2*
  worker 1:  (0+1)/2* (1+0)/2*

a+b+c = contributions of workers a, b, c added in that order; (a+b+c)/N = that sum divided by N, \
rounded once;  * = finished chunk"""


@pytest.mark.clause("op-trace", "op-prod")
def test_prod_table_for_two_workers() -> None:
    assert render_table(trace(2, op="prod")) == PROD_N2


@pytest.mark.clause("op-trace", "op-avg")
def test_avg_table_adds_in_the_rounds_then_divides_once() -> None:
    assert render_table(trace(2, op="avg")) == AVG_N2


@pytest.mark.clause("op-trace", "op-max", "op-min")
@pytest.mark.parametrize(("op", "sign"), [("max", ">"), ("min", "<")])
def test_max_and_min_tables_name_the_first_extreme_in_fold_order(op: str, sign: str) -> None:
    """N = 3, round 1: worker 0 holds chunk 1 = op(x1, x2, x0) finished and chunk 2 = op(x2, x0)."""
    lines = render_table(trace(3, op=op)).splitlines()
    assert lines[0] == f"op: {op} (spec section 9, clause op-{op})"
    headline = (
        f"reduce-scatter round 1 (receiver keeps own if own {sign} incoming, else incoming): "
        "0->1 chunk 2, 1->2 chunk 0, 2->0 chunk 1"
    )
    at = lines.index(headline)
    assert lines[at + 2].split() == ["worker", "0:", "0", f"{op}(1,2,0)*", f"{op}(2,0)"]
    assert lines[at + 4].split() == ["worker", "2:", f"{op}(0,1,2)*", f"{op}(1,2)", "2"]
    assert lines[-1].startswith(f"{op}(a,b,c) = the first {'maximum' if op == 'max' else 'minimum'} ")
    assert "(of -0 and +0, the one met first)" in lines[-1]


@pytest.mark.clause("op-trace")
def test_one_worker_avg_still_divides() -> None:
    lines = render_table(trace(1, op="avg")).splitlines()
    assert lines[2] == "start: every slot holds only its own worker's value"
    assert lines[6].startswith("divide (op avg): every worker divides every slot by N = 1")
    assert lines[8].split() == ["worker", "0:", "(0)/1*"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.clause("op-trace", "rs-send-chunk", "ag-send-chunk", "inv-rs-provenance", "inv-ag-provenance")
def test_json_trace_of_every_op(op: str, n: int) -> None:
    """The rounds and provenance of every op are the sum's; the sends' op, the op field and avg's
    divide step are what change."""
    doc = trace_json(trace(n, op=op), 2 * n)
    jsonschema.validate(doc, SCHEMA)
    assert ("op" in doc) == (op != "sum")
    assert doc.get("op", "sum") == op
    labels = [(rd["phase"], rd["round"]) for rd in doc["rounds"]]
    want = [("start", -1)] + [("reduce-scatter", r) for r in range(n - 1)]
    want += [("all-gather", r) for r in range(n - 1)]
    assert labels == ([*want, ("divide", 0)] if op == "avg" else want)
    for rd in doc["rounds"]:
        if rd["phase"] in ("reduce-scatter", "all-gather"):
            rs = rd["phase"] == "reduce-scatter"
            assert [s["op"] for s in rd["sends"]] == [RS_OPERATION[op] if rs else "copy"] * n
            assert [s["elements"] for s in rd["sends"]] == [2] * n
        phase, r = {"start": ("reduce-scatter", -1), "divide": ("all-gather", n - 2)}.get(
            rd["phase"], (rd["phase"], rd["round"])
        )
        for i, worker in enumerate(rd["workers"]):
            assert [s["contributions"] for s in worker["slots"]] == [
                spec_slot(phase, r, i, c, n) for c in range(n)
            ]
    if op == "avg":
        last = doc["rounds"][-1]
        assert (last["sends"], last["divisor"]) == ([], n)
        assert all(w["finishedChunks"] == list(range(n)) for w in last["workers"])
    assert "divisor" not in json.dumps(doc["rounds"][: len(want)])
    assert doc["traffic"]["rounds"] == 2 * (n - 1)
    assert doc["traffic"]["elementsSentByWorker"] == [2 * (n - 1) * 2] * n


@pytest.mark.clause("op-trace")
def test_a_sum_trace_is_what_it_always_was() -> None:
    """A version-1 trace written before ops existed (N = 1, typed in) stays valid, and a sum trace
    today has no op field and no divide step."""
    old: dict[str, Any] = {
        "format": "ring-ref-trace",
        "version": 1,
        "n": 1,
        "m": 1,
        "elementsPerWorker": 1,
        "chunkElements": 1,
        "rounds": [
            {
                "phase": "start",
                "round": -1,
                "sends": [],
                "workers": [
                    {"worker": 0, "slots": [{"chunk": 0, "contributions": [0]}], "finishedChunks": [0]}
                ],
            }
        ],
        "traffic": {
            "rounds": 0,
            "roundsPerPhase": 0,
            "elementsPerWorkerPerRound": 1,
            "elementsSentByWorker": [0],
            "elementsPerWorkerTotal": 0,
            "elementsTotal": 0,
        },
    }
    jsonschema.validate(old, SCHEMA)
    assert trace_json(trace(1), 1) == old
    assert trace_json(trace(3, op="sum"), 3) == trace_json(trace(3), 3)


def _edit(doc: dict[str, Any], how: str) -> None:
    rounds = doc["rounds"]
    if how == "divide-in-max":
        rounds.append(dict(rounds[-1], phase="divide", round=0, sends=[], divisor=doc["n"]))
    elif how == "avg-without-divide":
        rounds.pop()
    elif how == "divisor-on-a-round":
        rounds[1]["divisor"] = doc["n"]
    elif how == "divide-without-divisor":
        del rounds[-1]["divisor"]
    elif how == "divide-that-sends":
        rounds[-1]["sends"] = rounds[1]["sends"]
    elif how == "unknown-op":
        doc["op"] = "mean"
    elif how == "unknown-send-op":
        rounds[1]["sends"][0]["op"] = "divide"


@pytest.mark.parametrize(
    ("op", "how"),
    [
        ("max", "divide-in-max"),
        ("avg", "avg-without-divide"),
        ("avg", "divisor-on-a-round"),
        ("avg", "divide-without-divisor"),
        ("avg", "divide-that-sends"),
        ("prod", "unknown-op"),
        ("prod", "unknown-send-op"),
    ],
)
@pytest.mark.clause("op-trace")
def test_schema_rejects_traces_that_misplace_the_op(op: str, how: str) -> None:
    doc = trace_json(trace(3, op=op), 3)
    jsonschema.validate(doc, SCHEMA)
    _edit(doc, how)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


def _panels(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [g for g in root.iter(f"{NS}g") if g.get("class") == "panel"]


@pytest.mark.parametrize(
    ("op", "sign"), [("prod", "\u00d7"), ("max", "\u2191"), ("min", "\u2193"), ("avg", "+")]
)
@pytest.mark.clause("op-trace")
def test_svg_labels_the_reduce_scatter_arrows_with_the_op(op: str, sign: str) -> None:
    n = 3
    svg = rounds_svg(trace(n, op=op))
    assert svg.isascii()
    root = ET.fromstring(svg)
    title = root.find(f"{NS}title")
    assert title is not None and f"N = {n}, op {op}:" in (title.text or "")
    for panel in _panels(svg):
        labels = [t.text for t in panel.iter(f"{NS}text") if t.get("class") == "label"]
        if panel.get("data-phase") == "reduce-scatter":
            r = int(panel.get("data-round", "x"))
            assert labels == [f"{sign}c{(i - r) % n}" for i in range(n)]
        elif panel.get("data-phase") == "all-gather":
            assert all(label and label.startswith("=c") for label in labels)
    legend = [t.text for t in root.iter(f"{NS}text") if t.get("class") == "legend"]
    assert any(line and line.startswith(f"arrow {sign}cK: send chunk K, receiver ") for line in legend)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.clause("op-trace", "op-avg")
def test_svg_of_avg_ends_with_the_divide_panel(n: int) -> None:
    panels = _panels(rounds_svg(trace(n, op="avg")))
    assert [(g.get("data-phase"), g.get("data-round")) for g in panels][-1] == ("divide", "0")
    assert len(panels) == 2 + 2 * (n - 1)
    divide = panels[-1]
    assert [t.text for t in divide.iter(f"{NS}text") if t.get("class") == "title"] == [
        f"divide by N = {n} (avg)"
    ]
    marks = [t.text for t in divide.iter(f"{NS}text") if t.get("class") == "count"]
    assert marks == [f"\u00f7{n}"] * (n * n)
    assert not [p for p in divide.iter(f"{NS}path") if p.get("class") == "send"]
    frames = [float(next(p.iter(f"{NS}rect")).get("x", "nan")) for p in panels]
    assert frames[-1] == max(frames), "the divide panel is the rightmost"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.clause("op-trace")
def test_cli_trace_op(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "trace", "-n", "2", "--op", "prod")
    assert (status, out) == (0, PROD_N2 + "\n")
    status, out, _ = _run(capsys, "trace", "-n", "3", "-m", "6", "--op", "avg", "--format", "json")
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert (status, doc["op"], doc["rounds"][-1]["phase"]) == (0, "avg", "divide")
    status, out, _ = _run(capsys, "trace", "-n", "3", "--op", "min", "--format", "svg")
    assert status == 0
    assert "\u2193c".encode("ascii", "xmlcharrefreplace").decode() in out
    with pytest.raises(SystemExit):
        main(["trace", "-n", "2", "--op", "mean"])
    assert "invalid choice: 'mean'" in capsys.readouterr().err


def test_trace_refuses_an_unknown_op() -> None:
    with pytest.raises(ValueError, match="unknown reduction op 'mean'"):
        trace(2, op="mean")
