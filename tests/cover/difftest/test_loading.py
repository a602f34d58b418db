"""Loading a ``TARGET`` by name (``ring_ref.difftest._loading``).

``package.module:function`` is looked up on ``sys.path`` and the current
directory, ``path/to/file.py:function`` is imported from the file; every way
that fails is a :class:`TargetError` saying why (``ring-ref difftest`` exits 2
with it), and :func:`importable_name` gives a name only for a function that
loading it by that name would give back.
"""

from __future__ import annotations

import functools
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from ring_ref import ring_all_reduce
from ring_ref.difftest import TargetError, load_target
from ring_ref.difftest._loading import importable_name
from ring_ref.difftest._vocabulary import Target

pytestmark = pytest.mark.clause("difftest-isolation")

USAGE = "must be package.module:function or path/to/file.py:function"


def _write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


@pytest.fixture
def fresh_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``sys.modules`` and ``sys.path`` as they were, after the test (it imports modules of its own)."""
    before = dict(sys.modules)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield
    for name in set(sys.modules) - set(before):
        del sys.modules[name]


@pytest.mark.parametrize("spec", ["ring_ref", ":ring_all_reduce", "ring_ref:", ":", ""])
def test_a_target_without_a_module_and_a_function_is_refused_with_the_forms(spec: str) -> None:
    with pytest.raises(TargetError) as caught:
        load_target(spec)
    assert str(caught.value) == f"TARGET {spec!r} {USAGE}"


def test_the_function_is_named_after_the_last_colon(tmp_path: Path, fresh_modules: None) -> None:
    target = _write(tmp_path / "a:b" / "t.py", "def f(x):\n    return 'from a file in a:b'\n")
    fn = load_target(f"{target}:f")
    assert fn(None) == "from a file in a:b"  # type: ignore[arg-type]


def test_a_file_target_is_imported_from_the_file(tmp_path: Path, fresh_modules: None) -> None:
    # A dataclass with string annotations looks its module up in sys.modules while it is built.
    source = """\
        from __future__ import annotations
        import dataclasses

        @dataclasses.dataclass
        class Scale:
            k: float

        def f(x):
            return Scale(3.0).k * x
    """
    fn = load_target(f"{_write(tmp_path / 'scaled.py', source)}:f")
    assert fn(2.0) == 6.0  # type: ignore[arg-type]
    # Its module is not importable by name, so the tester does not try to import it again.
    assert importable_name(fn) is None


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.py"
    with pytest.raises(TargetError) as caught:
        load_target(f"{missing}:f")
    assert str(caught.value) == f"TARGET file {str(missing)!r} does not exist"
    (tmp_path / "d.py").mkdir()
    with pytest.raises(TargetError, match="does not exist"):
        load_target(f"{tmp_path / 'd.py'}:f")  # a directory named like a file


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("1 / 0", "ZeroDivisionError: division by zero"),
        ("import sys\nsys.exit(4)", "SystemExit: 4"),
        ("import no_such_module_ring_ref", "ModuleNotFoundError: No module named 'no_such_module_ring_ref'"),
    ],
    ids=["raises", "exits", "imports-nothing"],
)
def test_a_file_that_fails_to_import_says_how(
    body: str, words: str, tmp_path: Path, fresh_modules: None
) -> None:
    target = _write(tmp_path / "broken.py", body + "\n")
    with pytest.raises(TargetError) as caught:
        load_target(f"{target}:f")
    assert str(caught.value) == f"importing {str(target)!r} failed: {words}"
    assert caught.value.__cause__ is not None  # the import's own error, with its traceback


def test_a_module_that_fails_to_import_says_how(tmp_path: Path, fresh_modules: None) -> None:
    _write(tmp_path / "broken_ring_ref_mod.py", "raise RuntimeError('no')\n")
    sys.path.insert(0, str(tmp_path))
    with pytest.raises(TargetError) as caught:
        load_target("broken_ring_ref_mod:f")
    assert str(caught.value) == "importing 'broken_ring_ref_mod' failed: RuntimeError: no"
    with pytest.raises(TargetError) as missing:
        load_target("no_such_module_ring_ref:f")
    not_found = "ModuleNotFoundError: No module named 'no_such_module_ring_ref'"
    assert str(missing.value) == f"importing 'no_such_module_ring_ref' failed: {not_found}"


def test_an_interrupt_while_importing_is_not_swallowed(tmp_path: Path, fresh_modules: None) -> None:
    target = _write(tmp_path / "interrupts.py", "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_target(f"{target}:f")


def test_a_missing_or_uncallable_attribute_is_named(tmp_path: Path, fresh_modules: None) -> None:
    target = _write(tmp_path / "things.py", "answer = 42\n")
    with pytest.raises(TargetError) as missing:
        load_target(f"{target}:g")
    assert str(missing.value) == f"{str(target)!r} has no attribute 'g'"
    with pytest.raises(TargetError) as number:
        load_target(f"{target}:answer")
    assert str(number.value) == f"'{target}:answer' is not a function but an object of type int"
    with pytest.raises(TargetError) as in_module:
        load_target("ring_ref:__all__")
    assert str(in_module.value) == "'ring_ref:__all__' is not a function but an object of type list"


def _without_cwd(path: list[str], cwd: Path) -> list[str]:
    return [p for p in path if p not in ("", str(cwd))]


def test_a_module_in_the_current_directory_is_found_first(
    tmp_path: Path, fresh_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    _write(here / "shadowed_ring_ref_mod.py", "def f(x):\n    return 'here'\n")
    _write(elsewhere / "shadowed_ring_ref_mod.py", "def f(x):\n    return 'elsewhere'\n")
    monkeypatch.chdir(here)
    sys.path[:] = [str(elsewhere), *_without_cwd(sys.path, here)]
    fn = load_target("shadowed_ring_ref_mod:f")
    assert fn(None) == "here"  # type: ignore[arg-type]  # as `python -m` would
    assert sys.path[0] == str(here)


@pytest.mark.parametrize("entry", ["", "cwd"])
def test_the_path_is_left_alone_when_it_has_the_current_directory(
    entry: str, tmp_path: Path, fresh_modules: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path / "plain_ring_ref_mod.py", "def f(x):\n    return 'plain'\n")
    monkeypatch.chdir(tmp_path)
    sys.path[:] = [str(tmp_path) if entry == "cwd" else entry, *_without_cwd(sys.path, tmp_path)]
    before = list(sys.path)
    assert load_target("plain_ring_ref_mod:f")(None) == "plain"  # type: ignore[arg-type]
    assert sys.path == before


def _decorated(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def inner(*args: Any) -> Any:
        return fn(*args)

    inner.__qualname__ = "_inner_of_decorator"
    return inner


def module_level(x: Any) -> Any:
    """A module-level function: importable by name."""
    return x


def test_only_a_name_that_loads_the_same_function_is_given() -> None:
    assert importable_name(module_level) == f"{__name__}:module_level"
    assert load_target(f"{__name__}:module_level") is module_level
    assert importable_name(ring_all_reduce) == "ring_ref:ring_all_reduce"

    def local(x: Any) -> Any:
        return x

    assert importable_name(local) is None  # a qualified name with dots: not an attribute of its module
    assert importable_name(_decorated(module_level)) is None  # the module has no such attribute
    rebound = _decorated(module_level)
    rebound.__qualname__ = "module_level"
    assert importable_name(rebound) is None  # the name means another function now
    assert importable_name(print) == "builtins:print"


def test_a_function_of_the_testers_main_module_has_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    def in_main(x: Any) -> Any:
        return x

    in_main.__module__, in_main.__qualname__ = "__main__", "in_main"
    monkeypatch.setattr(sys.modules["__main__"], "in_main", in_main, raising=False)
    assert importable_name(in_main) is None  # a worker's __main__ is not the tester's script


def test_callables_without_a_module_or_a_qualified_name_have_no_name() -> None:
    assert importable_name(functools.partial(ring_all_reduce)) is None  # no __qualname__
    assert importable_name(torch.nn.Identity()) is None  # an instance: no __qualname__
    assert not hasattr(torch.Tensor.add, "__module__")
    assert importable_name(cast(Target, torch.Tensor.add)) is None  # a C method descriptor: no __module__


def test_an_object_without_a_module_or_a_name_has_no_name() -> None:
    no_module = SimpleNamespace(__module__=None, __qualname__="module_level")
    no_name = SimpleNamespace(__module__=__name__, __qualname__=None)
    assert importable_name(cast(Target, no_module)) is None
    assert importable_name(cast(Target, no_name)) is None


def test_a_module_not_imported_yet_is_trusted(tmp_path: Path, fresh_modules: None) -> None:
    _write(tmp_path / "later_ring_ref_mod.py", "def f(x):\n    return 'later'\n")
    sys.path.insert(0, str(tmp_path))
    fn = load_target("later_ring_ref_mod:f")
    del sys.modules["later_ring_ref_mod"]
    assert importable_name(fn) == "later_ring_ref_mod:f"
