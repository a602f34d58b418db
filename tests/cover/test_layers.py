"""The package's layering: every import inside ``ring_ref/`` runs down the layers, and none runs in a circle.

The layers are the architecture's (``docs/architecture.md``), written here by hand, not
read off the current imports: the schedule, then the invariants, the core, the
shared facts, the adapters and engines, ``_dispatch``, the order model
(``_order``: summation trees, below every tool that reads an order); every
other module is a tool.  Each module may import only its own layer and those below; no import
cycles (function-level imports count: a lazy import is still a dependency);
no ``from ring_ref import X`` of anything but a submodule (the package root
only re-exports); and only difftest itself and its users (``testing``,
``_cli``, ``targets``, ``_invariance``) import difftest.  A table entry names a module or a
package and everything in it, so a new package of tools needs no entry.

The checker is run on the real tree, and on copies of it with one import
planted, each of which it must refuse.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from typing import Final, NamedTuple

import pytest

from tests.common.paths import ROOT

PACKAGE: Final = "ring_ref"

LAYERS: Final[tuple[tuple[str, ...], ...]] = (
    ("ring_ref.schedule",),
    ("ring_ref.invariants",),
    ("ring_ref.core",),
    (
        "ring_ref._dtypes",
        "ring_ref._validate",
        "ring_ref._chunks",
        "ring_ref._ops",
        "ring_ref._cost",
        "ring_ref._version",
    ),
    (
        "ring_ref._torch_adapter",
        "ring_ref._numpy_adapter",
        "ring_ref._jax_adapter",
        "ring_ref._fast",
    ),
    ("ring_ref._dispatch",),
    ("ring_ref._order",),
)
"""Bottom first; a module of the package in no entry is a tool, the layer above the order model."""

TOOLS: Final = len(LAYERS)

DIFFTEST: Final = "ring_ref.difftest"
DIFFTEST_USERS: Final = (
    DIFFTEST,
    "ring_ref.testing",
    "ring_ref._cli",
    "ring_ref.targets",
    "ring_ref._invariance",
)
"""The only modules that may import difftest."""


class Import(NamedTuple):
    """One import of a module of the package: who, of what, on which line."""

    source: str
    target: str
    line: int
    root_name: str | None
    """The name a ``from ring_ref import NAME`` takes from the package root (not a submodule)."""


def _in(module: str, entry: str) -> bool:
    return module == entry or module.startswith(entry + ".")


def layer(module: str) -> int:
    """The layer of ``module``: its table entry's index, else :data:`TOOLS`."""
    return next((k for k, entries in enumerate(LAYERS) if any(_in(module, e) for e in entries)), TOOLS)


def read_package() -> tuple[dict[str, str], set[str]]:
    """Every module of ``ring_ref/`` by dotted name (a package by its ``__init__``), and the packages."""
    sources: dict[str, str] = {}
    packages: set[str] = set()
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
            packages.add(".".join(parts))
        sources[".".join(parts)] = path.read_text(encoding="utf-8")
    return sources, packages


def imports(sources: Mapping[str, str], packages: set[str]) -> Iterator[Import]:
    """Every import of a module of the package, at module level or inside a function."""
    for source, text in sources.items():
        here = source if source in packages else source.rpartition(".")[0]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield from _resolve(source, alias.name, None, node.lineno, sources)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{anchor}.{base}" if base else anchor
                for alias in node.names:
                    yield from _resolve(source, base, alias.name, node.lineno, sources)


def _resolve(
    source: str, module: str, name: str | None, line: int, sources: Mapping[str, str]
) -> Iterator[Import]:
    if not _in(module, PACKAGE):
        return
    if name is not None and f"{module}.{name}" in sources:
        yield Import(source, f"{module}.{name}", line, None)
        return
    while module not in sources:
        module = module.rpartition(".")[0]
    yield Import(source, module, line, name if module == PACKAGE else None)


def cycles(edges: Iterable[Import]) -> list[list[str]]:
    """The import cycles: each strongly connected set of two or more modules, sorted (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def violations(sources: Mapping[str, str], packages: set[str]) -> list[str]:
    """Every breach of the layering, one line each (empty when the package keeps it)."""
    edges = list(dict.fromkeys(imports(sources, packages)))
    found = [f"import cycle among {', '.join(c)}" for c in cycles(edges)]
    for edge in edges:
        where = f"{edge.source} line {edge.line}"
        if edge.target == PACKAGE:
            what = f"`from ring_ref import {edge.root_name}`" if edge.root_name else "`import ring_ref`"
            found.append(f"{where}: {what} takes a name from the package root; import its defining module")
        elif layer(edge.source) < layer(edge.target):
            found.append(
                f"{where}: {edge.source} (layer {layer(edge.source)}) imports {edge.target} "
                f"(layer {layer(edge.target)}), a higher layer"
            )
        if _in(edge.target, DIFFTEST) and not any(_in(edge.source, user) for user in DIFFTEST_USERS):
            found.append(f"{where}: {edge.source} imports {edge.target}; only {DIFFTEST_USERS} may")
    return found


def test_the_package_keeps_its_layers() -> None:
    sources, packages = read_package()
    assert violations(sources, packages) == []


def test_the_table_names_modules_that_exist() -> None:
    """A misspelt entry would silently make a low-level module a tool."""
    sources, _ = read_package()
    for entries in LAYERS:
        for entry in entries:
            assert any(_in(module, entry) for module in sources), entry


def _planted(module: str, line: str, *, new: bool = False) -> list[str]:
    sources, packages = read_package()
    assert new != (module in sources)
    sources[module] = sources.get(module, "") + f"\n\ndef _planted() -> None:\n    {line}\n"
    return violations(sources, packages)


def test_an_upward_import_is_refused_even_inside_a_function() -> None:
    found = _planted("ring_ref.schedule", "from ring_ref._dispatch import ring_all_reduce")
    assert any(
        "ring_ref.schedule (layer 0) imports ring_ref._dispatch (layer 5), a higher layer" in v for v in found
    ), found
    found = _planted("ring_ref._fast", "import ring_ref._reveal._revealed")
    assert any("ring_ref._fast (layer 4) imports ring_ref._reveal._revealed (layer 7)" in v for v in found)


@pytest.mark.parametrize(
    ("line", "tool"),
    [
        ("from ring_ref._reveal import reveal", "ring_ref._reveal"),
        ("from ring_ref._svg import reveal_svg", "ring_ref._svg"),
        ("from ring_ref.difftest._orders import schedule_order", "ring_ref.difftest._orders"),
    ],
)
def test_the_order_model_imports_no_tool(line: str, tool: str) -> None:
    """The trees sit below the tools that read them: an import from ``_order`` up into one is refused."""
    found = _planted("ring_ref._order._fit", line)
    assert any(
        f"ring_ref._order._fit (layer 6) imports {tool} (layer 7), a higher layer" in v for v in found
    ), found
    assert _planted("ring_ref._order._trees", "from ring_ref._dispatch import ring_all_reduce") == []


def test_a_cycle_among_tools_is_refused() -> None:
    found = _planted("ring_ref._trace", "from ring_ref import _svg")
    assert "import cycle among ring_ref._svg, ring_ref._trace" in found, found


def test_a_name_from_the_package_root_is_refused() -> None:
    found = _planted("ring_ref._svg", "from ring_ref import ring_all_reduce")
    assert any(
        "`from ring_ref import ring_all_reduce` takes a name from the package root" in v for v in found
    )
    assert any("`import ring_ref`" in v for v in _planted("ring_ref._svg", "import ring_ref"))


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("ring_ref._reveal._check", "from ring_ref.difftest import difftest"),
        ("ring_ref._reveal._check", "from ..difftest import _orders"),
        ("ring_ref.distributed", "import ring_ref.difftest._call"),
    ],
)
def test_difftest_is_imported_by_its_users_only(module: str, line: str) -> None:
    assert any(f"{module} imports ring_ref.difftest" in v for v in _planted(module, line))


def test_new_packages_of_tools_fit_by_prefix() -> None:
    """A module of a new tools package may import anything below the tools; not difftest."""
    assert (
        _planted("ring_ref._processes._planted", "from ring_ref._dispatch import ring_all_reduce", new=True)
        == []
    )
    found = _planted("ring_ref._vectors._planted", "from ring_ref.difftest import _orders", new=True)
    assert found == [
        "ring_ref._vectors._planted line 4: ring_ref._vectors._planted imports ring_ref.difftest._orders; "
        f"only {DIFFTEST_USERS} may"
    ]
