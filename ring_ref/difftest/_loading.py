"""Loading a target by name (``package.module:function`` or ``path/to/file.py:function``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Final, cast

from ring_ref.difftest._vocabulary import Framework, OpTarget, Target

__all__ = ["TargetError", "importable_name", "load_target", "with_framework"]


def importable_name(fn: Target) -> str | None:
    """``module:function`` for a module-level function that :func:`load_target` can load again, else ``None``.

    >>> from ring_ref import ring_all_reduce
    >>> importable_name(ring_all_reduce), importable_name(lambda x: x)
    ('ring_ref:ring_all_reduce', None)
    """
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__":
        return None
    if not qualname.isidentifier() or module.startswith(_FILE_MODULE_PREFIX):
        return None
    loaded = sys.modules.get(module)
    if loaded is not None and getattr(loaded, qualname, None) is not fn:
        return None  # the name now means something else (rebound, or a decorator's inner function)
    return f"{module}:{qualname}"


_FILE_MODULE_PREFIX: Final = "_ring_ref_target_"


class TargetError(ValueError):
    """A ``TARGET`` that cannot be loaded (``ring-ref difftest`` exits 2 with this message)."""


def load_target(spec: str, framework: Framework = "torch") -> Target:
    """Import ``package.module:function`` or ``path/to/file.py:function`` and return the function.

    A dotted module is looked up on ``sys.path`` plus the current directory.
    ``framework="jax"``: the function takes and returns ``jax.Array``; it is
    returned wrapped to take and return tensors (:func:`~ring_ref.difftest._jax.on_jax`).

    >>> load_target("ring_ref:ring_all_reduce").__name__
    'ring_all_reduce'
    >>> load_target("ring_ref")
    Traceback (most recent call last):
    ...
    ring_ref.difftest._loading.TargetError: TARGET 'ring_ref' must be package.module:function or ...
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise TargetError(f"TARGET {spec!r} must be package.module:function or path/to/file.py:function")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise TargetError(f"TARGET file {where!r} does not exist")
            module_spec = importlib.util.spec_from_file_location(f"{_FILE_MODULE_PREFIX}{path.stem}", path)
            if module_spec is None or module_spec.loader is None:
                raise TargetError(f"cannot import {where!r} as a Python module")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module
            module_spec.loader.exec_module(module)
        else:
            if str(Path.cwd()) not in sys.path and "" not in sys.path:
                sys.path.insert(0, str(Path.cwd()))  # as `python -m` would: modules in the current directory
            module = importlib.import_module(where)
    except TargetError:
        raise
    except (Exception, SystemExit) as exc:  # a module that calls sys.exit() on import is a bad target too
        raise TargetError(f"importing {where!r} failed: {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, name, None)
    if fn is None:
        raise TargetError(f"{where!r} has no attribute {name!r}")
    if not callable(fn):
        raise TargetError(f"{spec!r} is not a function but an object of type {type(fn).__name__}")
    if framework == "jax":
        return with_framework(cast(Target, fn), framework)
    return cast(Target, fn)


def with_framework(fn: Target | OpTarget, framework: Framework) -> Target:
    """``fn`` as the tester calls a target: a JAX one wrapped (:mod:`ring_ref.difftest._jax`), else itself."""
    if framework == "torch":
        return fn
    try:
        from ring_ref.difftest._jax import on_jax  # jax, the optional extra, only for a JAX run
    except ImportError as exc:
        raise TargetError(
            f"--framework jax needs jax ({exc}); install the extra: pip install 'ring-ref[jax]'"
        ) from exc
    return on_jax(fn)
