"""The package version, written here only: pyproject.toml reads it and a test checks CITATION.cff."""

__version__ = "0.2.0"
