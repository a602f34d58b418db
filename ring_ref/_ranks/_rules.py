"""The spec's ``bad-input`` table for one rank of a ring of processes: its own ``(M, ...)`` tensor or
array, or a reduce-scatter's or all-gather's ``(output, input)`` pair.

The same messages as the simulated ring (:mod:`ring_ref._validate`) for the same
problems, plus those only an in-place call on one rank has: elements that share
memory, a read-only array, a device the backend cannot use.  The torch rows serve
``ring_ref.distributed``, the numpy rows ``ring_ref.mpi``; both runtimes' check
before the ring (:mod:`ring_ref._ranks._check`) asks them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ring_ref._chunks import chunk_bounds
from ring_ref._validate import (
    BadInput,
    numpy_finite,
    numpy_metadata_problem,
    rows_problem,
    torch_finite,
    torch_metadata_problem,
)
from ring_ref.schedule import Collective, Schedule

__all__ = [
    "rank_array_problem",
    "rank_array_shards_problem",
    "rank_shards_problem",
    "rank_tensor_problem",
    "shards_problem",
]

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
    problem = torch_metadata_problem(tensor)  # first: a nested tensor has no shape to read
    if problem is not None:
        return problem
    shape = tuple(tensor.shape)
    checks: tuple[Callable[[], BadInput | None], ...] = (
        lambda: None if shape else _ZERO_DIM,
        lambda: rows_problem(n, shape[0], shape, divisible=divisible),
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
        lambda: numpy_metadata_problem(array),
        lambda: None if shape else _ZERO_DIM_ARRAY,
        lambda: rows_problem(n, shape[0], shape, divisible=divisible),
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
    collective: Collective,
    n: int,
    input_shape: tuple[int, ...],
    output_shape: tuple[int, ...],
    ring: Schedule,
) -> BadInput | None:
    """Whether an output of ``output_shape`` fits a reduce-scatter or all-gather of an input of
    ``input_shape`` over ``n`` ranks on ``ring`` (whose layout must cut the reduce-scatter's input,
    or the all-gather's output, into ``n`` shards of equal rows), or the table's verdict.

    >>> from ring_ref.schedule import SPEC, Collective
    >>> shards_problem(Collective.ALL_GATHER, 2, (3, 2), (6, 2), SPEC) is None
    True
    >>> print(shards_problem(Collective.REDUCE_SCATTER, 2, (3,), (1,), SPEC).message)  # doctest: +ELLIPSIS
    reduce-scatter gives every rank M / N rows, but M = 3 is not divisible by N = 2; pad M to ...
    >>> print(shards_problem(Collective.REDUCE_SCATTER, 4, (8,), (4,), SPEC).message)  # doctest: +ELLIPSIS
    the output has shape (4,); a reduce-scatter of an input of shape (8,) over N = 4 ranks gives ...
    """
    rows, rest = input_shape[0], input_shape[1:]
    if collective.scatters and rows % n:
        return BadInput(
            ValueError,
            f"reduce-scatter gives every rank M / N rows, but M = {rows} is not divisible by N = {n}; "
            f"pad M to a multiple of {n} (e.g. {rows + (-rows) % n}).",
        )
    shard, full = (
        ((rows // n, *rest), input_shape)
        if collective.scatters
        else (
            input_shape,
            (n * rows, *rest),
        )
    )
    expected = shard if collective.scatters else full
    if output_shape != expected:
        return BadInput(
            ValueError,
            f"the output has shape {output_shape}; {'a' if collective.scatters else 'an'} "
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
    collective: Collective,
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

    >>> from ring_ref.schedule import SPEC, Collective
    >>> rank_shards_problem(Collective.ALL_GATHER, torch.zeros(4), torch.zeros(2), 2, "gloo", SPEC) is None
    True
    >>> print(rank_shards_problem(Collective.REDUCE_SCATTER, [0.0], torch.zeros(2), 2, "gloo", SPEC).message)
    output: expects a torch.Tensor; got list.
    """
    problem = rank_tensor_problem(
        tensor, n, backend, finite=finite and collective.scatters, divisible=False, written=False
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
    collective: Collective, output: object, array: object, n: int, ring: Schedule, *, finite: bool = True
) -> BadInput | None:
    """:func:`rank_shards_problem` for ``numpy`` arrays (``ring_ref.mpi``).

    >>> from ring_ref.schedule import SPEC, Collective
    >>> rank_array_shards_problem(Collective.ALL_GATHER, np.zeros(4), np.zeros(2), 2, SPEC) is None
    True
    """
    problem = rank_array_problem(
        array, n, finite=finite and collective.scatters, divisible=False, written=False
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
