"""Helpers shared by the tests: oracles, strategies, planted targets, paths (no test modules)."""
