"""The package's layering: every import inside ``ring_ref/`` runs down the layers, and none runs in a circle.

The layers are the architecture's (``docs/architecture.md``), written here by hand, not
read off the current imports: the schedule, then the invariants, the core, the
shared facts, the adapters and engines, ``_dispatch``; then the top floor: the
per-rank runtimes (``_ranks`` and its public faces ``distributed`` and ``mpi``,
``_processes``) beside the order model (``_order``: summation trees, below every
tool that reads an order); the instruments (reveal, traces and their check, the
contracts, the vectors, the ready-made targets); the tools built on them
(difftest, ``testing``, invariance, the pictures); the command line on top.  A
module in no entry (the package root, a new module) is a tool.  Each module may
import only its own layer and those below; no import
cycles (function-level imports count: a lazy import is still a dependency);
no ``from ring_ref import X`` of anything but a submodule (the package root
only re-exports); and only difftest itself and its users (``testing``,
``_cli``, ``_commands``, ``_order_stability``) import difftest.  The command line's parse
module (``_cli``) imports neither torch nor numpy, through none of the modules it imports at load
time, so that ``--help`` and a usage error answer at once (clause ``cli-arguments-first``).  A table
entry names a module or a package and everything in it, so a new module of a listed package needs no
entry.

The checker is run on the real tree, and on copies of it with one import
planted, each of which it must refuse.  Beside the imports, the same scan keeps a collective's name
(``"all-reduce"``, ...) out of every module but the vocabulary, the command line's parsing and the
report (:data:`NAMERS`): the others take a ``Collective`` and ask it.
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
        "ring_ref._names",
        "ring_ref._exports",
        "ring_ref._hints",
    ),
    (
        "ring_ref._torch_adapter",
        "ring_ref._numpy_adapter",
        "ring_ref._jax_adapter",
        "ring_ref._fast",
    ),
    ("ring_ref._dispatch",),
    (
        "ring_ref._ranks",
        "ring_ref.distributed",
        "ring_ref.mpi",
        "ring_ref._processes",
        "ring_ref._order",
    ),
    (
        "ring_ref._reveal",
        "ring_ref._trace",
        "ring_ref._tracecheck",
        "ring_ref._contracts",
        "ring_ref._vectors",
        "ring_ref.targets",
    ),
    (
        "ring_ref.difftest",
        "ring_ref.testing",
        "ring_ref._order_stability",
        "ring_ref.invariance",
        "ring_ref._svg",
    ),
    ("ring_ref._cli", "ring_ref._commands", "ring_ref.__main__"),
)
"""Bottom first: the ring and its engines up to ``_dispatch``; then the top floor: the per-rank runtimes
and the order model; the instruments (each asks one question of a ring, a target or a trace); the
tools built on them; the command line.  A module of the package in no entry (the package root, a new
module) is a tool."""

RUNTIMES: Final = 6
INSTRUMENTS: Final = 7
TOOLS: Final = 8
CLI: Final = 9

DIFFTEST: Final = "ring_ref.difftest"
DIFFTEST_USERS: Final = (
    DIFFTEST,
    "ring_ref.testing",
    "ring_ref._cli",
    "ring_ref._commands",
    "ring_ref._order_stability",
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


HEAVY: Final = ("torch", "numpy")
"""What the command line's parse module must not import at load time."""


def _eager(body: Iterable[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports run when a module loads: not those in a function, nor under ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.ClassDef):
            yield from _eager(node.body)
        elif isinstance(node, ast.If) and not (
            isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        ):
            yield from _eager([*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            yield from _eager([*node.body, *node.orelse, *node.finalbody])


def loaded_with(start: str, sources: Mapping[str, str], packages: set[str]) -> set[str]:
    """Every module that importing ``start`` loads, the package's by dotted name (each with the packages
    above it) and others by their top-level name, following the imports run at load time."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        parents = [".".join(module.split(".")[:k]) for k in range(1, module.count(".") + 1)]
        for name in [*parents, module]:
            if name in seen:
                continue
            seen.add(name)
            if name not in sources:
                continue
            here = name if name in packages else name.rpartition(".")[0]
            for node in _eager(ast.parse(sources[name]).body):
                if isinstance(node, ast.Import):
                    todo += [alias.name for alias in node.names]
                    continue
                base = node.module or ""
                if node.level:
                    anchor = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{anchor}.{base}" if base else anchor
                todo += [f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names]
    return {m if _in(m, PACKAGE) else m.split(".")[0] for m in seen}


def test_the_command_lines_parse_module_loads_no_torch() -> None:
    """``ring_ref._cli`` and what it imports at load time import neither torch nor numpy: the command's
    heavy part (:mod:`ring_ref._commands`) is imported once the arguments are checked."""
    sources, packages = read_package()
    loaded = loaded_with("ring_ref._cli", sources, packages)
    assert "ring_ref._cli" in loaded and "ring_ref.difftest._rules" in loaded, sorted(loaded)
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    planted = dict(sources)
    planted["ring_ref.difftest._rules"] += "\nfrom ring_ref._ops import op_name\n"
    assert "torch" in loaded_with("ring_ref._cli", planted, packages)
    assert "torch" in loaded_with("ring_ref._commands", sources, packages)


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
        f"ring_ref._order._fit (layer {RUNTIMES}) imports {tool} (layer {layer(tool)}), a higher layer" in v
        for v in found
    ), found
    assert _planted("ring_ref._order._trees", "from ring_ref._dispatch import ring_all_reduce") == []


@pytest.mark.parametrize(
    ("module", "line", "target"),
    [
        ("ring_ref._ranks._torch", "from ring_ref._reveal import reveal", "ring_ref._reveal"),
        ("ring_ref._processes._shared", "import ring_ref._trace", "ring_ref._trace"),
        ("ring_ref.distributed", "from ring_ref._svg import reveal_svg", "ring_ref._svg"),
        ("ring_ref._reveal._check", "from ring_ref._svg import reveal_svg", "ring_ref._svg"),
        ("ring_ref.targets", "from ring_ref._order_stability import invariance", "ring_ref._order_stability"),
        ("ring_ref._vectors._format", "import ring_ref.testing", "ring_ref.testing"),
        ("ring_ref.difftest._search", "from ring_ref._cli import main", "ring_ref._cli"),
        ("ring_ref._svg", "import ring_ref.__main__", "ring_ref.__main__"),
    ],
)
def test_each_floor_of_the_top_refuses_an_import_from_above(module: str, line: str, target: str) -> None:
    """Runtimes and the order model import no instrument; instruments no tool built on them; tools not
    the command line."""
    assert layer(module) < layer(target)
    found = _planted(module, line)
    assert any(
        f"{module} (layer {layer(module)}) imports {target} (layer {layer(target)}), a higher layer" in v
        for v in found
    ), found


def test_the_top_floor_is_drawn_in_order() -> None:
    """Runtimes and the order model, then the instruments, the tools built on them and the command line."""
    assert [layer(m) for m in ("ring_ref._ranks", "ring_ref._processes", "ring_ref._order")] == [RUNTIMES] * 3
    assert [layer(m) for m in ("ring_ref._reveal", "ring_ref.targets", "ring_ref._vectors")] == [
        INSTRUMENTS
    ] * 3
    assert [layer(m) for m in ("ring_ref.difftest", "ring_ref.invariance", "ring_ref._svg")] == [TOOLS] * 3
    assert layer("ring_ref._cli") == layer("ring_ref.__main__") == CLI == len(LAYERS) - 1
    assert layer("ring_ref") == layer("ring_ref._new_module") == TOOLS


def test_a_cycle_among_tools_is_refused() -> None:
    """On one floor an import may go either way, not both (``_vectors._format`` imports ``_tracecheck``)."""
    found = _planted("ring_ref._tracecheck", "from ring_ref._vectors import _format")
    assert found == ["import cycle among ring_ref._tracecheck, ring_ref._vectors._format"], found


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


def test_new_modules_fit_by_prefix_and_unlisted_ones_are_tools() -> None:
    """A new module of a listed package takes its package's floor; a new module elsewhere is a tool, which
    may import anything below the command line, but not difftest."""
    assert (
        _planted("ring_ref._processes._planted", "from ring_ref._dispatch import ring_all_reduce", new=True)
        == []
    )
    found = _planted("ring_ref._processes._planted", "from ring_ref._vectors import write", new=True)
    assert found == [
        f"ring_ref._processes._planted line 4: ring_ref._processes._planted (layer {RUNTIMES}) imports "
        f"ring_ref._vectors (layer {INSTRUMENTS}), a higher layer"
    ]
    assert _planted("ring_ref._planted", "from ring_ref._svg import reveal_svg", new=True) == []
    found = _planted("ring_ref._planted", "from ring_ref.difftest import _orders", new=True)
    assert found == [
        "ring_ref._planted line 4: ring_ref._planted imports ring_ref.difftest._orders; "
        f"only {DIFFTEST_USERS} may"
    ]


COLLECTIVE_NAMES: Final = frozenset({"all-reduce", "reduce-scatter", "all-gather"})
NAMERS: Final = ("ring_ref.schedule", "ring_ref._cli", "ring_ref.difftest._report")
"""The only modules that may write a collective's name as a string: the vocabulary (where
``Collective`` reads a name into the value), the command line's parsing, and the report's JSON."""


def _docstrings(tree: ast.AST) -> set[int]:
    """The ``id`` of every docstring's constant node in ``tree`` (a module's, a class's, a function's)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def collective_names(sources: Mapping[str, str]) -> dict[str, int]:
    """Per module, how many string constants (docstrings aside) are a collective's name."""
    counts: dict[str, int] = {}
    for module, text in sources.items():
        tree = ast.parse(text)
        docs = _docstrings(tree)
        found = sum(
            isinstance(node, ast.Constant) and node.value in COLLECTIVE_NAMES and id(node) not in docs
            for node in ast.walk(tree)
        )
        if found:
            counts[module] = found
    return counts


def test_collective_names_are_compared_in_the_vocabulary_only() -> None:
    """Every other module takes a ``Collective`` and asks it (its phases, shapes, kind): a name written
    as a string outside the three modules that read or write names is refused, a docstring's aside."""
    sources, _ = read_package()
    assert len(NAMERS) <= 3 and all(m in sources for m in NAMERS)
    assert set(collective_names(sources)) <= set(NAMERS), collective_names(sources)
    assert "ring_ref.schedule" in collective_names(sources)
    planted = dict(sources)
    planted["ring_ref.difftest._oracles"] += '\n\ndef _planted(c: str) -> bool:\n    """all-gather."""\n'
    assert set(collective_names(planted)) <= set(NAMERS)  # a docstring names it freely
    planted["ring_ref.difftest._oracles"] += '    return c == "all-gather"\n'
    assert collective_names(planted).get("ring_ref.difftest._oracles") == 1
    assert not set(collective_names(planted)) <= set(NAMERS)
