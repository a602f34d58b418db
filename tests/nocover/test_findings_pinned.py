"""Committed findings revealed again on the real libraries (spec ``findings.md``, clause ``findings-pinned``).

The oracle is ``docs/findings/findings.json``, made by ``make findings`` from the real library, not by
the code under test: each case runs the same ``reveal`` command in the library's environment (found as
``make findings`` finds it; ``RING_REF_FINDINGS_VENVS="mpich=/path ..."`` points elsewhere) and compares
the classification, ring, presets and every element's tree.  One fast case per library that ``make
verify`` has (MPICH from ``system-tools``, Debian's OpenMPI 4 and gloo in ``.venv``, MLX where ``.venv``
has the extra); every other committed algorithm at ``N = 3`` in ``make soak``.  A case skips only when
its library is absent, naming the pip command.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Final

import pytest

from tests.common.paths import DOCS, ROOT
from tools import findings, findings_pages

pytestmark = pytest.mark.clause("findings-pinned")

CATALOGUE: Final = json.loads((DOCS / "findings" / "findings.json").read_text())
FAST: Final = ("mpich", "openmpi4", "gloo", "mlx")  # installed by make verify (or in .venv's extras)


def _environment(key: str) -> findings.Environment:
    library = findings.LIBRARIES[key]
    pairs = dict(p.partition("=")[::2] for p in os.environ.get("RING_REF_FINDINGS_VENVS", "").split() if p)
    environment = findings.Environment(library, Path(pairs.get(key, ROOT / library.venv)))
    info = environment.probe()
    if isinstance(info, str):
        pytest.skip(f"{library.title} is absent: {library.pip} ({info})")
    return environment


def _first(key: str, algorithm: str, n: int) -> dict[str, Any]:
    cells = CATALOGUE["libraries"][key]["cells"]
    return next(c for c in cells if c["algorithm"] == algorithm and c["n"] == n and c["status"] == "revealed")


def _reveal_again(key: str, finding: dict[str, Any]) -> list[str]:
    environment = _environment(key)
    with tempfile.TemporaryDirectory() as scratch:
        run = findings.Run(environment, Path(scratch), cache_root=Path(scratch))
        result = run.reveal(finding["algorithm"], finding["settings"], finding["n"], finding["m"])
    assert result is not None and result["json"] is not None, result
    return findings_pages.differences(finding, result["json"])


def _cases(fast: bool) -> list[Any]:
    cases = []
    for key, library in sorted(CATALOGUE["libraries"].items()):
        for algorithm in library["algorithms"]:
            if (algorithm == findings.DEFAULT and key in FAST) != fast:
                continue
            wanted = [
                c for c in library["cells"] if c["algorithm"] == algorithm and c["status"] == "revealed"
            ]
            if any(c["n"] == 3 for c in wanted):  # N = 3: every algorithm has it first
                cases.append(pytest.param(key, algorithm, id=f"{key}-{algorithm.replace(' ', '_')}"))
    return cases


@pytest.mark.parametrize(("key", "algorithm"), _cases(fast=True))
def test_a_committed_finding_is_revealed_again(key: str, algorithm: str) -> None:
    assert _reveal_again(key, _first(key, algorithm, 3)) == []


@pytest.mark.soak
@pytest.mark.parametrize(("key", "algorithm"), _cases(fast=False))
def test_every_committed_algorithm_is_revealed_again(key: str, algorithm: str) -> None:
    assert _reveal_again(key, _first(key, algorithm, 3)) == []
