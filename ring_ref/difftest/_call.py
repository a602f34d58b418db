"""One call of a target, observed where it runs and judged where the tester runs.

Where the target runs (the tester's own process, an isolated worker, or each
rank of a process group) :func:`observe` calls it and turns what it did into plain
data: a JSON-able *header* (the returned value's type, shape, strides, dtype,
device and storage address range, the exception it raised, the same for the
argument after the call) and a *payload* of raw bits.  :func:`decode` rebuilds
an :class:`Answer` from those two, checking every field, in the process that
judges.  The judgments themselves (:func:`result_tensor`, :func:`input_problem`,
:func:`aliases`) are made there from the answer and the :class:`Case` that was
sent, so nothing the target does to its own process (patching ``torch``,
``ring_ref`` or this module) can change them: at most it can change the bytes
it sends back, and those bytes are what is checked.

The functions :func:`observe` relies on are bound when this module is
imported, before any target is, so a target that replaces ``torch.Tensor``
methods does not change how its result is read.
"""

from __future__ import annotations

import inspect
import math
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import torch

from ring_ref._dtypes import INT_OF_SIZE, TORCH_DTYPES
from ring_ref._hints import raised_hint
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._vocabulary import Framework, OpTarget, Ranks, Target, op_argument

__all__ = [
    "Answer",
    "Failure",
    "Garbled",
    "Outcome",
    "RaisedAt",
    "TensorView",
    "aliases",
    "call_target",
    "decode",
    "decode_raised_at",
    "input_problem",
    "kind_hint",
    "observe",
    "raised_at",
    "result_tensor",
    "results",
    "shards",
    "stopped_note",
    "well_formed",
]

_DTYPE_NAMES: Final = {str(d): d for d in TORCH_DTYPES}

# Bound at import, before any target runs in this process (see the module docstring).
_isinstance = isinstance
_format_exception = traceback.format_exception
_extract_tb = traceback.extract_tb
_unwrap = inspect.unwrap
_Tensor = torch.Tensor
_size = torch.Tensor.size
_stride = torch.Tensor.stride
_numel = torch.Tensor.numel
_detach = torch.Tensor.detach
_contiguous = torch.Tensor.contiguous
_view = torch.Tensor.view
_numpy = torch.Tensor.numpy
_untyped_storage = torch.Tensor.untyped_storage
_data_ptr = torch.UntypedStorage.data_ptr
_nbytes = torch.UntypedStorage.nbytes
_get_dtype = cast(Any, torch.Tensor.dtype).__get__
_get_device = cast(Any, torch.Tensor.device).__get__
_element_size = torch.Tensor.element_size


@dataclass(frozen=True)
class TensorView:
    """A tensor as the tester sees it: its metadata, and its bits when it holds what a result should."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    device: str
    storage: tuple[int, int] | None = None
    bits: torch.Tensor | None = None

    @property
    def values(self) -> torch.Tensor | None:
        """The tensor rebuilt from its bits (in its own dtype), or ``None`` when they were not sent."""
        if self.bits is None:
            return None
        return self.bits.view(_DTYPE_NAMES[self.dtype])


@dataclass(frozen=True)
class RaisedAt:
    """Where a target raised: the innermost frame of the exception's traceback in the target's code
    (:func:`raised_at`, clause ``difftest-raised-at``): the file, the line and its source text."""

    file: str
    line: int
    source: str = ""

    def words(self) -> str:
        """`` at /u/t.py:12: return xs[9]``: the words the report adds after ``raised ...``.

        >>> RaisedAt("/u/t.py", 12, "return xs[9]").words()
        ' at /u/t.py:12: return xs[9]'
        """
        return f" at {self.file}:{self.line}" + (f": {self.source}" if self.source else "")

    def to_json(self) -> dict[str, Any]:
        """The report's ``raised_at`` (``spec/difftest_report.schema.json``)."""
        return {"file": self.file, "line": self.line, "source": self.source}


_PACKAGE_DIR: Final = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""``ring_ref/`` itself: the tester's frames, never the target's (unless the target is defined there)."""
_INSTALLED: Final = ("site-packages", "dist-packages")
_STDLIB: Final = os.path.dirname(os.path.abspath(traceback.__file__))


def _in_target_code(file: str, own: str | None) -> bool:
    """Whether a frame's file is the target's code: the target's own file, or any file that exists outside
    ``ring_ref``, installed packages (a ``site-packages`` or ``dist-packages`` directory) and the standard
    library."""
    if file == own:
        return True
    path = os.path.abspath(file)
    if not os.path.isfile(path):
        return False  # <frozen importlib._bootstrap>, <string>, a compiled extension's .pyx: no file to show
    inside = (_PACKAGE_DIR, _STDLIB)
    if any(path == d or path.startswith(d + os.sep) for d in inside):
        return False
    return not any(part in _INSTALLED for part in path.split(os.sep))


def raised_at(exc: BaseException, fn: object) -> RaisedAt | None:
    """The innermost frame of ``exc``'s traceback that is in the target ``fn``'s code (``None``: none is,
    as for a builtin that raised from C).

    The target's code is ``fn``'s own file (the function's, through ``__wrapped__``) and every existing
    file outside the ``ring_ref`` package, installed packages and the standard library: a bug in the user's
    code is shown where it is, an exception raised inside ``torch`` at the user's line that called it.

    >>> def target(x):
    ...     return [][x]
    >>> try:
    ...     target(1)
    ... except IndexError as exc:
    ...     at = raised_at(exc, target)
    >>> at.source, at.line > 0
    ('return [][x]', True)
    """
    code = getattr(_unwrap(fn), "__code__", None) if callable(fn) else None
    own = getattr(code, "co_filename", None)
    for frame in reversed(_extract_tb(exc.__traceback__)):
        if _in_target_code(frame.filename, own):
            return RaisedAt(frame.filename, frame.lineno or 0, (frame.line or "").strip())
    return None


@dataclass(frozen=True)
class Answer:
    """What one call returned or raised, and its argument after the call (one per rank for a group).

    ``rank`` is ``None`` for a stacked call.  For a per-rank call that
    returned ``None``, ``result`` is the argument after the call
    (``returned_none``).
    """

    type_name: str
    result: TensorView | None = None
    argument: TensorView | None = None
    raised: str = ""
    traceback: str = ""
    rank: int | None = None
    returned_none: bool = False
    raised_at: RaisedAt | None = None
    """Where it raised, in the target's code (:func:`raised_at`)."""


@dataclass(frozen=True)
class Failure:
    """A call that did not answer: ``timed-out`` or ``crashed``, the target's Python stack if known.

    For a group, ``ranks`` are the ranks that did not answer (still inside the
    call, or dead), and ``stack`` holds each one's stack under a ``rank r:`` line.
    """

    code: Literal["timed-out", "crashed"]
    text: str
    stack: str = ""
    ranks: tuple[int, ...] = ()


def stopped_note(stopped: Sequence[int], raised: Sequence[int | None], grace_s: float) -> str:
    """What a group's outcome notes when ranks were stopped after others raised.

    >>> stopped_note([0], [1], 2.0)[:60]
    'rank(s) [0] were still inside the call 2 s after rank(s) [1]'
    """
    return (
        f"rank(s) {stopped} were still inside the call {grace_s:g} s after rank(s) {raised} raised, and "
        "were stopped (waiting for a peer that had given up?)"
    )


@dataclass
class Outcome:
    """What one call of the target did on one case: its answers, or the failure, and its output.

    ``answers`` has one answer for a stacked call and one per rank, in rank
    order, for a per-rank one; a failed call may carry the answers of the
    ranks that did answer.  ``note`` adds what the launcher saw besides the
    answers (ranks stopped after another rank raised: :func:`stopped_note`),
    and ``stack`` what it knows of them (the raised ranks' tracebacks, the
    stopped ranks' stacks).
    """

    case: Case
    answers: tuple[Answer, ...] = ()
    failure: Failure | None = None
    output: str = ""
    note: str = ""
    stack: str = ""

    @property
    def answer(self) -> Answer | None:
        """The one answer of a stacked call (``None`` when it did not answer)."""
        stacked = len(self.answers) == 1 and self.answers[0].rank is None
        return self.answers[0] if self.failure is None and stacked else None


class Garbled(ValueError):
    """A reply that is not what :func:`observe` writes (the target wrote over the tester's pipe?)."""


def _bits_of(t: torch.Tensor) -> bytes:
    dense = _contiguous(_detach(t))
    return bytes(_numpy(_view(dense, INT_OF_SIZE[_element_size(dense)])).tobytes())


def _view_of(t: torch.Tensor, want_numel: int) -> tuple[dict[str, Any], bytes]:
    """Header and bits of a tensor (bits for a CPU tensor of a tester dtype and ``want_numel`` elements)."""
    dtype, device = str(_get_dtype(t)), str(_get_device(t))
    head: dict[str, Any] = {
        "shape": [int(s) for s in _size(t)],
        "stride": [int(s) for s in _stride(t)],
        "dtype": dtype,
        "device": device,
        "storage": None,
        "bits": 0,
    }
    blob = b""
    if device == "cpu":
        storage = _untyped_storage(t)
        start = int(_data_ptr(storage))
        head["storage"] = [start, start + int(_nbytes(storage))]
        if dtype in _DTYPE_NAMES and int(_numel(t)) == want_numel:
            blob = _bits_of(t)
            head["bits"] = len(blob)
    return head, blob


def _safe_text(obj: object) -> str:
    try:
        return str(obj)
    except BaseException as exc:
        return f"<str() failed: {type(exc).__name__}>"


def _to_cpu(x: torch.Tensor, returned: object) -> tuple[torch.Tensor, object]:
    """A rank's argument and result read back from its device (a result that was the argument stays it)."""
    on_cpu = x.cpu()
    if returned is x:
        return on_cpu, on_cpu
    return on_cpu, cast(torch.Tensor, returned).cpu() if _isinstance(returned, _Tensor) else returned


def observe(
    fn: Target | OpTarget,
    case: Case,
    rank: int | None = None,
    *,
    catch_interrupt: bool = True,
    device: str = "cpu",
    framework: Framework = "torch",
) -> tuple[dict[str, Any], bytes]:
    """Call ``fn`` on a fresh input for ``case`` and describe what happened as a header and raw bits.

    ``rank`` is ``None`` for a stacked call (``fn`` gets the ``(N, M, ...)``
    tensor in the case's layout) and a rank for a per-rank call (``fn`` gets
    that rank's fresh contiguous ``(M, ...)`` tensor; when it returns ``None``
    the tensor itself, after the call, is the result; for a reduce-scatter or
    an all-gather the call is ``fn(output, input)``, with a fresh output
    buffer filled with NaN that is the result when it returns ``None``).  With an op
    (``case.op``) the call is ``fn(x, op=...)``: the op's name, or for a rank
    (a gloo group's) its ``torch.distributed.ReduceOp`` (a ``framework="jax"`` rank's: the name).
    Every exception the call raises is recorded, ``BaseException`` included (``SystemExit``;
    ``KeyboardInterrupt`` too unless ``catch_interrupt`` is false).

    ``device`` (a rank's, ``--device cuda``): the input is put there, and the
    argument and the result are read back to the CPU after the call (a result
    that is the argument itself stays the argument).
    """
    x = case.tensor() if rank is None else case.rank_tensor(rank)
    ranks: Ranks = "jax" if framework == "jax" else "gloo"
    if device != "cpu":
        x = x.to(device)
    result_numel = math.prod(case.result_shape(rank))
    head: dict[str, Any] = {"type": "NoneType", "raised": "", "traceback": "", "rank": rank}
    head["returned_none"] = False
    returned: object = None
    # a rank of a reduce-scatter or an all-gather is called TARGET(output, input), as torch.distributed's
    output = case.output_tensor(rank) if rank is not None and case.collective.alone else None
    args = (x,) if output is None else (output, x)
    try:
        if case.op is None:
            returned = cast(OpTarget, fn)(*args)
        else:
            returned = cast(OpTarget, fn)(*args, op=op_argument(case.op, None if rank is None else ranks))
    except BaseException as exc:
        if not catch_interrupt and _isinstance(exc, KeyboardInterrupt):
            raise
        message = _safe_text(exc)
        head["raised"] = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        head["traceback"] = "".join(_format_exception(exc))
        where = raised_at(exc, fn)
        if where is not None:
            head["raised_at"] = [where.file, where.line, where.source]
    if device != "cpu":
        x, returned = _to_cpu(x, returned)
    payload = []
    if not head["raised"]:
        head["type"] = type(returned).__name__
        if rank is not None and returned is None:
            head["returned_none"], returned = True, x if output is None else output
        if _isinstance(returned, _Tensor):
            try:
                head["result"], blob = _view_of(cast(torch.Tensor, returned), result_numel)
                payload.append(blob)
            except Exception as exc:
                head["type"] = f"Tensor (unreadable: {type(exc).__name__}: {_safe_text(exc)})"
    try:
        head["argument"], blob = _view_of(x, math.prod(case.shape) // (1 if rank is None else case.n))
        payload.append(blob)
    except Exception as exc:
        head["argument_unreadable"] = f"{type(exc).__name__}: {_safe_text(exc)}"
    return head, b"".join(payload)


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise Garbled(f"{what} is not a list of integers")
    return tuple(value)


def _str(value: object, what: str) -> str:
    if type(value) is not str:
        raise Garbled(f"{what} is not a string")
    return value


def _decode_view(head: object, payload: memoryview, what: str) -> tuple[TensorView, memoryview]:
    if not isinstance(head, dict):
        raise Garbled(f"{what} is not an object")
    shape = _ints(head.get("shape"), f"{what}.shape")
    stride = _ints(head.get("stride"), f"{what}.stride")
    dtype = _str(head.get("dtype"), f"{what}.dtype")
    device = _str(head.get("device"), f"{what}.device")
    raw_storage = head.get("storage")
    storage = None
    if raw_storage is not None:
        bounds = _ints(raw_storage, f"{what}.storage")
        if len(bounds) != 2:
            raise Garbled(f"{what}.storage is not a start and an end")
        storage = (bounds[0], bounds[1])
    nbytes = head.get("bits")
    if type(nbytes) is not int or not 0 <= nbytes <= len(payload):
        raise Garbled(f"{what}.bits is not a byte count within the payload")
    bits = None
    if nbytes:
        if dtype not in _DTYPE_NAMES or device != "cpu" or any(s < 0 for s in shape):
            raise Garbled(f"{what} has bits but is not a CPU tensor of a tester dtype")
        int_dtype = INT_OF_SIZE[_DTYPE_NAMES[dtype].itemsize]
        if nbytes != math.prod(shape) * _DTYPE_NAMES[dtype].itemsize:
            raise Garbled(f"{what} has {nbytes} bytes of bits for shape {shape}")
        bits = torch.frombuffer(bytearray(payload[:nbytes]), dtype=int_dtype).reshape(shape)
    return TensorView(shape, stride, dtype, device, storage, bits), payload[nbytes:]


def decode(head: object, payload: bytes) -> Answer:
    """The :class:`Answer` in a header and payload from :func:`observe`; :class:`Garbled` if malformed."""
    if not isinstance(head, dict):
        raise Garbled("the header is not an object")
    rest = memoryview(payload)
    result = argument = None
    if "result" in head:
        result, rest = _decode_view(head["result"], rest, "result")
    if "argument" in head:
        argument, rest = _decode_view(head["argument"], rest, "argument")
    if len(rest):
        raise Garbled(f"{len(rest)} unexplained payload bytes")
    rank = head.get("rank")
    if rank is not None and type(rank) is not int:
        raise Garbled("rank is not an integer")
    if type(head.get("returned_none")) is not bool:
        raise Garbled("returned_none is not a boolean")
    return Answer(
        _str(head.get("type"), "type"),
        result,
        argument,
        _str(head.get("raised"), "raised"),
        _str(head.get("traceback"), "traceback"),
        rank,
        bool(head["returned_none"]),
        decode_raised_at(head.get("raised_at")),
    )


def decode_raised_at(value: object) -> RaisedAt | None:
    """A header's ``raised_at`` (``[file, line, source]``, or absent) checked; :class:`Garbled` if malformed.

    >>> decode_raised_at(["/u/t.py", 3, "x[9]"])
    RaisedAt(file='/u/t.py', line=3, source='x[9]')
    """
    if value is None:
        return None
    if not (isinstance(value, list | tuple) and len(value) == 3 and type(value[1]) is int):
        raise Garbled("raised_at is not a file, a line and its source")
    return RaisedAt(_str(value[0], "raised_at file"), value[1], _str(value[2], "raised_at source"))


def call_target(fn: Target | OpTarget, case: Case) -> Outcome:
    """Run stacked ``fn`` on a fresh tensor for ``case`` in this process; the :class:`Outcome`."""
    return Outcome(case, (decode(*observe(fn, case, catch_interrupt=False)),))


def result_tensor(answer: Answer, case: Case) -> torch.Tensor | None:
    """The result's values when it is a well-formed result for ``case``: shape, dtype, CPU; else ``None``."""
    r = answer.result
    if answer.raised or r is None or r.values is None:
        return None
    if r.shape != case.result_shape(answer.rank) or r.dtype != str(case.dtype) or r.device != "cpu":
        return None
    return r.values


def kind_hint(answer: Answer) -> str:
    """A hint when an exception looks like a target of the other kind (per-rank vs stacked), else ``""``
    (the wording is :func:`ring_ref._hints.raised_hint`'s, which reveal shares).

    >>> kind_hint(Answer("", raised="IndexError: tuple index out of range", rank=0))[:40]
    '; this looks like a stacked target (work'
    """
    return raised_hint(answer.raised, per_rank=answer.rank is not None)


def results(outcome: Outcome) -> dict[int | None, torch.Tensor | None]:
    """Each result of ``outcome`` by rank (``None``: stacked), as the all-reduce it stands for: a
    reduce-scatter's shards, in rank order, make the ``(M, ...)`` reduction they are the chunks of
    (a group's under rank ``None``; clause ``difftest-collectives``).  ``None`` for a result that is
    not well-formed."""
    case = outcome.case
    if outcome.failure is not None:
        return {}
    got = {a.rank: result_tensor(a, case) for a in outcome.answers}
    if not case.collective.scatters:
        return got
    full = (case.m, *case.trailing)
    if None in got:
        stacked = got[None]
        return {None: None if stacked is None else stacked.reshape(full)}
    shards = [got.get(r) for r in range(case.n)]
    if any(s is None for s in shards):
        return {None: None}
    return {None: torch.cat(cast(list[torch.Tensor], shards)).reshape(full)}


def shards(outcome: Outcome) -> list[torch.Tensor] | None:
    """A reduce-scatter's ``N`` shards, rank ``r``'s at index ``r`` (stacked: the result's rows), or
    ``None`` when some rank's is not well-formed."""
    got = {a.rank: result_tensor(a, outcome.case) for a in outcome.answers}
    if outcome.failure is not None or any(t is None for t in got.values()):
        return None
    if None in got:
        return list(cast(torch.Tensor, got[None]).unbind(0))
    return [cast(torch.Tensor, got[r]) for r in range(outcome.case.n)] if len(got) == outcome.case.n else None


def well_formed(outcome: Outcome, rank: int | None = None) -> torch.Tensor | None:
    """The values of the well-formed result of a stacked call, or of ``rank``'s (``None``: no such result);
    a reduce-scatter's as :func:`results` gives them."""
    return results(outcome).get(rank)


def input_problem(answer: Answer, case: Case) -> str:
    """How the call changed its argument (``""``: unchanged), judged against the argument that was sent.

    A per-rank all-reduce that works in place (returns ``None``, or a tensor
    sharing the argument's storage) may change its argument: that is its
    result.  A rank's reduce-scatter or all-gather writes its output, never its input.
    """
    in_place = not case.collective.alone and (answer.returned_none or _shares(answer))
    if answer.rank is not None and in_place:
        return ""
    sent = case.tensor() if answer.rank is None else case.rank_tensor(answer.rank)
    shape, stride, dtype = tuple(sent.shape), sent.stride(), str(sent.dtype)
    seen = answer.argument
    if seen is None or (
        seen.values is None and (seen.shape, seen.stride, seen.dtype) == (shape, stride, dtype)
    ):
        return "the input could not be read after the call"
    if (seen.shape, seen.stride, seen.dtype) != (shape, stride, dtype):
        return (
            f"the input's shape/stride/dtype changed from {shape}/{stride}/{dtype} "
            f"to {seen.shape}/{seen.stride}/{seen.dtype}"
        )
    after = seen.values
    if after is None:
        return "the input could not be read after the call"
    changed = (_int_view(after) != _int_view(sent.contiguous())).nonzero()
    if changed.numel() == 0:
        return ""
    where = tuple(int(v) for v in changed[0])
    return (
        f"the input was modified: element {where} was {sent[where].item()!r}, is now {after[where].item()!r}"
    )


def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_OF_SIZE[t.element_size()])


def aliases(answer: Answer) -> bool:
    """Whether a stacked call's result shares memory with its argument (per rank that is working in place)."""
    return answer.rank is None and _shares(answer)


def _shares(answer: Answer) -> bool:
    """Whether the result's storage overlaps the argument's (from the address ranges the worker sent)."""
    r, x = answer.result, answer.argument
    if r is None or x is None or r.storage is None or x.storage is None:
        return False
    (a0, a1), (b0, b1) = r.storage, x.storage
    return a0 < b1 and b0 < a1
