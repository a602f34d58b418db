"""One call of a target, observed where it runs and judged where the tester runs.

Where the target runs (the tester's own process or an isolated worker)
:func:`observe` calls it and turns what it did into plain
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

import math
import traceback
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import torch

from ring_ref._dtypes import TORCH_DTYPES
from ring_ref.difftest._inputs import Case
from ring_ref.difftest._vocabulary import Target

__all__ = [
    "Answer",
    "Failure",
    "Garbled",
    "Outcome",
    "TensorView",
    "aliases",
    "call_target",
    "decode",
    "input_problem",
    "observe",
    "result_tensor",
    "well_formed",
]

_DTYPE_NAMES: Final = {str(d): d for d in TORCH_DTYPES}
_INT_OF_WIDTH: Final = {2: torch.int16, 4: torch.int32, 8: torch.int64}

# Bound at import, before any target runs in this process (see the module docstring).
_isinstance = isinstance
_format_exception = traceback.format_exception
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
class Answer:
    """What one call returned or raised, and its argument after the call."""

    type_name: str
    result: TensorView | None = None
    argument: TensorView | None = None
    raised: str = ""
    traceback: str = ""


@dataclass(frozen=True)
class Failure:
    """A call that did not answer: ``timed-out`` or ``crashed``, with the target's Python stack if known."""

    code: Literal["timed-out", "crashed"]
    text: str
    stack: str = ""


@dataclass
class Outcome:
    """What one call of the target did on one case: its answer, or the failure, and its output."""

    case: Case
    answer: Answer | None = None
    failure: Failure | None = None
    output: str = ""


class Garbled(ValueError):
    """A reply that is not what :func:`observe` writes (the target wrote over the tester's pipe?)."""


def _bits_of(t: torch.Tensor) -> bytes:
    dense = _contiguous(_detach(t))
    return bytes(_numpy(_view(dense, _INT_OF_WIDTH[_element_size(dense)])).tobytes())


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


def observe(fn: Target, case: Case, *, catch_interrupt: bool = True) -> tuple[dict[str, Any], bytes]:
    """Call ``fn`` on a fresh input for ``case`` and describe what happened as a header and raw bits.

    Every exception the call raises is recorded, ``BaseException`` included
    (``SystemExit``; ``KeyboardInterrupt`` too unless ``catch_interrupt`` is false).
    """
    x = case.tensor()
    result_numel = math.prod((case.m, *case.trailing))
    head: dict[str, Any] = {"type": "NoneType", "raised": "", "traceback": ""}
    returned: object = None
    try:
        returned = fn(x)
    except BaseException as exc:
        if not catch_interrupt and _isinstance(exc, KeyboardInterrupt):
            raise
        message = _safe_text(exc)
        head["raised"] = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        head["traceback"] = "".join(_format_exception(exc))
    payload = []
    if not head["raised"]:
        head["type"] = type(returned).__name__
        if _isinstance(returned, _Tensor):
            try:
                head["result"], blob = _view_of(cast(torch.Tensor, returned), result_numel)
                payload.append(blob)
            except Exception as exc:
                head["type"] = f"Tensor (unreadable: {type(exc).__name__}: {_safe_text(exc)})"
    try:
        head["argument"], blob = _view_of(x, result_numel * case.n)
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
        int_dtype = _INT_OF_WIDTH[_DTYPE_NAMES[dtype].itemsize]
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
    return Answer(
        _str(head.get("type"), "type"),
        result,
        argument,
        _str(head.get("raised"), "raised"),
        _str(head.get("traceback"), "traceback"),
    )


def call_target(fn: Target, case: Case) -> Outcome:
    """Run stacked ``fn`` on a fresh tensor for ``case`` in this process; the :class:`Outcome`."""
    return Outcome(case, decode(*observe(fn, case, catch_interrupt=False)))


def result_tensor(answer: Answer, case: Case) -> torch.Tensor | None:
    """The result's values when it is a well-formed result for ``case``: shape, dtype, CPU; else ``None``."""
    r = answer.result
    if answer.raised or r is None or r.values is None:
        return None
    if r.shape != (case.m, *case.trailing) or r.dtype != str(case.dtype) or r.device != "cpu":
        return None
    return r.values


def well_formed(outcome: Outcome) -> torch.Tensor | None:
    """The values of a stacked call's well-formed result (``None``: no answer, or not well-formed)."""
    answer = outcome.answer
    return None if answer is None else result_tensor(answer, outcome.case)


def input_problem(answer: Answer, case: Case) -> str:
    """How the call changed its argument (``""``: unchanged), judged against the argument that was sent."""
    sent = case.tensor()
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
    return t.view(_INT_OF_WIDTH[t.element_size()])


def aliases(answer: Answer) -> bool:
    """Whether the result shares memory with the argument (from the storage address ranges)."""
    r, x = answer.result, answer.argument
    if r is None or x is None or r.storage is None or x.storage is None:
        return False
    (a0, a1), (b0, b1) = r.storage, x.storage
    return a0 < b1 and b0 < a1
