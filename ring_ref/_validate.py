"""The spec's ``bad-input`` table, for every entry point: one check and one message per problem.

The simulated ring (both engines, torch and numpy), the distributed ring and
the trace tool all ask this module; the same problem gets the same message
wherever it is met.  Checks that read only metadata (type, layout, dtype,
shape, device) come first and cost nothing; the finiteness scan is separate
(:func:`torch_finite`, :func:`numpy_finite`) so that an engine may do it its
own way.

>>> check_torch(torch.ones(2, 4))
(2, 4)
>>> check_torch(torch.ones(2, 5))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: M = 5 is not divisible by N = 2, so the 2 chunks cannot be equal. Pad M to a multiple of 2 ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._chunks import chunk_bounds, chunk_rows
from ring_ref._dtypes import FORMATS, NUMPY_DTYPES, TORCH_DTYPES
from ring_ref.schedule import (
    LAYOUTS,
    PRESETS,
    SPEC,
    ChainSchedule,
    RingSchedule,
    Schedule,
    reduce_scatter_ring,
)

__all__ = [
    "ALL_GATHER_INPUT",
    "ALL_REDUCE_INPUT",
    "REDUCE_SCATTER_INPUT",
    "SCAN_ELEMENTS",
    "BadInput",
    "Stacked",
    "check_collective_size",
    "check_jax_structure",
    "check_numpy",
    "check_numpy_structure",
    "check_ring_size",
    "check_torch",
    "check_torch_structure",
    "collective_input",
    "not_an_array",
    "numpy_finite",
    "plain_array",
    "rank_array_problem",
    "rank_array_shards_problem",
    "rank_shards_problem",
    "rank_tensor_problem",
    "scan_blocks",
    "schedule_of",
    "shards_problem",
    "torch_finite",
]


class BadInput(NamedTuple):
    """One rejected input: the exception type the table prescribes and its message."""

    kind: type[Exception]
    message: str

    def error(self) -> Exception:
        """The exception to raise."""
        return self.kind(self.message)


def _raise(problem: BadInput | None) -> None:
    if problem is not None:
        raise problem.error()


class Stacked(NamedTuple):
    """Whose stacked argument a message is about: the function, the argument and its row count's name."""

    function: str
    argument: str
    rows: str


ALL_REDUCE_INPUT: Final = Stacked("ring_all_reduce", "worker_tensors", "M")
REDUCE_SCATTER_INPUT: Final = Stacked("ring_reduce_scatter", "x", "M")
ALL_GATHER_INPUT: Final = Stacked("ring_all_gather", "shards", "S")


# --- one message per problem -------------------------------------------------------------------


def not_an_array(got: object, what: Stacked = ALL_REDUCE_INPUT) -> BadInput:
    """Neither a torch tensor nor a numpy array."""
    hint = (
        " Stack the per-worker tensors first, e.g. torch.stack(tensors)."
        if isinstance(got, (list, tuple))
        else ""
    )
    return BadInput(
        TypeError,
        f"{what.function} expects {what.argument} as one torch.Tensor or numpy.ndarray of shape "
        f"(N, {what.rows}, ...); got {type(got).__name__}.{hint}",
    )


def _rows_problem(
    n: int, m: int, shape: Sequence[int], *, divisible: bool, rows: str = "M"
) -> BadInput | None:
    """``M`` rows split among ``N`` workers (or ranks); trailing dimensions of ``shape`` positive.

    ``divisible=False`` (a layout other than ``even``, clause ``schedule-layouts``)
    accepts any positive ``M``.
    """
    if n < 1:
        return BadInput(ValueError, f"N = {n} workers (shape {tuple(shape)}); the ring needs at least one.")
    if m < 1:
        return BadInput(ValueError, f"{rows} = {m} rows (shape {tuple(shape)}); {rows} must be positive.")
    if any(d == 0 for d in shape):
        return BadInput(
            ValueError,
            f"trailing dimensions must be positive; got shape {tuple(shape)}. Drop the empty dimension.",
        )
    if divisible and m % n:
        return BadInput(
            ValueError,
            f"M = {m} is not divisible by N = {n}, so the {n} chunks cannot be equal. "
            f"Pad M to a multiple of {n} (e.g. {m + (-m) % n}), or use a ring whose layout takes any M: "
            "schedule='openmpi-ring' or schedule='gloo'.",
        )
    return None


def _stacked_shape_problem(
    shape: Sequence[int], *, divisible: bool = True, what: Stacked = ALL_REDUCE_INPUT
) -> BadInput | None:
    if len(shape) < 2:
        return BadInput(
            ValueError,
            f"{what.argument} must have shape (N, {what.rows}, ...) with at least 2 dimensions; got shape "
            f"{tuple(shape)}. Add a worker axis (x.unsqueeze(0) / x[None]) or a data axis.",
        )
    return _rows_problem(shape[0], shape[1], shape, divisible=divisible, rows=what.rows)


_SUPPORTED: Final = {
    "torch": "torch.float16, bfloat16, float32, float64",
    "numpy": "numpy.float16, float32, float64",
    "jax": "jax.numpy.float16, bfloat16, float32, float64 (float64 with jax_enable_x64)",
}


def _unsupported_dtype(dtype: object, kind: str) -> BadInput:
    supported = _SUPPORTED[kind]
    return BadInput(
        TypeError,
        f"unsupported dtype {dtype}; the ring sums floating-point values only ({supported}). "
        "Cast first, e.g. x.to(torch.float32) or x.astype(numpy.float32); for complex inputs reduce "
        "the real and imaginary parts as a trailing axis of size 2.",
    )


def _non_finite(count: int, index: Sequence[int]) -> BadInput:
    return BadInput(
        ValueError,
        f"inputs must be finite: {count} element(s) are NaN or infinite, the first at index "
        f"{tuple(index)}. Clean or mask them before the all-reduce.",
    )


def _torch_metadata_problem(x: torch.Tensor) -> BadInput | None:
    """Layout, dtype and device: the checks every torch entry point shares."""
    if x.is_nested or x.layout != torch.strided:
        return BadInput(
            TypeError,
            f"worker_tensors must be a dense strided tensor; got layout {x.layout}"
            f"{' (nested)' if x.is_nested else ''}. Convert with .to_dense() first.",
        )
    if x.dtype not in TORCH_DTYPES:
        return _unsupported_dtype(x.dtype, "torch")
    if x.device.type == "meta":
        return BadInput(ValueError, "the tensor is on the meta device and holds no values to reduce.")
    return None


# --- the simulated ring: (N, M, ...) ------------------------------------------------------------


def check_torch_structure(
    x: object, *, divisible: bool = True, what: Stacked = ALL_REDUCE_INPUT
) -> tuple[int, int]:
    """The metadata rows of the table for a stacked torch input; return ``(N, M)``.

    ``divisible=False`` skips the ``M``-divisible-by-``N`` row (layouts other than ``even``);
    ``what`` names the function and argument in the messages.
    """
    if not isinstance(x, torch.Tensor):
        raise not_an_array(x, what).error()
    _raise(_torch_metadata_problem(x))
    _raise(_stacked_shape_problem(tuple(x.shape), divisible=divisible, what=what))
    return int(x.shape[0]), int(x.shape[1])


SCAN_ELEMENTS: Final = 1 << 20
"""The most elements a finiteness scan reads in one step (:func:`torch_finite`, :func:`numpy_finite`)."""

_S = TypeVar("_S", torch.Tensor, npt.NDArray[Any])


def scan_blocks(x: _S, limit: int = SCAN_ELEMENTS) -> Iterator[_S]:
    """Views that cover ``x``, each of at most ``limit`` elements unless a single element is more:
    runs of whole leading slices, or, where one slice is larger, the blocks of each slice.  So a
    scan's temporaries stay small, and a long one-dimensional tensor takes a few steps, not one per
    element.

    >>> [tuple(b.shape) for b in scan_blocks(np.zeros((5, 3)), limit=6)]
    [(2, 3), (2, 3), (1, 3)]
    >>> [tuple(b.shape) for b in scan_blocks(np.zeros(5), limit=2)]
    [(2,), (2,), (1,)]
    """
    if x.ndim == 0 or math.prod(x.shape) <= limit:
        yield x
        return
    row = math.prod(x.shape[1:])
    if row <= limit:
        step = limit // max(row, 1)
        for start in range(0, x.shape[0], step):
            yield x[start : start + step]
        return
    for i in range(x.shape[0]):
        yield from scan_blocks(x[i], limit)


def torch_finite(x: torch.Tensor) -> None:
    """Raise the table's error naming the count and first index of NaN/infinity in ``x``, if any.

    Scans :func:`scan_blocks` one after another, so the temporaries are a fraction
    of the input; the whole-input mask is built only to word the error.
    """
    x = x.detach()
    if x.dim() == 0 or not all(bool(torch.isfinite(block).all()) for block in scan_blocks(x)):
        bad = ~torch.isfinite(x).reshape(-1)
        count = int(bad.sum())
        if count:
            first = int(bad.to(torch.uint8).argmax())  # the first of equal maxima
            raise _non_finite(count, [int(v) for v in np.unravel_index(first, tuple(x.shape))]).error()


def check_torch(x: object, *, divisible: bool = True) -> tuple[int, int]:
    """Every row of the table for a stacked torch input; return ``(N, M)``."""
    n, m = check_torch_structure(x, divisible=divisible)
    assert isinstance(x, torch.Tensor)
    torch_finite(x)
    return n, m


def check_jax_structure(shape: Sequence[int], dtype: np.dtype[Any], *, divisible: bool = True) -> None:
    """The metadata rows of the table for a stacked ``jax.Array`` (its ``shape`` and ``dtype``).

    Reads no values, so it also checks a traced array (under ``jax.jit``).
    """
    if dtype.name not in FORMATS:
        raise _unsupported_dtype(dtype, "jax").error()
    _raise(_stacked_shape_problem(tuple(shape), divisible=divisible))


def check_numpy_structure(
    x: object, *, divisible: bool = True, what: Stacked = ALL_REDUCE_INPUT
) -> tuple[int, int]:
    """The metadata rows of the table for a stacked numpy input; return ``(N, M)``.

    ``numpy.memmap`` is accepted (it is an array on disk with the semantics of
    a plain array); other subclasses are refused, as is non-native byte order.
    """
    if not isinstance(x, np.ndarray):
        raise not_an_array(x, what).error()
    _raise(_numpy_metadata_problem(x))
    _raise(_stacked_shape_problem(x.shape, divisible=divisible, what=what))
    return int(x.shape[0]), int(x.shape[1])


def _numpy_metadata_problem(x: npt.NDArray[Any]) -> BadInput | None:
    """Subclass, byte order and dtype: the checks every numpy entry point shares."""
    if type(x) is not np.ndarray and not isinstance(x, np.memmap):
        return BadInput(
            TypeError,
            f"worker_tensors is a {type(x).__name__}, an ndarray subclass whose semantics (masks, "
            "matrix products) the ring cannot preserve. Pass a plain array: numpy.asarray(x) "
            "(or x.filled(...) for a masked array).",
        )
    if x.dtype.byteorder not in "=|" and x.dtype.newbyteorder("=") in NUMPY_DTYPES:
        return BadInput(
            TypeError,
            f"the array's byte order is the problem: dtype {x.dtype.str} is not in this machine's "
            "native byte order, and the result must keep the input's dtype. Convert first: "
            "x.astype(x.dtype.newbyteorder('=')).",
        )
    if x.dtype not in NUMPY_DTYPES:
        return _unsupported_dtype(x.dtype, "numpy")
    return None


def numpy_finite(x: npt.NDArray[Any]) -> None:
    """Raise the table's error naming the count and first index of NaN/infinity in ``x``, if any."""
    if not all(np.isfinite(block).all() for block in scan_blocks(x)):
        bad = ~np.isfinite(x).reshape(-1)
        first = int(bad.argmax())  # the first True
        raise _non_finite(int(bad.sum()), [int(v) for v in np.unravel_index(first, x.shape)]).error()


def check_numpy(x: object, *, divisible: bool = True) -> tuple[int, int]:
    """Every row of the table for a stacked numpy input; return ``(N, M)``."""
    n, m = check_numpy_structure(x, divisible=divisible)
    assert isinstance(x, np.ndarray)
    numpy_finite(x)
    return n, m


def plain_array(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """An accepted array as a plain ``numpy.ndarray`` view (a ``memmap`` loses its subclass, no copy)."""
    return np.asarray(x)


# --- the ring of ranks: (M, ...) per rank -------------------------------------------------------

_BACKEND_DEVICE = {"gloo": "cpu", "nccl": "cuda"}


def _may_overlap(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int = 1) -> bool:
    """False when no two elements of a tensor with this layout can share memory.

    Sorted by stride, each dimension must step past everything the smaller ones
    reach.  That holds for every layout made by slicing, transposing or
    permuting a dense tensor; it fails for a zero stride (``expand``) and, rarely,
    for an ``as_strided`` interleaving that does not in fact overlap.  Strides
    count elements (torch) or, with ``itemsize`` the element's size, bytes
    (numpy, whose strides may also be negative).

    >>> _may_overlap((4, 3), (3, 1)), _may_overlap((3, 4), (1, 3)), _may_overlap((4, 3), (0, 1))
    (False, False, True)
    >>> _may_overlap((4,), (-8,), 8), _may_overlap((4,), (4,), 8)
    (False, True)
    """
    reach = 0
    for stride, size in sorted(
        (abs(stride), size) for size, stride in zip(shape, strides, strict=True) if size > 1
    ):
        if stride < reach + itemsize:
            return True
        reach += stride * (size - 1)
    return False


def rank_tensor_problem(
    tensor: object, n: int, backend: str, *, finite: bool = True, divisible: bool = True, written: bool = True
) -> BadInput | None:
    """The table's verdict on one rank's ``(M, ...)`` tensor in a group of ``n`` ranks, or ``None``.

    The same messages as the simulated ring for the same problems, plus the
    two that only an in-place, per-rank call has: a layout whose elements
    share memory, and a device the backend cannot use.  ``finite=False``
    skips the value scan (the caller checks finiteness its own way);
    ``divisible=False`` (a layout other than ``even``) accepts any positive ``M``;
    ``written=False`` (a tensor only read, as a reduce-scatter's input) lets elements share memory.

    >>> rank_tensor_problem(torch.zeros(6), 3, "gloo") is None
    True
    >>> print(rank_tensor_problem(torch.zeros(5), 2, "gloo").message)  # doctest: +ELLIPSIS
    M = 5 is not divisible by N = 2, ... Pad M to a multiple of 2 (e.g. 6), or use a ring whose layout ...
    >>> rank_tensor_problem(torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), 2, "gloo").kind
    <class 'TypeError'>
    """
    if not isinstance(tensor, torch.Tensor):
        return BadInput(TypeError, f"expects a torch.Tensor of shape (M, ...); got {type(tensor).__name__}.")
    problem = _torch_metadata_problem(tensor)  # first: a nested tensor has no shape to read
    if problem is not None:
        return problem
    shape = tuple(tensor.shape)
    checks: tuple[Callable[[], BadInput | None], ...] = (
        lambda: None if shape else _ZERO_DIM,
        lambda: _rows_problem(n, shape[0], shape, divisible=divisible),
        lambda: _overlap_problem(tensor) if written else None,
        lambda: _device_problem(tensor, backend),
        lambda: _finite_problem(tensor) if finite else None,
    )
    return next((p for p in (check() for check in checks) if p is not None), None)


_ZERO_DIM = BadInput(
    ValueError, "needs a tensor of shape (M, ...) with at least 1 dimension; got a 0-d tensor."
)


def _overlap_problem(tensor: torch.Tensor) -> BadInput | None:
    if not _may_overlap(tuple(tensor.shape), tensor.stride()):
        return None
    return BadInput(
        ValueError,
        f"the sum is written in place, but the layout (strides {tensor.stride()}) lets elements share "
        "memory, as after expand(). Pass a tensor with distinct elements, e.g. t.clone().",
    )


def _device_problem(tensor: torch.Tensor, backend: str) -> BadInput | None:
    wanted = _BACKEND_DEVICE.get(backend)
    if wanted is None or tensor.device.type == wanted:
        return None
    return BadInput(
        ValueError, f"the {backend} backend needs {wanted} tensors; got a {tensor.device.type} tensor."
    )


def _finite_problem(tensor: torch.Tensor) -> BadInput | None:
    try:
        torch_finite(tensor)
    except ValueError as exc:
        return BadInput(ValueError, str(exc))
    return None


def rank_array_problem(
    array: object, n: int, *, finite: bool = True, divisible: bool = True, written: bool = True
) -> BadInput | None:
    """The table's verdict on one rank's ``(M, ...)`` numpy array in a group of ``n`` ranks, or ``None``.

    The numpy sibling of :func:`rank_tensor_problem` (``ring_ref.mpi``): the
    simulated ring's messages for the same problems, plus those of an in-place
    call (a read-only array, elements that share memory).  ``divisible=False``
    (a layout other than ``even``) accepts any positive ``M``; ``written=False`` (an array only
    read) accepts a read-only array whose elements share memory.

    >>> rank_array_problem(np.zeros(6), 3) is None
    True
    >>> print(rank_array_problem(np.zeros(5), 2).message)  # doctest: +ELLIPSIS
    M = 5 is not divisible by N = 2, ... Pad M to a multiple of 2 (e.g. 6), or use a ring whose layout ...
    """
    if not isinstance(array, np.ndarray):
        return BadInput(TypeError, f"expects a numpy.ndarray of shape (M, ...); got {type(array).__name__}.")
    shape = tuple(array.shape)
    checks: tuple[Callable[[], BadInput | None], ...] = (
        lambda: _numpy_metadata_problem(array),
        lambda: None if shape else _ZERO_DIM_ARRAY,
        lambda: _rows_problem(n, shape[0], shape, divisible=divisible),
        lambda: None if array.flags.writeable or not written else _READ_ONLY,
        lambda: _array_overlap_problem(array) if written else None,
        lambda: _array_finite_problem(array) if finite else None,
    )
    return next((p for p in (check() for check in checks) if p is not None), None)


_ZERO_DIM_ARRAY = BadInput(
    ValueError, "needs an array of shape (M, ...) with at least 1 dimension; got a 0-d array."
)
_READ_ONLY = BadInput(
    ValueError,
    "the sum is written in place, but the array is read-only (flags.writeable is False, as for "
    "numpy.broadcast_to()). Pass a writeable array, e.g. a.copy().",
)


def _array_overlap_problem(array: npt.NDArray[Any]) -> BadInput | None:
    if not _may_overlap(shape := tuple(array.shape), array.strides, array.itemsize):
        return None
    return BadInput(
        ValueError,
        f"the sum is written in place, but the layout (shape {shape}, byte strides {array.strides}) "
        "lets elements share memory, as after numpy.lib.stride_tricks.as_strided(). Pass an array "
        "with distinct elements, e.g. a.copy().",
    )


def _array_finite_problem(array: npt.NDArray[Any]) -> BadInput | None:
    try:
        numpy_finite(array)
    except ValueError as exc:
        return BadInput(ValueError, str(exc))
    return None


# --- reduce-scatter and all-gather on ranks: (output, input) -----------------------------------


def shards_problem(
    collective: str, n: int, input_shape: tuple[int, ...], output_shape: tuple[int, ...], ring: Schedule
) -> BadInput | None:
    """Whether an output of ``output_shape`` fits a reduce-scatter or all-gather of an input of
    ``input_shape`` over ``n`` ranks on ``ring`` (whose layout must cut the reduce-scatter's input,
    or the all-gather's output, into ``n`` shards of equal rows), or the table's verdict.

    >>> shards_problem("all-gather", 2, (3, 2), (6, 2), SPEC) is None
    True
    >>> print(shards_problem("reduce-scatter", 2, (3,), (1,), SPEC).message)  # doctest: +ELLIPSIS
    reduce-scatter gives every rank M / N rows, but M = 3 is not divisible by N = 2; pad M to ...
    >>> print(shards_problem("reduce-scatter", 4, (8,), (4,), SPEC).message)  # doctest: +ELLIPSIS
    the output has shape (4,); a reduce-scatter of an input of shape (8,) over N = 4 ranks gives ...
    """
    rows, rest = input_shape[0], input_shape[1:]
    if collective == "reduce-scatter" and rows % n:
        return BadInput(
            ValueError,
            f"reduce-scatter gives every rank M / N rows, but M = {rows} is not divisible by N = {n}; "
            f"pad M to a multiple of {n} (e.g. {rows + (-rows) % n}).",
        )
    shard, full = (
        ((rows // n, *rest), input_shape)
        if collective == "reduce-scatter"
        else (
            input_shape,
            (n * rows, *rest),
        )
    )
    expected = shard if collective == "reduce-scatter" else full
    if output_shape != expected:
        return BadInput(
            ValueError,
            f"the output has shape {output_shape}; {'a' if collective == 'reduce-scatter' else 'an'} "
            f"{collective} of an input of shape {input_shape} "
            f"over N = {n} ranks gives shape {expected}. Pass an output of that shape.",
        )
    numel = math.prod(full)
    sizes = [stop - start for start, stop in chunk_bounds(ring.layout, n, numel)]
    if any(size != numel // n for size in sizes):
        return BadInput(
            ValueError,
            f"the {ring.layout!r} layout cuts the {numel} elements of shape {full} into chunks of "
            f"{sizes} elements, not {n} equal shards of shape {shard}; use a ring whose layout "
            "gives equal shards here (e.g. schedule='spec' or 'openmpi-ring').",
        )
    return None


def rank_shards_problem(  # noqa: PLR0917 (the call's own arguments)
    collective: str,
    output: object,
    tensor: object,
    n: int,
    backend: str,
    ring: Schedule,
    *,
    finite: bool = True,
) -> BadInput | None:
    """The table's verdict on one rank's reduce-scatter or all-gather ``(output, input)`` tensors.

    The input is only read (its elements may share memory); a reduce-scatter's
    input must be finite (unless ``finite=False``, the caller checking that its
    own way), an all-gather's may hold anything (it is copied bit for bit).  The
    output is written: the input's dtype and device, the shape :func:`shards_problem`
    gives, distinct elements.

    >>> rank_shards_problem("all-gather", torch.zeros(4), torch.zeros(2), 2, "gloo", SPEC) is None
    True
    >>> print(rank_shards_problem("reduce-scatter", [0.0], torch.zeros(2), 2, "gloo", SPEC).message)
    output: expects a torch.Tensor; got list.
    """
    problem = rank_tensor_problem(
        tensor, n, backend, finite=finite and collective == "reduce-scatter", divisible=False, written=False
    )
    if problem is not None:
        return problem._replace(message=f"input: {problem.message}")
    assert isinstance(tensor, torch.Tensor)
    if not isinstance(output, torch.Tensor):
        return BadInput(TypeError, f"output: expects a torch.Tensor; got {type(output).__name__}.")
    if (
        output.is_nested
        or output.layout != torch.strided
        or (output.dtype, output.device)
        != (
            tensor.dtype,
            tensor.device,
        )
    ):
        return BadInput(
            TypeError,
            f"output: a {output.layout} {output.dtype} tensor on {output.device}, but the input is a "
            f"{tensor.layout} {tensor.dtype} tensor on {tensor.device}; pass a dense output of the "
            "input's dtype on its device.",
        )
    shapes = shards_problem(collective, n, tuple(tensor.shape), tuple(output.shape), ring)
    return shapes or _overlap_problem(output)


def rank_array_shards_problem(
    collective: str, output: object, array: object, n: int, ring: Schedule, *, finite: bool = True
) -> BadInput | None:
    """:func:`rank_shards_problem` for ``numpy`` arrays (``ring_ref.mpi``).

    >>> rank_array_shards_problem("all-gather", np.zeros(4), np.zeros(2), 2, SPEC) is None
    True
    """
    problem = rank_array_problem(
        array, n, finite=finite and collective == "reduce-scatter", divisible=False, written=False
    )
    if problem is not None:
        return problem._replace(message=f"input: {problem.message}")
    assert isinstance(array, np.ndarray)
    if not isinstance(output, np.ndarray):
        return BadInput(TypeError, f"output: expects a numpy.ndarray; got {type(output).__name__}.")
    if output.dtype != array.dtype:
        return BadInput(
            TypeError,
            f"output: dtype {output.dtype}, but the input's is {array.dtype}; pass an output of "
            "the input's dtype.",
        )
    shapes = shards_problem(collective, n, tuple(array.shape), tuple(output.shape), ring)
    if shapes is not None:
        return shapes
    if not output.flags.writeable:
        return _READ_ONLY._replace(message=f"output: {_READ_ONLY.message}")
    return _array_overlap_problem(output)


# --- sizes alone (traces) -----------------------------------------------------------------------


def check_ring_size(n: int, m: int, *, divisible: bool = True) -> None:
    """The table's rows for ``N`` workers of ``M`` rows, without any data (``ring-ref trace``)."""
    _raise(_rows_problem(n, m, (n, m), divisible=divisible))


# --- the schedule family (clause schedule-bad-input) ----------------------------------------------


_CHOOSE_SCHEDULE = (
    f"choose a preset ({', '.join(repr(name) for name in PRESETS)}) or a "
    "ring_ref.schedule.RingSchedule(direction, offset, layout) or ChainSchedule(layout)"
)


def _fields_problem(schedule: RingSchedule) -> BadInput | None:
    direction, offset, layout = schedule
    if isinstance(direction, bool) or not isinstance(direction, int) or direction not in (1, -1):
        return BadInput(
            ValueError,
            f"schedule direction must be +1 (worker i sends to i + 1) or -1 (to i - 1); got {direction!r}.",
        )
    if isinstance(offset, bool) or not isinstance(offset, int):
        return BadInput(TypeError, f"schedule offset must be an int (any, taken mod N); got {offset!r}.")
    if layout not in LAYOUTS:
        return BadInput(
            ValueError, f"unknown schedule layout {layout!r}; choose one of {', '.join(LAYOUTS)}."
        )
    return None


def _chain_problem(chain: ChainSchedule) -> BadInput | None:
    if chain.layout not in LAYOUTS:
        return BadInput(
            ValueError, f"unknown chain layout {chain.layout!r}; choose one of {', '.join(LAYOUTS)}."
        )
    return None


def _schedule_problem(schedule: object) -> BadInput | None:
    if isinstance(schedule, str):
        return (
            None
            if schedule in PRESETS
            else BadInput(ValueError, f"unknown schedule {schedule!r}; {_CHOOSE_SCHEDULE}.")
        )
    if isinstance(schedule, ChainSchedule):
        return _chain_problem(schedule)
    if not isinstance(schedule, RingSchedule):
        return BadInput(
            TypeError,
            f"schedule must be a preset name or a RingSchedule; got {type(schedule).__name__}; "
            f"{_CHOOSE_SCHEDULE}.",
        )
    return _fields_problem(schedule)


def schedule_of(schedule: object) -> Schedule:
    """The schedule a ``schedule=`` argument names: a preset name, a valid :class:`RingSchedule` or
    :class:`ChainSchedule`.

    >>> schedule_of("gloo")
    RingSchedule(direction=-1, offset=-1, layout='gloo')
    >>> schedule_of("ring")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown schedule 'ring'; choose a preset ('spec', 'openmpi-ring', 'gloo', 'chain') or a ...
    """
    _raise(_schedule_problem(schedule))
    if isinstance(schedule, str):
        return PRESETS[schedule]
    assert isinstance(schedule, RingSchedule | ChainSchedule)
    return SPEC if schedule == SPEC else schedule


# --- reduce-scatter and all-gather (clauses rsc-bad-input, agc-bad-input) -------------------------


def _shards_problem(n: int, shape: Sequence[int], ring: Schedule, itemsize: int) -> BadInput | None:
    """Equal shards: ``M`` divisible by ``N`` and the layout cutting a worker's ``S`` elements equally."""
    if not isinstance(ring, RingSchedule):
        return BadInput(ValueError, "reduce-scatter and all-gather run on a ring; the chain is not one.")
    m = shape[1]
    if m % n:
        return BadInput(
            ValueError,
            f"M = {m} is not divisible by N = {n}, so the {n} shards of a reduce-scatter cannot be "
            f"equal. Pad M to a multiple of {n} (e.g. {m + (-m) % n}).",
        )
    s = math.prod(shape[1:])
    bounds = chunk_bounds(ring.layout, n, s, itemsize=itemsize)
    if bounds == chunk_rows(s, n):
        return None
    sizes = ", ".join(str(hi - lo) for lo, hi in bounds)
    return BadInput(
        ValueError,
        f"the layout {ring.layout!r} cuts a worker's S = {s} elements into chunks of {sizes} for "
        f"N = {n}, so the shards would differ in shape. Use a layout that cuts them equally: "
        f"schedule=RingSchedule({ring.direction}, {ring.direction}, 'even') (or 'blocks').",
    )


def collective_input(x: object, schedule: object, what: Stacked) -> tuple[RingSchedule, int]:
    """The table's metadata rows for ``ring_reduce_scatter``'s ``x`` or ``ring_all_gather``'s ``shards``,
    and their ``schedule=``; return the ring (:func:`ring_ref.schedule.reduce_scatter_ring`) and ``N``.

    Reduce-scatter's ``(N, M, ...)`` needs ``N`` equal shards; all-gather's ``(N, S, ...)``
    any ``S``, and its gathered ``(N S, ...)`` buffer cut by the layout into the shards.
    The value scan is left to the engines (all-gather has none: it copies any bits).

    >>> collective_input(torch.ones(2, 4), None, REDUCE_SCATTER_INPUT)
    (RingSchedule(direction=1, offset=1, layout='even'), 2)
    >>> collective_input(torch.ones(4, 1), "gloo", ALL_GATHER_INPUT)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the layout 'gloo' cuts a worker's S = 4 elements into chunks of 2, 2, 0, 0 for N = 4, ...
    """
    if schedule is not None:
        _raise(_schedule_problem(schedule))
    assert schedule is None or isinstance(schedule, (str, RingSchedule))
    if isinstance(x, torch.Tensor):
        n, _ = check_torch_structure(x, divisible=False, what=what)
        itemsize = x.element_size()
    elif isinstance(x, np.ndarray):
        n, _ = check_numpy_structure(x, divisible=False, what=what)
        itemsize = x.itemsize
    else:
        raise not_an_array(x, what).error()
    ring = reduce_scatter_ring(schedule, n)
    shape = tuple(x.shape) if what != ALL_GATHER_INPUT else (n, n * x.shape[1], *x.shape[2:])
    _raise(_shards_problem(n, shape, ring, itemsize))
    return ring, n


def check_collective_size(n: int, m: int, ring: Schedule) -> None:
    """The table's rows for a reduce-scatter or all-gather of ``N`` workers of ``M`` one-element rows,
    without any data (``ring-ref trace --collective``): equal shards, ``ring``'s layout cutting them.

    >>> check_collective_size(4, 8, RingSchedule(1, 1))
    """
    _raise(_rows_problem(n, m, (n, m), divisible=False))
    _raise(_shards_problem(n, (n, m), ring, 4))
