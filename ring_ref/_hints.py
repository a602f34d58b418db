"""The hints difftest and reveal give about how a target was run, each from evidence, in one wording.

A hint names the fix (``add --ranks gloo``, ``drop --ranks``, ``add --collective reduce-scatter``)
only when what the target is, or what it did, shows it (clause ``difftest-hints``):

* its signature, read before any call (:func:`signature_problem`): the required positional
  parameters of a plain ``def`` must fit the call the launcher makes (:func:`call_of`), else the run
  is a usage error (exit 2) naming the launchers whose call it fits;
* the exception it raised (:func:`raised_hint`): a stacked call that finds no process group, a
  per-rank call that indexes a worker axis its tensor does not have;
* the shape it returned (:func:`shape_hint`): a rank's result reduced over its tensor's first axis
  (a stacked target's sum over workers), a stacked result of ``N`` shards (a reduce-scatter).

A signature is read without running the target's module: a callable's through :mod:`inspect`, a
``TARGET`` string's from its source (:mod:`ast`), so that the tester never imports a target that
runs in a process of its own.  A target whose signature cannot be read that way (a decorated or
generated function, a builtin) gets no signature check.
"""

from __future__ import annotations

import ast
import importlib.machinery
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ring_ref.schedule import Collective

__all__ = [
    "ORDER_FILE",
    "Params",
    "call_of",
    "params_of",
    "raised_hint",
    "shape_hint",
    "signature_problem",
]

ORDER_FILE: Final = (
    "an --order file must be the JSON that `ring-ref reveal TARGET -n N -m M --json > FILE` prints "
    "(spec/reveal.schema.json)"
)
"""What an ``--order`` file should be, said when one cannot be read."""

_FITS: Final[dict[int, str]] = {
    1: "a stacked TARGET(worker_tensors) (no --ranks), or a per-rank TARGET(tensor) (--ranks gloo)",
    2: "a per-rank TARGET(comm, array) (--ranks mpi), or a rank's reduce-scatter or all-gather "
    "TARGET(output, input) (--ranks gloo --collective reduce-scatter / all-gather)",
    3: "a rank's reduce-scatter or all-gather TARGET(comm, sendbuf, recvbuf) "
    "(--ranks mpi --collective reduce-scatter / all-gather)",
}
"""The calls a target of 1, 2 or 3 positional arguments fits, and the options that make them."""


@dataclass(frozen=True)
class Params:
    """A target's positional parameters by name, how many of them (the first) have no default, and
    whether it takes ``*args``."""

    names: tuple[str, ...]
    required: int
    star: bool = False

    def fits(self, count: int, keywords: frozenset[str] = frozenset()) -> bool:
        """Whether a call with ``count`` positional arguments and ``keywords`` (``op=``) binds them all.

        >>> Params(("x", "op"), 2).fits(1, frozenset({"op"})), Params(("a", "b"), 2).fits(1)
        (True, False)
        >>> Params(("x",), 1).fits(2), Params((), 0, star=True).fits(3)
        (False, True)
        """
        if count > len(self.names) and not self.star:
            return False
        return all(name in keywords for name in self.names[count : self.required])

    @property
    def shown(self) -> str:
        """``TARGET(a, b)``: its required positional parameters."""
        return f"TARGET({', '.join(self.names[: self.required])})"


def call_of(ranks: str | None, collective: Collective) -> tuple[str, ...]:
    """The positional arguments a launcher passes (``ranks`` ``None``: stacked).

    >>> call_of(None, Collective.REDUCE_SCATTER), call_of("gloo", Collective.ALL_GATHER)
    (('worker_tensors',), ('output', 'input'))
    >>> call_of("mpi-job", Collective.ALL_REDUCE)
    ('comm', 'array')
    """
    if ranks is None:
        return ("worker_tensors",)
    mpi = ranks in ("mpi", "mpi-job")
    if not collective.alone:
        return ("comm", "array") if mpi else ("tensor",)
    return ("comm", "sendbuf", "recvbuf") if mpi else ("output", "input")


def _of_function(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Params | None:
    args = node.args
    if node.decorator_list:
        return None  # a decorator may change the signature
    positional = [*args.posonlyargs, *args.args]
    names = tuple(a.arg for a in positional)
    return Params(names, len(positional) - len(args.defaults), args.vararg is not None)


def _source_file(where: str) -> Path | None:
    """The file a ``TARGET``'s module part names, found without importing anything."""
    if where.endswith(".py"):
        return Path(where)
    search: list[str] | None = [*sys.path, str(Path.cwd())]
    spec = None
    parts = where.split(".")
    for depth in range(1, len(parts) + 1):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth]), search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    origin = None if spec is None else spec.origin
    return Path(origin) if origin and origin.endswith(".py") else None


def params_of(target: object) -> Params | None:
    """The positional parameters of ``target`` (a callable, or a ``TARGET`` string, read from its
    source without importing it); ``None`` when they cannot be read so.

    >>> params_of(lambda a, b=1, *rest: None)
    Params(names=('a', 'b'), required=1, star=True)
    >>> params_of("ring_ref.targets:mpi_allreduce")
    Params(names=('comm', 'array', 'op'), required=2, star=False)
    """
    if not isinstance(target, str):
        try:
            signature = inspect.signature(target)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        positional = [p for p in signature.parameters.values() if p.kind in kinds]
        star = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values())
        required = sum(p.default is inspect.Parameter.empty for p in positional)
        return Params(tuple(p.name for p in positional), required, star)
    where, _, name = target.rpartition(":")
    try:
        path = _source_file(where)
        tree = ast.parse(path.read_text(encoding="utf-8")) if path is not None else None
    except (OSError, SyntaxError, ValueError, ImportError):
        return None
    defs = [
        node
        for node in (tree.body if tree is not None else [])
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Assign | ast.ClassDef)
        and _binds(node, name)
    ]
    last = defs[-1] if defs else None  # the module's last binding of the name is the one loaded
    return _of_function(last) if isinstance(last, ast.FunctionDef | ast.AsyncFunctionDef) else None


def _binds(node: ast.stmt, name: str) -> bool:
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    return getattr(node, "name", None) == name


def signature_problem(target: object, ranks: str | None, collective: Collective, *, op: bool = False) -> str:
    """Why ``target``'s signature cannot take the call ``ranks`` and ``collective`` make (``op``: with
    ``op=``), with the calls it fits; ``""`` when it can, or when its signature cannot be read.

    >>> signature_problem(lambda a, b: None, None, Collective.ALL_REDUCE)[:72]
    'TARGET(a, b) needs 2 positional arguments, but a stacked target is calle'
    >>> signature_problem(lambda x, op: None, None, Collective.ALL_REDUCE, op=True)
    ''
    """
    params = params_of(target)
    call = call_of(ranks, collective)
    if params is None or params.fits(len(call), frozenset({"op"} if op else ())):
        return ""
    how = "a stacked target" if ranks is None else f"--ranks {ranks}"
    how += collective.option
    needs = params.required - (op and "op" in params.names[len(call) : params.required])
    fits = _FITS.get(needs if needs > len(call) else len(params.names))
    return (
        f"{params.shown} needs {needs} positional argument{'s' if needs != 1 else ''}"
        + (f" (at most {len(params.names)})" if len(params.names) < len(call) and not params.star else "")
        + f", but {how} is called TARGET({', '.join(call)})"
        + (f": it fits {fits}" if fits else "")
    )


_PER_RANK_SIGNS: Final = ("process group has not been initialized",)
"""What a per-rank ``torch.distributed`` target raises when called stacked: no process group."""

_MORE_ARGUMENTS: Final = "required positional argument"
"""What a target of more arguments than the call's raises (``missing 1 required positional argument``)."""

_STACKED_SIGNS: Final = ("tuple index out of range", "values to unpack", "dimension", "shape")
"""What a stacked target called per rank raises: it indexes the ``N`` axis of a ``(M, ...)`` tensor
(``x.shape[1]``, ``n, m = x.shape``, ``x[i]`` past ``M``), not any ``IndexError`` (a list's is the target's
own)."""


def raised_hint(raised: str, *, per_rank: bool) -> str:
    """A hint when an exception (``"Type: message"``) shows a target of another kind than the call,
    else ``""``.

    >>> raised_hint("IndexError: tuple index out of range", per_rank=True)[:40]
    '; this looks like a stacked target (work'
    >>> raised_hint("IndexError: Dimension out of range (expected to be in [-1, 0])", per_rank=True)[-12:]
    '(ranks=None)'
    >>> raised_hint("ValueError: Default process group has not been initialized", per_rank=False)[:44]
    '; this looks like a per-rank target: add --r'
    """
    if not per_rank and any(sign in raised for sign in _PER_RANK_SIGNS):
        return (
            "; this looks like a per-rank target: add --ranks gloo (ranks='gloo'), or --ranks mpi "
            "(ranks='mpi') for TARGET(comm, array)"
        )
    if _MORE_ARGUMENTS in raised and raised.startswith("TypeError"):
        return f"; TARGET needs more arguments than this call passes: two fit {_FITS[2]}"
    if per_rank and any(sign in raised.lower() for sign in _STACKED_SIGNS):
        return (
            "; this looks like a stacked target (worker_tensors of shape (N, M, ...)): drop --ranks "
            "(ranks=None)"
        )
    return ""


def shape_hint(
    got: tuple[int, ...], want: tuple[int, ...], *, n: int, per_rank: bool, collective: Collective
) -> str:
    """A hint when an all-reduce's wrong result shape shows a target of another kind or collective, else
    ``""``: ``want`` is the result shape expected, ``(M, ...)``.

    >>> shape_hint((), (2,), n=2, per_rank=True, collective=Collective.ALL_REDUCE)[:40]
    '; this looks like a stacked target: rank'
    >>> shape_hint((2, 3), (6,), n=2, per_rank=False, collective=Collective.ALL_REDUCE)[:44]
    '; this looks like a reduce-scatter (row r is'
    >>> shape_hint((2, 6), (6,), n=2, per_rank=False, collective=Collective.ALL_REDUCE)
    ' (a stack of N copies?)'
    """
    if collective.alone or not want:
        return ""
    if per_rank:
        if got == want[1:]:
            return (
                "; this looks like a stacked target: rank tensors of shape (M, ...) were reduced over "
                "their first axis, as a stacked target sums its workers: drop --ranks (ranks=None)"
            )
        return ""
    m, rest = want[0], want[1:]
    shards = m % n == 0 and got == (n, m // n, *rest)
    copies = got == (n, *want)
    if shards and copies:
        return " (a stack of N copies? or a reduce-scatter's N shards: then add --collective reduce-scatter)"
    if shards:
        return (
            "; this looks like a reduce-scatter (row r is rank r's shard of M/N): add --collective "
            "reduce-scatter (collective='reduce-scatter')"
        )
    return " (a stack of N copies?)" if copies else ""
