"""Where the repository's files are, for tests at any depth under ``tests/``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC_DIR = ROOT / "spec"
SPEC = SPEC_DIR / "ring_all_reduce.md"  # the normative ring; the other documents beside it
SPEC_DOCS = sorted(SPEC_DIR.glob("*.md"))  # every document of the spec (spec/README.md indexes them)
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
