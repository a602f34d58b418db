"""The spec's ``bad-input`` table, for every entry point: one check and one message per problem.

The simulated ring (both engines, torch and numpy) and the trace tool ask
this module, and the rings of ranks build their per-rank rows
(:mod:`ring_ref._ranks._rules`) on its messages; the same problem gets the
same message wherever it is met.  Checks that read only metadata (type, layout, dtype,
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
from collections.abc import Iterator, Sequence
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
    DoublingSchedule,
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
    "numpy_metadata_problem",
    "plain_array",
    "rows_problem",
    "scan_blocks",
    "schedule_of",
    "torch_finite",
    "torch_metadata_problem",
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


def rows_problem(
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
    return rows_problem(shape[0], shape[1], shape, divisible=divisible, rows=what.rows)


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


def torch_metadata_problem(x: torch.Tensor) -> BadInput | None:
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
    _raise(torch_metadata_problem(x))
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
    _raise(numpy_metadata_problem(x))
    _raise(_stacked_shape_problem(x.shape, divisible=divisible, what=what))
    return int(x.shape[0]), int(x.shape[1])


def numpy_metadata_problem(x: npt.NDArray[Any]) -> BadInput | None:
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


# --- sizes alone (traces) -----------------------------------------------------------------------


def check_ring_size(n: int, m: int, *, divisible: bool = True) -> None:
    """The table's rows for ``N`` workers of ``M`` rows, without any data (``ring-ref trace``)."""
    _raise(rows_problem(n, m, (n, m), divisible=divisible))


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


def _chain_problem(chain: ChainSchedule | DoublingSchedule) -> BadInput | None:
    if chain.layout not in LAYOUTS:
        what = "chain" if isinstance(chain, ChainSchedule) else "recursive doubling"
        return BadInput(
            ValueError, f"unknown {what} layout {chain.layout!r}; choose one of {', '.join(LAYOUTS)}."
        )
    return None


def _schedule_problem(schedule: object) -> BadInput | None:
    if isinstance(schedule, str):
        return (
            None
            if schedule in PRESETS
            else BadInput(ValueError, f"unknown schedule {schedule!r}; {_CHOOSE_SCHEDULE}.")
        )
    if isinstance(schedule, ChainSchedule | DoublingSchedule):
        return _chain_problem(schedule)
    if not isinstance(schedule, RingSchedule):
        return BadInput(
            TypeError,
            f"schedule must be a preset name or a RingSchedule; got {type(schedule).__name__}; "
            f"{_CHOOSE_SCHEDULE}.",
        )
    return _fields_problem(schedule)


def schedule_of(schedule: object) -> Schedule:
    """The schedule a ``schedule=`` argument names: a preset name, a valid :class:`RingSchedule`,
    :class:`ChainSchedule` or :class:`DoublingSchedule`.

    >>> schedule_of("gloo")
    RingSchedule(direction=-1, offset=-1, layout='gloo')
    >>> schedule_of("ring")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown schedule 'ring'; choose a preset ('spec', 'openmpi-ring', 'gloo', 'chain', ...) or ...
    """
    _raise(_schedule_problem(schedule))
    if isinstance(schedule, str):
        return PRESETS[schedule]
    assert isinstance(schedule, RingSchedule | ChainSchedule | DoublingSchedule)
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
    _raise(rows_problem(n, m, (n, m), divisible=False))
    _raise(_shards_problem(n, (n, m), ring, 4))
