"""``ring-ref trace --collective``: reduce-scatter and all-gather alone (clause ``collective-trace``).

The expected sends and provenance are the spec's closed forms for the ring
``(d, d)``, typed in here: reduce-scatter round ``r``, worker ``i`` sends chunk
``i - d - r d``; all-gather round ``r`` sends the chunk owned by ``i - r d``,
which is chunk ``i - r d``.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from ring_ref._cli import main
from ring_ref._trace import render_table, trace, trace_json
from ring_ref.schedule import RingSchedule
from tests.common.paths import ROOT

SCHEMA = json.loads((ROOT / "spec" / "trace.schema.json").read_text(encoding="utf-8"))


def _fold(c: int, n: int, d: int) -> list[int]:
    """Chunk ``c``'s whole fold on the ring ``(d, d)``: ``c + d, c + 2d, ..., c``."""
    return [(c + j * d) % n for j in range(1, n + 1)]


def _slots(round_doc: dict[str, Any]) -> list[list[list[int]]]:
    return [[slot["contributions"] for slot in w["slots"]] for w in round_doc["workers"]]


@pytest.mark.clause("collective-trace")
@pytest.mark.parametrize("n", range(1, 6))
@pytest.mark.parametrize("d", [1, -1])
def test_reduce_scatter_trace_sends_and_ends_with_shard_r_at_rank_r(n: int, d: int) -> None:
    ring = RingSchedule(d, d)
    doc = trace_json(
        trace(n, ring, "prod", collective="reduce-scatter"), 2 * n, ring, collective="reduce-scatter"
    )
    jsonschema.validate(doc, SCHEMA)
    assert doc["collective"] == "reduce-scatter"
    assert doc["op"] == "prod"
    assert [(r["phase"], r["round"]) for r in doc["rounds"]] == [("start", -1)] + [
        ("reduce-scatter", r) for r in range(n - 1)
    ]
    for rd in doc["rounds"][1:]:
        r = rd["round"]
        assert [(s["src"], s["dst"], s["chunk"], s["op"]) for s in rd["sends"]] == [
            (i, (i + d) % n, (i - d - r * d) % n, "multiply") for i in range(n)
        ]
    last = doc["rounds"][-1]
    for r in range(n):
        assert _slots(last)[r][r] == _fold(r, n, d)
        assert last["workers"][r]["finishedChunks"] == [r]
    assert doc["traffic"]["rounds"] == n - 1
    assert doc["traffic"]["elementsSentByWorker"] == [2 * (n - 1)] * n  # n - 1 chunks of 2 elements


@pytest.mark.clause("collective-trace")
@pytest.mark.parametrize("n", range(1, 6))
@pytest.mark.parametrize("d", [1, -1])
def test_all_gather_trace_copies_each_shard_to_every_worker(n: int, d: int) -> None:
    ring = RingSchedule(d, d + n)  # any offset congruent to d
    doc = trace_json(trace(n, ring, collective="all-gather"), n, ring, collective="all-gather")
    jsonschema.validate(doc, SCHEMA)
    assert doc["collective"] == "all-gather"
    assert "op" not in doc
    start = doc["rounds"][0]
    for i in range(n):
        assert _slots(start)[i][i] == _fold(i, n, d)
        assert start["workers"][i]["finishedChunks"] == [i]
    for rd in doc["rounds"][1:]:
        r = rd["round"]
        assert rd["phase"] == "all-gather"
        assert [(s["src"], s["chunk"], s["op"]) for s in rd["sends"]] == [
            (i, (i - r * d) % n, "copy") for i in range(n)
        ]
    assert _slots(doc["rounds"][-1]) == [[_fold(c, n, d) for c in range(n)] for _ in range(n)]
    assert doc["traffic"]["elementsTotal"] == n * (n - 1)


@pytest.mark.clause("collective-trace")
def test_all_reduce_trace_names_no_collective() -> None:
    doc = trace_json(trace(3), 3)
    assert "collective" not in doc
    assert len(doc["rounds"]) == 1 + 2 * 2


@pytest.mark.clause("collective-trace")
def test_cli_collective_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "-n", "3", "--collective", "all-gather"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("collective: all-gather alone (spec section 12)\nring: direction +1, offset 1")
    assert "start (all-gather alone): each worker holds its shard" in out
    assert "all-gather round 1" in out
    assert "reduce-scatter round" not in out
    assert main(["trace", "-n", "4", "-m", "8", "--collective", "reduce-scatter", "--schedule", "gloo"]) == 0
    assert "ring: direction -1, offset 3, layout gloo" in capsys.readouterr().out
    assert (
        main(["trace", "-n", "2", "--collective", "reduce-scatter", "--format", "json", "--op", "avg"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert [r["phase"] for r in doc["rounds"]] == ["start", "reduce-scatter", "divide"]
    assert main(["trace", "-n", "3", "--collective", "reduce-scatter", "--format", "svg"]) == 0
    assert capsys.readouterr().out.startswith("<svg")


@pytest.mark.clause("collective-trace", "rsc-bad-input")
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["-n", "4", "--schedule", "gloo"],
            "the layout 'gloo' cuts a worker's S = 4 elements into chunks of 2, 2, 0, 0",
        ),
        (["-n", "3", "--schedule=1,0,even"], r"offset equals its direction"),
        (["-n", "2", "-m", "3"], "M = 3 is not divisible by N = 2, so the 2 shards"),
        (["-n", "3", "--op", "max", "--collective", "all-gather"], "all-gather copies and takes no op"),
    ],
)
def test_cli_refuses_what_a_collective_cannot_trace(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    collective = [] if "--collective" in argv else ["--collective", "reduce-scatter"]
    assert main(["trace", *argv, *collective]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.clause("collective-trace")
def test_unknown_collective_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        trace(2, collective="broadcast")  # type: ignore[arg-type]
    table = render_table(trace(2, RingSchedule(1, 1), collective="reduce-scatter"))
    assert "1+0*" in table
