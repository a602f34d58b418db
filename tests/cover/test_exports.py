"""The lazy re-exports (``ring_ref._exports``): each lazy package's table names exactly what its
``TYPE_CHECKING`` imports name, from the same modules, and every name resolves to its origin."""

from __future__ import annotations

import ast
import importlib

import pytest

from ring_ref import _exports
from tests.common.paths import ROOT

LAZY = ("ring_ref", "ring_ref.difftest")


def _typed_and_tabled(package: str) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The ``TYPE_CHECKING`` imports and the table handed to ``lazy_exports``, both module -> names."""
    path = ROOT / package.replace(".", "/") / "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typed: dict[str, set[str]] = {}
    tabled: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module is not None
                typed.setdefault(imp.module, set()).update(alias.name for alias in imp.names)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            table = node.value.args[1]
            assert isinstance(table, ast.Dict)
            for key, value in zip(table.keys, table.values, strict=True):
                assert isinstance(key, ast.Constant) and isinstance(key.value, str)
                assert isinstance(value, ast.Tuple)
                tabled[key.value] = {str(item.value) for item in value.elts if isinstance(item, ast.Constant)}
    return typed, tabled


@pytest.mark.clause("cli-arguments-first")
@pytest.mark.parametrize("package", LAZY)
def test_the_table_is_the_type_checkers_imports_and_all(package: str) -> None:
    typed, tabled = _typed_and_tabled(package)
    assert typed == tabled
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(name for names in tabled.values() for name in names)
    for origin, names in tabled.items():
        for name in names:
            assert getattr(module, name) is getattr(importlib.import_module(origin), name), name


def test_a_name_not_exported_is_an_attribute_error() -> None:
    getattr_, dir_ = _exports.lazy_exports("ring_ref", {"ring_ref._version": ("__version__",)})
    with pytest.raises(AttributeError, match="module 'ring_ref' has no attribute 'nope'"):
        getattr_("nope")
    assert "__version__" in dir_()
    assert "nope" not in dir_()
