"""The round records, the table and the JSON trace (``ring-ref trace``).

Expected values are typed in from the spec: the send formulas, the provenance
closed forms and the traffic formula ``2(N-1) S/N`` are written out here, not
taken from ``ring_ref``.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ring_ref._cli import main
from ring_ref._trace import render_table, trace, trace_json
from tests.common.oracles import spec_slot
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "trace.schema.json").read_text(encoding="utf-8"))


def _rounds(n: int) -> list[tuple[str, int]]:
    return [("reduce-scatter", r) for r in range(n - 1)] + [("all-gather", r) for r in range(n - 1)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.clause("round-count", "rs-send-chunk", "ag-send-chunk", "ring-topology")
def test_json_lists_every_round_with_the_spec_sends(n: int) -> None:
    doc = trace_json(trace(n), n)
    jsonschema.validate(doc, SCHEMA)
    assert [(rd["phase"], rd["round"]) for rd in doc["rounds"]] == [("start", -1), *_rounds(n)]
    for rd in doc["rounds"][1:]:
        r, rs = rd["round"], rd["phase"] == "reduce-scatter"
        want = [
            {"src": i, "dst": (i + 1) % n, "chunk": (i - r) % n if rs else (i + 1 - r) % n} for i in range(n)
        ]
        assert [{k: s[k] for k in ("src", "dst", "chunk")} for s in rd["sends"]] == want
        assert {s["op"] for s in rd["sends"]} == {"add" if rs else "copy"}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 7])
@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance", "inv-finished-chunks")
def test_json_slots_hold_the_spec_provenance_and_finished_chunks(n: int) -> None:
    doc = trace_json(trace(n), n)
    for rd in doc["rounds"]:
        phase, r = ("reduce-scatter", -1) if rd["phase"] == "start" else (rd["phase"], rd["round"])
        for i, worker in enumerate(rd["workers"]):
            got = [slot["contributions"] for slot in worker["slots"]]
            assert got == [spec_slot(phase, r, i, c, n) for c in range(n)], (phase, r, i)
            complete = [c for c, p in enumerate(got) if sorted(p) == list(range(n))]
            assert worker["finishedChunks"] == complete


def _traffic_case(n: int, k: int) -> None:
    m = n * k
    doc = trace_json(trace(n), m)
    rounds = [rd for rd in doc["rounds"] if rd["phase"] != "start"]
    assert len(rounds) == 2 * (n - 1)
    for rd in rounds:
        per_worker = [sum(s["elements"] for s in rd["sends"] if s["src"] == i) for i in range(n)]
        assert per_worker == [m // n] * n
    total = 2 * (n - 1) * m // n
    traffic = doc["traffic"]
    assert traffic["rounds"] == 2 * (n - 1)
    assert traffic["elementsPerWorkerPerRound"] == m // n
    assert traffic["elementsSentByWorker"] == [total] * n
    assert traffic["elementsPerWorkerTotal"] == total
    assert traffic["elementsTotal"] == n * total


@pytest.mark.parametrize(("n", "k"), [(1, 3), (2, 1), (4, 2), (5, 3), (16, 1)])
@pytest.mark.clause("traffic", "round-count")
def test_json_counts_the_traffic(n: int, k: int) -> None:
    _traffic_case(n, k)


@settings(max_examples=25)
@given(st.integers(1, 9), st.integers(1, 5))
@pytest.mark.clause("traffic")
def test_traffic_for_any_ring(n: int, k: int) -> None:
    _traffic_case(n, k)


@pytest.mark.clause("worked-example")
def test_table_shows_sends_ops_and_finished_chunks() -> None:
    table = render_table(trace(2))
    assert "reduce-scatter round 0 (receiver adds into the slot): 0->1 chunk 0, 1->0 chunk 1" in table
    assert "all-gather round 0 (receiver copies into the slot): 0->1 chunk 1, 1->0 chunk 0" in table
    last = table.split("all-gather round 0")[1]
    assert last.count("*") == 4 + 1  # four finished slots and the legend


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_trace_formats(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = _run(capsys, "trace", "-n", "3", "-m", "6", "--format", "json")
    assert status == 0
    doc: dict[str, Any] = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["traffic"]["elementsPerWorkerTotal"] == 8
    status, out, _ = _run(capsys, "trace", "-n", "3")
    assert status == 0
    assert "all-gather round 1" in out
    status, out, _ = _run(capsys, "trace", "-n", "3", "--format", "svg")
    assert status == 0
    assert out.startswith("<svg")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-n", "3", "-m", "4"], "M = 4"),
        (["-n", "0"], "-n 0: a trace needs at least one worker and one row; give -n 1 or more."),
        (["-n", "2", "-m", "-1"], "-m -1: a trace needs at least one worker and one row; give -m 1 or more."),
    ],
)
def test_cli_trace_rejects_bad_sizes(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, out, err = _run(capsys, "trace", *argv)
    assert status == 2
    assert out == ""
    assert message in err
    assert "shape" not in err, "the trace's sizes are its options, not a tensor's shape"


def test_schema_rejects_unknown_fields() -> None:
    doc = trace_json(trace(2), 2)
    doc["rounds"][0]["extra"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)


@pytest.mark.parametrize("n", [4, 11])
def test_table_columns_line_up_under_their_headers(n: int) -> None:
    lines = render_table(trace(n)).splitlines()
    headers = [k for k, line in enumerate(lines) if line.lstrip().startswith("chunk 0")]
    assert len(headers) == 1 + 2 * (n - 1)
    for k in headers:
        starts = [lines[k].index(f"chunk {c}") for c in range(n)]
        for row in lines[k + 1 : k + 1 + n]:
            assert row.startswith("  worker ")
            assert all(row[s - 1] == " " != row[s] for s in starts), (lines[k], row)
