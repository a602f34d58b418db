"""The spec's documents themselves: their clause IDs, their citations, and their executable Python.

The spec is the set of documents ``spec/*.md`` (indexed by ``spec/README.md``).
Their ``python`` blocks are an independent, plain statement of the closed
forms; ``ring_ref`` is checked against them here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

from ring_ref import core, invariants, ring_all_reduce, schedule
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER
from tests.common.dotted import resolve
from tests.common.paths import ROOT, SPEC_DOCS

CLAUSE_HEADING = re.compile(r"^### `([a-z0-9]+(?:-[a-z0-9]+)*)` — ", re.MULTILINE)


def spec_clause_ids() -> list[str]:
    """Every clause ID of every document, in document order."""
    return [cid for path in SPEC_DOCS for cid in CLAUSE_HEADING.findall(path.read_text(encoding="utf-8"))]


def cited_clause_ids() -> dict[str, set[str]]:
    """Clause ID -> the test files citing it with ``pytest.mark.clause(...)``."""
    cited: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "clause"
                and ast.unparse(node.func.value).endswith("mark")
            ):
                for arg in node.args:
                    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                        raise AssertionError(f"{path.name}: clause IDs must be string literals")
                    cited.setdefault(arg.value, set()).add(path.name)
    return cited


def spec_namespace() -> dict[str, Any]:
    """Execute every document's ``python`` blocks, in order, in one namespace and return what they define."""
    blocks = [
        (path, block)
        for path in SPEC_DOCS
        for block in re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.DOTALL)
    ]
    assert blocks, "the spec has no executable blocks"
    namespace: dict[str, Any] = {}
    for path, block in blocks:
        exec(compile(block, str(path), "exec"), namespace)
    return namespace


SPEC_PY = spec_namespace()


def test_clause_ids_are_unique_and_present() -> None:
    ids = spec_clause_ids()
    assert len(ids) >= 20
    assert len(ids) == len(set(ids)), "duplicate clause IDs"


def test_every_document_opens_with_its_contents_and_anchors_every_clause() -> None:
    for path in SPEC_DOCS:
        text = path.read_text(encoding="utf-8")
        contents = text.split("\n## Contents\n", 1)
        assert len(contents) == 2 and "\n## " not in contents[0], f"{path.name}: no contents list first"
        toc = contents[1].split("\n## ", 1)[0]
        listed = re.findall(r"^  - \[`([a-z0-9-]+)` — .*\]\(#\1\)$", toc, re.MULTILINE)
        ids = CLAUSE_HEADING.findall(text)
        assert listed == ids, f"{path.name}: the contents list is not its clauses in order"
        for cid in ids:
            assert f'<a id="{cid}"></a>\n\n### `{cid}` — ' in text, f"{path.name}: clause {cid} has no anchor"


def test_links_between_documents_name_a_document_and_a_clause_or_section() -> None:
    names = {path.name: path.read_text(encoding="utf-8") for path in SPEC_DOCS}
    for name, text in names.items():
        for target, anchor in re.findall(r"\]\(([a-z_]+\.md)?#([a-z0-9-]+)\)", text):
            other = names.get(target or name)
            assert other is not None, f"{name} links to {target}, not a spec document"
            headings = {
                re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
                for h in re.findall(r"^## (.*)$", other, re.MULTILINE)
            }
            found = f'<a id="{anchor}"></a>' in other or anchor in headings
            assert found, f"{name}: {target}#{anchor} not found"


def test_every_clause_is_cited_by_a_test() -> None:
    uncited = sorted(set(spec_clause_ids()) - set(cited_clause_ids()))
    assert not uncited, f"spec clauses no test cites: {uncited}"


TRACE_LINE = re.compile(r"^Implemented by: (?P<impl>.+?)(?:\.| ·) Checked by: (?P<tests>.+?)\.?$")


def traceability() -> dict[str, tuple[list[str], list[str]]]:
    """Clause ID -> (implementing names, checking tests) from the clause's *Implemented by* line."""
    sections = [
        section
        for path in SPEC_DOCS
        for section in re.split(r"^(?=### `)", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    ]
    found: dict[str, tuple[list[str], list[str]]] = {}
    for section in sections:
        heading = CLAUSE_HEADING.match(section)
        if heading is None:
            continue
        body = section.split("\n## ")[0].splitlines()
        matches = [m for m in map(TRACE_LINE.match, body) if m is not None]
        assert len(matches) == 1, (
            f"clause {heading.group(1)} needs one 'Implemented by: ... Checked by: ...' line"
        )
        names = re.findall(r"`([^`]+)`", matches[0].group("impl"))
        tests = re.findall(r"`([^`]+)`", matches[0].group("tests"))
        found[heading.group(1)] = (names, tests)
    return found


def test_every_clause_names_its_implementation_and_its_tests() -> None:
    cited = _citing_tests()
    trace = traceability()
    assert set(trace) == set(spec_clause_ids())
    for cid, (names, tests) in trace.items():
        assert names and tests, cid
        for name in names:
            try:
                resolve(name)
            except (ImportError, AttributeError) as exc:
                raise AssertionError(f"clause {cid} names {name}, which does not exist: {exc}") from exc
        for test in tests:
            assert cid in cited.get(test, set()), f"clause {cid} names {test}, which does not cite it"


def _citing_tests() -> dict[str, set[str]]:
    """``path::test_name`` -> the clause IDs it cites (its own marks and its module's ``pytestmark``)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "tests").glob("**/test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module_ids = {
            arg.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
            for call in ast.walk(node.value)
            if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "clause"
            for arg in call.args
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
        }
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                ids = set(module_ids)
                for dec in node.decorator_list:
                    if isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "clause":
                        ids |= {
                            a.value
                            for a in dec.args
                            if isinstance(a, ast.Constant) and isinstance(a.value, str)
                        }
                out[f"{path.relative_to(ROOT)}::{node.name}"] = ids
    return out


def test_every_citation_names_a_clause() -> None:
    unknown = {cid: files for cid, files in cited_clause_ids().items() if cid not in spec_clause_ids()}
    assert not unknown, f"tests cite IDs the spec does not define: {unknown}"


@pytest.mark.clause("ring-topology", "rs-send-chunk", "ag-send-chunk")
@pytest.mark.parametrize("n", range(1, 18))
def test_schedule_matches_spec_code(n: int) -> None:
    for i in range(n):
        assert schedule.right(i, n) == SPEC_PY["right"](i, n)
        assert schedule.left(i, n) == SPEC_PY["left"](i, n)
        for r in range(n - 1):
            assert schedule.rs_send_chunk(i, r, n) == SPEC_PY["rs_send_chunk"](i, r, n)
            assert schedule.ag_send_chunk(i, r, n) == SPEC_PY["ag_send_chunk"](i, r, n)
            sender = SPEC_PY["left"](i, n)
            assert schedule.rs_recv_chunk(i, r, n) == SPEC_PY["rs_send_chunk"](sender, r, n)
            assert schedule.ag_recv_chunk(i, r, n) == SPEC_PY["ag_send_chunk"](sender, r, n)


@pytest.mark.clause("inv-rs-provenance", "inv-ag-provenance")
@pytest.mark.parametrize("n", range(1, 13))
def test_invariant_closed_forms_match_spec_code(n: int) -> None:
    for r in range(-1, n - 1):
        rs = tuple(tuple(SPEC_PY["rs_slot"](n, r, i, c) for c in range(n)) for i in range(n))
        assert invariants.expected_state(REDUCE_SCATTER, r, n) == rs
    for r in range(n - 1):
        ag = tuple(tuple(SPEC_PY["ag_slot"](n, r, i, c) for c in range(n)) for i in range(n))
        assert invariants.expected_state(ALL_GATHER, r, n) == ag


def _spec_fold(x: list[list[Fraction]], add: Callable[[Fraction, Fraction], Fraction]) -> list[Fraction]:
    n = len(x)
    return [SPEC_PY["ring_fold"](x, c, add) for c in range(n)]


@pytest.mark.clause("fold-order", "sum-not-mean")
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_ring_fold_in_spec_code_matches_the_package(n: int) -> None:
    # float16 values chosen so that the order of additions changes the result.
    gen = torch.Generator().manual_seed(n)
    x = (torch.randn(n, n, generator=gen) * torch.logspace(-3, 3, n)).to(torch.float16)

    def add16(a: Fraction, b: Fraction) -> Fraction:
        # numpy's float16 addition: an arithmetic independent of torch's.
        return Fraction(float(np.float16(float(a)) + np.float16(float(b))))

    rows = [[Fraction(float(v)) for v in row] for row in x.tolist()]
    expected = [float(v) for v in _spec_fold(rows, add16)]
    assert ring_all_reduce(x).tolist() == expected


@pytest.mark.clause("worked-example")
def test_worked_example_matches_spec_code() -> None:
    x = torch.tensor(SPEC_PY["WORKED_EXAMPLE_INPUT"])
    assert ring_all_reduce(x).tolist() == SPEC_PY["WORKED_EXAMPLE_RESULT"]
    buffers = [list(row) for row in SPEC_PY["WORKED_EXAMPLE_INPUT"]]
    after = core.reduce_scatter_round(core.initial_state(buffers), 0, lambda a, b: a + b)
    assert [list(row) for row in after] == SPEC_PY["WORKED_EXAMPLE_AFTER_REDUCE_SCATTER"]
