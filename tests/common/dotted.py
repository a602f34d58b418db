"""Dotted names of code (``module``, ``module.function``, ``module.Class.method``) resolved to objects,
for the tests that check what the spec's traceability lines and the mutation equivalents name."""

from __future__ import annotations

import importlib

__all__ = ["resolve"]


def resolve(dotted: str) -> object:
    """Import the longest module prefix of ``dotted`` and walk the rest as attributes.

    Raises ``ModuleNotFoundError`` when no prefix is a module, ``AttributeError``
    when an attribute is missing.

    >>> resolve("tests.common.dotted.resolve") is resolve
    True
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(dotted)
