"""Where the repository's files are, for tests at any depth under ``tests/``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC_DIR = ROOT / "spec"
SPEC = SPEC_DIR / "ring_all_reduce.md"
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
