"""A package's names, imported when first used (PEP 562): how ``ring_ref`` and ``ring_ref.difftest``
re-export without importing torch, so that ``ring-ref --help`` and a usage error answer at once
(clause ``cli-arguments-first``).

A package's ``__init__.py`` stays a list of re-exports: the same names, written once under
``TYPE_CHECKING`` for type checkers and once in the table handed to :func:`lazy_exports`
(``tests/cover/test_exports.py`` checks that the two agree).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, origins: Mapping[str, tuple[str, ...]]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: each name of ``origins`` (module ->
    names) imported from its module when first asked for, then kept in the package; ``dir()`` lists
    them before they are (for completion in a shell).

    >>> from ring_ref import _version
    >>> getattr_, dir_ = lazy_exports("ring_ref", {"ring_ref._version": ("__version__",)})
    >>> getattr_("__version__") == _version.__version__, "__version__" in dir_()
    (True, True)
    """
    where = {name: module for module, names in origins.items() for name in names}

    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
