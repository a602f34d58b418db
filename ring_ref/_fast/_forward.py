"""The fast engine's forward pass, written once for torch tensors and numpy arrays, and its front ends.

:func:`forward` is the one decision tree: unequal chunks padded to even ones,
one worker copied, the compiled kernel where the input is float32 or float64
on the CPU with one stride per element, else the batched rounds
(:mod:`ring_ref._fast._run`); the chain or a ring of the family.  What differs
between the two array types -- how a result is allocated, which view the
kernel reads, the diagonal views of the batched path, the combine, the tile
budget, the finiteness reduction, numpy's floating-point error state -- is an
:class:`Arrays` value: :data:`TORCH` or :data:`NUMPY`.

**float32 and float64 on the CPU: one compiled pass** (:mod:`ring_ref._fast._kernel`,
through :func:`fold` and :func:`chain_fold`).  Every element's fold runs in
machine code over cache-sized tiles, the input read once, on up to
``torch.get_num_threads()`` threads; each op's kernel is compiled on its
first use.  This covers every layout whose ``(M, ...)`` part is one stride
apart per element (:func:`element_stride`: contiguous, sliced, transposed,
expanded workers, negative numpy strides).

Finiteness (clause ``bad-input``) is checked on the result rather than the
input where that proves anything, for torch and numpy inputs alike (see
:mod:`ring_ref._fast._run`).  ``max`` and ``min`` drop a NaN (and ``max`` a
``-inf``) met as the own operand, so for them the kernel checks every input
element as it reads it, and the batched path reduces the whole input once.
Only a result not proven finite -- or, rarely, a finite one whose sum
overflows -- pays for the exact input scan (:mod:`ring_ref._validate`) that
tells bad input from a sum or product that overflowed to ``±inf`` (or a
product ``inf * 0``), which is the correctly rounded result (clause
``input-finite``).

Autograd is supported for ``sum`` and ``avg`` (``prod``, ``max`` and ``min`` on
a tensor that needs a graph or a tangent are refused with a ``ValueError``
pointing to the reference engine, which differentiates them; under
``torch.func.vmap`` alone they run), and so are ``torch.func``
transforms (``grad``, ``vmap``, ``jvp``, ``jacrev``, ``jacfwd``, ``hessian``): for a tensor that
records a graph, carries a tangent or is a ``torch.func`` wrapper, the
computation runs inside a :class:`torch.autograd.Function` (elsewhere it
skips the Function's per-call cost) whose backward passes the output gradient to
every worker unchanged -- what the reference's chain of additions gives, bit
for bit -- whose forward-mode derivative is the same ring over the tangents,
and whose ``vmap`` rule treats the batch as one more trailing dimension.  The
result never is a view, so in-place operations on it work.

>>> import torch
>>> ring_all_reduce_torch(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
tensor([4., 6.])
>>> ring_all_reduce_torch(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), op="max")
tensor([3., 4.])
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from types import ModuleType
from typing import Any, Final, Generic, TypeVar

import numpy as np
import numpy.typing as npt
import torch
from torch._C._functorch import is_functorch_wrapped_tensor
from torch.autograd import forward_ad

from ring_ref import _validate
from ring_ref._chunks import chunk_bounds
from ring_ref._fast._plan import Cycle, chain_fold_order, plan
from ring_ref._fast._run import (
    batch_tile,
    chain_batched,
    numpy_all_finite,
    result_proves_finite,
    run_rounds,
    torch_all_finite,
)
from ring_ref._ops import Op, finish_numpy, finish_torch, numpy_combine_out, torch_combine_out
from ring_ref.schedule import SPEC, ChainSchedule, DoublingSchedule, Layout, RingSchedule, Schedule

TILE_BYTES = 2 << 20
"""Bytes of partial sums per CPU tile on the batched path with torch operations (see ``make bench``)."""

NUMPY_TILE_BYTES = 256 << 10
"""The same with numpy operations, whose lower per-call cost makes smaller tiles pay."""

KERNEL_DTYPES: Final = (torch.float32, torch.float64)
"""The dtypes the compiled kernel adds natively; float16 and bfloat16 take the batched path."""

A = TypeVar("A", torch.Tensor, npt.NDArray[Any])
Array = npt.NDArray[Any]


class Arrays(Generic[A]):
    """What :func:`forward` does differently for one array type: allocating, viewing, combining, checking."""

    def prepare(self, x: A) -> A:
        """The input as the forward pass reads it (a tensor detached from its graph)."""
        raise NotImplementedError

    def new(self, like: A, shape: tuple[int, ...], *, zeros: bool = False) -> A:
        """A new array of ``like``'s dtype (and device), uninitialised or zeros."""
        raise NotImplementedError

    def itemsize(self, x: A) -> int:
        raise NotImplementedError

    def index(self, columns: npt.NDArray[np.int64]) -> Any:
        """``columns`` as an index of this array type."""
        raise NotImplementedError

    def copy(self, out: A, value: A) -> None:
        raise NotImplementedError

    def kernel_input(self, x: A) -> Array | None:
        """The ``(N, L)`` numpy view of ``x`` (``N >= 2``) the compiled kernel reads, or ``None`` where it
        cannot: a dtype other than float32 and float64, another device, no one stride per element,
        unaligned data."""
        raise NotImplementedError

    def as_numpy(self, result: A) -> Array:
        """The contiguous ``result`` as a numpy array sharing its memory, for the kernel to write."""
        raise NotImplementedError

    def diagonal(self, x: A, k: int, trailing: tuple[int, ...]) -> Callable[[int, int, int], A]:
        """``diagonal(offset, start, stop)``: the view of ``x[c + offset, c]`` (chunks of ``k`` rows) for
        the chunks ``start .. stop - 1``, as :func:`ring_ref._fast._run.run_rounds` reads them."""
        raise NotImplementedError

    def tile_budget(self, x: A) -> int | None:
        """Bytes of partial sums per tile of the batched path (``None``: one tile)."""
        raise NotImplementedError

    def combine(self, op: Op) -> Callable[[A, A, A], object]:
        raise NotImplementedError

    def all_finite(self, block: A) -> bool:
        raise NotImplementedError

    def quiet(self) -> contextlib.AbstractContextManager[object]:
        """The floating-point error state of the batched combines."""
        raise NotImplementedError


class _Torch(Arrays[torch.Tensor]):
    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach()

    def new(self, like: torch.Tensor, shape: tuple[int, ...], *, zeros: bool = False) -> torch.Tensor:
        return like.new_zeros(shape) if zeros else like.new_empty(shape)

    def itemsize(self, x: torch.Tensor) -> int:
        return x.element_size()

    def index(self, columns: npt.NDArray[np.int64]) -> Any:
        return torch.from_numpy(columns)

    def copy(self, out: torch.Tensor, value: torch.Tensor) -> None:
        out.copy_(value)

    def kernel_input(self, x: torch.Tensor) -> Array | None:
        inner = 1 if x.is_contiguous() else element_stride(x.shape, x.stride())
        if x.is_cpu and x.dtype in KERNEL_DTYPES and inner is not None:
            n, m = x.shape[0], x.shape[1]
            flat = x.as_strided((n, m * math.prod(x.shape[2:])), (x.stride(0), inner)).numpy()
            flat.flags.writeable = False
            if flat.flags.aligned:
                return flat
        return None

    def as_numpy(self, result: torch.Tensor) -> Array:
        return result.numpy()

    def diagonal(
        self, x: torch.Tensor, k: int, trailing: tuple[int, ...]
    ) -> Callable[[int, int, int], torch.Tensor]:
        s_worker, s_row, *s_trailing = x.stride()
        base = x.storage_offset()

        def diagonal(offset: int, start: int, stop: int) -> torch.Tensor:
            return x.as_strided(
                (stop - start, k, *trailing),
                (s_worker + k * s_row, s_row, *s_trailing),
                base + (start + offset) * s_worker + start * k * s_row,
            )

        return diagonal

    def tile_budget(self, x: torch.Tensor) -> int | None:
        return TILE_BYTES if x.is_cpu else None

    def combine(self, op: Op) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]:
        return torch_combine_out(op)

    def all_finite(self, block: torch.Tensor) -> bool:
        return torch_all_finite(block)

    def quiet(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()


class _Numpy(Arrays[Array]):
    def prepare(self, x: Array) -> Array:
        return x

    def new(self, like: Array, shape: tuple[int, ...], *, zeros: bool = False) -> Array:
        return np.zeros(shape, dtype=like.dtype) if zeros else np.empty(shape, dtype=like.dtype)

    def itemsize(self, x: Array) -> int:
        return x.itemsize

    def index(self, columns: npt.NDArray[np.int64]) -> Any:
        return columns

    def copy(self, out: Array, value: Array) -> None:
        out[...] = value

    def kernel_input(self, x: Array) -> Array | None:
        whole = all(s % x.itemsize == 0 for s in x.strides)
        strides = [s // x.itemsize for s in x.strides] if whole else None
        inner = None if strides is None else element_stride(x.shape, strides)
        if x.dtype.isnative and x.dtype in (np.float32, np.float64) and inner is not None and x.flags.aligned:
            return np.lib.stride_tricks.as_strided(
                x, (x.shape[0], x[0].size), (x.strides[0], inner * x.itemsize), writeable=False
            )
        return None

    def as_numpy(self, result: Array) -> Array:
        return result

    def diagonal(self, x: Array, k: int, trailing: tuple[int, ...]) -> Callable[[int, int, int], Array]:
        s_worker, s_row, *s_trailing = x.strides

        def diagonal(offset: int, start: int, stop: int) -> Array:
            return np.lib.stride_tricks.as_strided(
                x[start + offset, start * k :],
                (stop - start, k, *trailing),
                (s_worker + k * s_row, s_row, *s_trailing),
                writeable=False,
            )

        return diagonal

    def tile_budget(self, x: Array) -> int | None:
        return NUMPY_TILE_BYTES

    def combine(self, op: Op) -> Callable[[Array, Array, Array], object]:
        return numpy_combine_out(op)

    def all_finite(self, block: Array) -> bool:
        return numpy_all_finite(block)

    def quiet(self) -> contextlib.AbstractContextManager[object]:
        # Overflow to +-inf (and underflow) is the correctly rounded result (clause input-finite), not an
        # error; an invalid operation (inf - inf, 0 * inf) only happens on non-finite input, which is
        # rejected after the pass, or on a product that overflowed, whose NaN is the result.
        return np.errstate(over="ignore", under="ignore", invalid="ignore")


TORCH: Final[Arrays[torch.Tensor]] = _Torch()
NUMPY: Final[Arrays[Array]] = _Numpy()


def forward(arrays: Arrays[A], x: A, ring: Schedule, op: Op) -> tuple[A, bool]:
    """The ring's fold for an array that passed the structure check, and whether the input is proven
    finite (``avg``: the sum, not yet divided).

    The result is an array of its own, never a view (autograd allows in-place
    operations on it).
    """
    if isinstance(ring, DoublingSchedule) or (not isinstance(ring, ChainSchedule) and ring.layout != "even"):
        return (
            _doubling(arrays, x, ring, op)
            if isinstance(ring, DoublingSchedule)
            else _uneven(arrays, x, ring, op)
        )
    n, m = x.shape[0], x.shape[1]
    k = m // n
    trailing: tuple[int, ...] = tuple(x.shape[2:])
    x = arrays.prepare(x)
    result = arrays.new(x, (m, *trailing))
    if n == 1:
        arrays.copy(result, x[0])
        return result, arrays.all_finite(result)
    flat = arrays.kernel_input(x)
    if flat is not None:
        out = arrays.as_numpy(result).reshape(-1)
        if isinstance(ring, ChainSchedule):
            return result, chain_fold(flat, out, chain_fold_order(n, ring), op)
        return result, fold(flat, out, plan(n, ring).cycle, op)
    on_result = result_proves_finite(op)
    if isinstance(ring, ChainSchedule):
        with arrays.quiet():
            chain_batched(x, result, chain_fold_order(n, ring), arrays.combine(op))
        return result, arrays.all_finite(result if on_result else x)
    tile = batch_tile(n, k, math.prod(trailing) * arrays.itemsize(x), arrays.tile_budget(x))
    with arrays.quiet():
        finite = run_rounds(
            plan(n, ring).rounds,
            result.reshape(n, k, *trailing),
            diagonal=arrays.diagonal(x, k, trailing),
            combine=arrays.combine(op),
            all_finite=arrays.all_finite if on_result else None,
            tile=tile,
        )
    return result, finite if on_result else arrays.all_finite(x)


def _doubling(arrays: Arrays[A], x: A, doubling: DoublingSchedule, op: Op) -> tuple[A, bool]:
    """Recursive doubling's one tree over whole buffers (clause ``doubling-order``): the pre-step's pairs
    ``x_{2j} ∘ x_{2j+1}``, then the new ranks' values combined pairwise, the lower first, ``log2 P``
    times; one combine over the whole buffer per node of the tree."""
    n = x.shape[0]
    x = arrays.prepare(x)
    combine = arrays.combine(op)
    shape = tuple(x.shape[1:])
    _, rem = doubling.powers(n)
    values = [x[doubling.old_rank(v, n)] for v in range(n - rem)]
    with arrays.quiet():
        for j in range(rem):
            values[j] = arrays.new(x, shape)
            combine(x[2 * j], x[2 * j + 1], values[j])
        while len(values) > 1:
            pairs = []
            for lower, upper in zip(values[::2], values[1::2], strict=True):
                out = arrays.new(x, shape)
                combine(lower, upper, out)
                pairs.append(out)
            values = pairs
    result = arrays.new(x, shape)
    arrays.copy(result, values[0])
    return result, arrays.all_finite(result if result_proves_finite(op) else x)


def _uneven(arrays: Arrays[A], x: A, ring: RingSchedule, op: Op) -> tuple[A, bool]:
    """Unequal chunks (layouts ``blocks``, ``gloo``) run as even ones: each padded to the longest.

    Worker ``i``'s elements (row-major) are cut at the layout's bounds and chunk
    ``c`` is copied to columns ``c K .. c K + size - 1`` of an ``(N, N K)`` buffer,
    ``K`` the longest chunk, zeros elsewhere; the even path folds every column
    of chunk ``c`` in chunk ``c``'s order, so each real element gets exactly its
    own chunk's combines, and the padding is dropped.  Where every element is
    already in its column (gloo's layout: full chunks, then one partial, then
    empty ones), the kernel folds the chunks holding elements in place (:func:`_leading_chunks`).
    """
    n, shape = x.shape[0], tuple(x.shape[1:])
    flat = arrays.prepare(x).reshape(n, -1)
    k, at = _padded_columns(ring.layout, n, flat.shape[1], arrays.itemsize(x))
    even = ring._replace(layout="even")
    view = arrays.kernel_input(flat) if at is None and n > 1 else None
    if view is not None:
        result = arrays.new(flat, shape)
        return result, _leading_chunks(view, arrays.as_numpy(result).reshape(-1), even, op, k)
    columns = np.arange(flat.shape[1]) if at is None else at
    padded = arrays.new(flat, (n, n * k), zeros=True)
    padded[:, arrays.index(columns)] = flat
    out, finite = forward(arrays, padded, even, op)
    return out[arrays.index(columns.reshape(shape))], finite  # gathered in its shape: not a view


def _leading_chunks(x2d: Array, out: Array, ring: RingSchedule, op: Op, k: int) -> bool:
    """The kernel's fold of ``x2d`` (``(N, L)``) into ``out`` (``(L,)``), its elements the chunks ``0 ..
    C - 1`` of ``k`` (``C = ceil(L / k)``), the last one perhaps partial; the empty chunks after them cost
    nothing.  A partial last chunk is padded: the input is copied to ``C k`` columns, zeros after ``L``."""
    n, length = x2d.shape
    width = -(-length // k) * k
    if width == length:
        return fold(x2d, out, plan(n, ring).cycle, op, chunk_size=k)
    padded = np.zeros((n, width), dtype=x2d.dtype)
    padded[:, :length] = x2d
    whole = np.empty(width, dtype=out.dtype)
    finite = fold(padded, whole, plan(n, ring).cycle, op, chunk_size=k)
    out[...] = whole[:length]
    return finite


@lru_cache(maxsize=16)
def _padded_columns(
    layout: Layout, n: int, m: int, itemsize: int
) -> tuple[int, npt.NDArray[np.int64] | None]:
    """:func:`_uneven`'s padding: the longest chunk ``K`` and, per element ``j`` (in chunk ``c`` at
    ``lo``), its column ``c K + j - lo`` of the padded buffer (one gather instead of a copy per chunk);
    ``None`` where that is ``j`` for every element."""
    bounds = np.array(chunk_bounds(layout, n, m, itemsize=itemsize), dtype=np.int64).reshape(n, 2)
    sizes = bounds[:, 1] - bounds[:, 0]
    k = max(1, int(sizes.max()))
    chunk = np.repeat(np.arange(n, dtype=np.int64), sizes)
    columns = chunk * k + np.arange(m, dtype=np.int64) - np.repeat(bounds[:, 0], sizes)
    return k, None if bool((columns == np.arange(m)).all()) else columns


# --- the compiled kernel ---------------------------------------------------------------------------

_kernel_module: ModuleType | None = None


def _kernel() -> ModuleType:
    """:mod:`ring_ref._fast._kernel`, imported on first use (it imports llvmlite, LLVM itself)."""
    global _kernel_module  # noqa: PLW0603 - a lazily imported module
    if _kernel_module is None:
        from ring_ref._fast import _kernel as module

        _kernel_module = module
    return _kernel_module


def element_stride(shape: Sequence[int], strides: Sequence[int]) -> int | None:
    """The one stride that steps through a worker's ``(M, ...)`` elements in order, or ``None``.

    ``shape`` and ``strides`` are the whole ``(N, M, ...)`` input's.  Size-1
    dimensions do not count; any stride (zero, negative) is fine as long as each
    dimension steps over exactly the one inside it.

    >>> element_stride((4, 8, 3), (24, 3, 1)), element_stride((4, 8, 3), (24, 1, 8))
    (1, None)
    """
    dims = [(size, stride) for size, stride in zip(shape[1:], strides[1:], strict=True) if size != 1]
    if not dims:
        return 1
    inner = expected = dims[-1][1]
    for size, stride in reversed(dims):
        if stride != expected:
            return None
        expected = stride * size
    return inner


def fold(x2d: Array, out: Array, cycle: Cycle, op: Op, chunk_size: int | None = None) -> bool:
    """The compiled fold of ``x2d`` (``(N, M ...)`` flattened to two axes) into ``out`` (flat).

    ``out`` holds the ``N`` chunks, or with ``chunk_size`` the first ``out.size / chunk_size`` of them.
    ``avg`` folds the sum (the caller divides).  Returns whether the input is proven finite.
    """
    n = x2d.shape[0]
    return bool(
        _kernel().fold_chunks(
            x2d,
            out,
            cycle.order,
            cycle.entries,
            chunk_size=out.size // n if chunk_size is None else chunk_size,
            threads=torch.get_num_threads(),
            op="sum" if op == "avg" else op,
        )
    )


def chain_fold(x2d: Array, out: Array, order: tuple[int, ...], op: Op) -> bool:
    """The chain's fold (``order`` for every element) of ``x2d`` (``(N, L)``) into ``out`` (flat), compiled.

    Every element folds alike, so the first ``N K`` elements (``K = L // N``) go
    through :func:`fold` as ``N`` chunks of ``K`` that all enter the cycle
    ``order`` at its start, and the last ``L mod N`` through one batched
    combine per worker.  Returns whether the input is proven finite.
    """
    n, length = x2d.shape
    split = length - length % n
    entries = np.array([[c, c + 1, 0] for c in range(n)], dtype=np.int64)  # every chunk enters at order[0]
    cycle = Cycle(np.array(order, dtype=np.int64), entries)
    finite = fold(x2d[:, :split], out[:split], cycle, op) if split else True
    if split == length:
        return finite
    rest = out[split:]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        chain_batched(x2d[:, split:], rest, order, numpy_combine_out(op))
    return finite and numpy_all_finite(rest if result_proves_finite(op) else x2d[:, split:])


# --- the front ends ------------------------------------------------------------------------------


class _RingSum(torch.autograd.Function):
    """Autograd for the fast engine's sum: every worker's gradient is the output gradient, unchanged.

    ``apply(x, check, ring)``: ``check`` says whether a result that is not all
    finite needs the input scan (``bad-input``); tangents are not inputs and
    are not checked; ``ring`` is the ring of the schedule family to run.
    """

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        x, check, ring = args
        result, finite = forward(TORCH, x, ring, "sum")
        if check and not finite:
            _validate.torch_finite(x)
        return result

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.workers = inputs[0].shape[0]
        ctx.ring = inputs[2]

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        (grad,) = grad_outputs
        return grad.unsqueeze(0).expand(ctx.workers, *grad.shape), None, None

    @staticmethod
    def jvp(ctx: Any, *grad_inputs: Any) -> Any:
        # The same ring over the tangents; through apply, so a torch.func tangent is unwrapped first.
        tangent = grad_inputs[0]
        return _ring_sum(tangent, False, ctx.ring)

    @staticmethod
    def vmap(info: Any, in_dims: Any, *args: Any) -> Any:
        # Elements are reduced independently: the batch is one more trailing dimension.
        x, check, ring = args
        if in_dims[0] is None:
            return _ring_sum(x, check, ring), None
        return _ring_sum(x.movedim(in_dims[0], -1), check, ring), -1


_ring_sum: Callable[[torch.Tensor, bool, Schedule], torch.Tensor] = _RingSum.apply
"""``_RingSum.apply`` with its type stated (torch leaves it untyped)."""


_unpack_dual: Callable[[torch.Tensor], Any] = forward_ad.unpack_dual
"""``forward_ad.unpack_dual`` with its type stated (torch leaves it untyped)."""


def _differentiable(x: torch.Tensor) -> bool:
    """Whether ``x`` needs :class:`_RingSum`: it records a graph, carries a tangent, or is a ``torch.func``
    wrapper (``grad``, ``vmap``, ``jvp``), whose values only the Function's unwrapped inputs expose."""
    return (
        (x.requires_grad and torch.is_grad_enabled())
        or is_functorch_wrapped_tensor(x)
        or _unpack_dual(x).tangent is not None
    )


DIFFERENTIABLE_OPS: Final[tuple[Op, ...]] = ("sum", "avg")
"""The ops the fast engine differentiates: a sum passes the output gradient to every worker unchanged
(``avg`` then divides it by ``N``, as the reference does).  ``prod``, ``max`` and ``min`` on a tensor that
records a graph or carries a tangent are refused (use the reference engine); under ``torch.func.vmap``
alone they run (:class:`_RingOp`)."""


def not_differentiable(op: Op) -> ValueError:
    """The error for ``op`` on a tensor the fast engine would have to differentiate."""
    return ValueError(
        f"engine='fast' differentiates op='sum' and op='avg' only; op={op!r} on a tensor that requires "
        "grad (or carries a forward-mode tangent, or is the input of torch.func.grad, jvp, jacrev, ...) "
        "runs on engine='reference' (the default), which records the ring's graph for every op; or "
        "detach the input, or call under torch.no_grad()."
    )


class _RingOp(torch.autograd.Function):
    """``prod``, ``max`` and ``min`` on a ``torch.func`` wrapper: ``vmap`` works (the batch is one more
    trailing dimension), derivatives are refused with :func:`not_differentiable`.

    ``apply(x, check, ring, op)`` as :class:`_RingSum`'s, with the op.
    """

    @staticmethod
    def forward(*args: Any, **kwargs: Any) -> Any:
        x, check, ring, op = args
        result, finite = forward(TORCH, x, ring, op)
        if check and not finite:
            _validate.torch_finite(x)
        return result

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.op = inputs[3]

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> Any:
        raise not_differentiable(ctx.op)

    @staticmethod
    def jvp(ctx: Any, *grad_inputs: Any) -> Any:
        raise not_differentiable(ctx.op)

    @staticmethod
    def vmap(info: Any, in_dims: Any, *args: Any) -> Any:
        x, check, ring, op = args
        if in_dims[0] is None:
            return _ring_op(x, check, ring, op), None
        return _ring_op(x.movedim(in_dims[0], -1), check, ring, op), -1


_ring_op: Callable[[torch.Tensor, bool, Schedule, Op], torch.Tensor] = _RingOp.apply
"""``_RingOp.apply`` with its type stated."""


def ring_all_reduce_torch(x: torch.Tensor, op: Op = "sum", ring: Schedule = SPEC) -> torch.Tensor:
    """The fast engine on a ``torch.Tensor`` of shape ``(N, M, ...)``; returns ``(M, ...)``.

    ``op``: the reduction (clauses ``op-*``), ``sum`` by default; ``ring``: a ring of the schedule
    family (clause ``schedule-fold-order``) or the chain, the spec's ring by default.
    """
    _validate.check_torch_structure(x, divisible=ring.layout == "even")
    n = x.shape[0]
    if _differentiable(x):  # the Functions check finiteness inside, on the unwrapped input
        if op in DIFFERENTIABLE_OPS:
            return finish_torch(op, _ring_sum(x, True, ring), n)
        if x.requires_grad and torch.is_grad_enabled():
            raise not_differentiable(op)
        # vmap works; a forward-mode tangent (torch.func.jvp, jacfwd, a dual tensor, batched or not)
        # reaches the Function's jvp rule, which refuses it
        return _ring_op(x, True, ring, op)
    result, finite = forward(TORCH, x, ring, op)
    if not finite:
        _validate.torch_finite(x)
    return finish_torch(op, result, n)


def ring_all_reduce_numpy(x: npt.NDArray[Any], op: Op = "sum", ring: Schedule = SPEC) -> npt.NDArray[Any]:
    """The fast engine on a ``numpy.ndarray`` of shape ``(N, M, ...)``; returns ``(M, ...)``."""
    _validate.check_numpy_structure(x, divisible=ring.layout == "even")
    x = _validate.plain_array(x)
    result, finite = forward(NUMPY, x, ring, op)
    if not finite:
        _validate.numpy_finite(x)
    return finish_numpy(op, result, x.shape[0])


def ring_reduce_scatter_torch(x: torch.Tensor, op: Op, ring: RingSchedule) -> torch.Tensor:
    """Reduce-scatter on the fast engine: ``(N, M, ...)`` to ``(N, M / N, ...)`` (clause ``rs-ag-theorem``).

    For a ring with ``k = d`` rank ``r``'s shard is chunk ``r``'s fold, which is
    also chunk ``r`` of that ring's all-reduce (proved in ``make prove``); the
    plan computes every chunk's fold once, so the shards are the all-reduce's
    result cut into its ``N`` chunks.  ``ring``'s layout cuts equal chunks
    (:func:`ring_ref._validate.collective_input`), which are the even layout's.
    """
    n = x.shape[0]
    result = ring_all_reduce_torch(x, op, ring._replace(layout="even"))
    return result.reshape(n, x.shape[1] // n, *x.shape[2:])


def ring_reduce_scatter_numpy(x: npt.NDArray[Any], op: Op, ring: RingSchedule) -> npt.NDArray[Any]:
    """:func:`ring_reduce_scatter_torch` for numpy arrays."""
    n = x.shape[0]
    result = ring_all_reduce_numpy(x, op, ring._replace(layout="even"))
    return result.reshape(n, x.shape[1] // n, *x.shape[2:])


def ring_all_gather_torch(shards: torch.Tensor) -> torch.Tensor:
    """All-gather on the fast engine: one copy of the ``(N, S, ...)`` shards as ``(N S, ...)`` (``agc-copy``).

    Every ring with ``k = d`` delivers rank ``r``'s shard, unchanged, to slot
    ``r`` of every rank (proved in ``make prove``), so the gathered buffer is
    the shards in rank order whatever the ring; ``clone`` keeps every bit and
    the autograd graph.
    """
    gathered = shards.clone(memory_format=torch.contiguous_format)
    return gathered.reshape(shards.shape[0] * shards.shape[1], *shards.shape[2:])


def ring_all_gather_numpy(shards: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """:func:`ring_all_gather_torch` for numpy arrays (a C-ordered copy, never a view of the input)."""
    gathered = np.array(_validate.plain_array(shards), order="C", copy=True)
    return gathered.reshape(shards.shape[0] * shards.shape[1], *shards.shape[2:])
