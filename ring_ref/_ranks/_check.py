"""The check before a ring of processes: every rank refuses bad input with the same exception.

``ring_ref.distributed`` (torch.distributed) and ``ring_ref.mpi`` (mpi4py) run
one check.  Each rank judges its own arguments by the table
(:mod:`ring_ref._ranks._rules`) and condenses them into a fixed-size signature
of integers (the same on every rank for the same arguments: :func:`code`,
:func:`shape_words`); one small collective tells every rank whether every
signature is its own and every rank is clean.  Only when not do the ranks
exchange :class:`Description` records, from which every rank words the same
error (:func:`verdict`).  The two runtimes differ only in what a rank passes
(torch tensors with an op, or numpy arrays: :data:`TENSORS`, :data:`ARRAYS`)
and in how the ranks exchange (an :class:`Exchange`).

>>> shape_words((4, 3), 12, exact_dims=3)
[2, 12, 4, 3, -1, 0]
>>> code("float32") == code("float32") != code("float64")
True
"""

from __future__ import annotations

import functools
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, Protocol

import numpy as np
import torch

from ring_ref._ops import Op, op_name
from ring_ref._ranks._rules import (
    rank_array_problem,
    rank_array_shards_problem,
    rank_shards_problem,
    rank_tensor_problem,
)
from ring_ref._validate import BadInput, schedule_of
from ring_ref.schedule import (
    SPEC,
    ChainSchedule,
    Collective,
    RingSchedule,
    Schedule,
    preset_schedule,
    reduce_scatter_ring,
)

__all__ = [
    "ARRAYS",
    "EXACT_DIMS",
    "SHARDS_KEYS",
    "TENSORS",
    "TENSOR_SIGNATURE_LENGTH",
    "Description",
    "Exchange",
    "Shards",
    "Wording",
    "array_signature",
    "call_key",
    "check_everywhere",
    "code",
    "describe_array",
    "describe_tensor",
    "problem_of",
    "refuse_everywhere",
    "ring_for",
    "ring_of",
    "schedule_key",
    "shape_words",
    "tensor_metadata",
    "tensor_signature",
    "values_finite",
    "verdict",
]

_HASH_MODULUS: Final = (1 << 61) - 1


@dataclass(frozen=True)
class Description:
    """What one rank passed, as exchanged after a mismatch; ``problem`` is its local verdict."""

    summary: str
    signature: tuple[object, ...]
    problem: tuple[str, str] | None  # (exception kind, message)


def ring_of(name: object) -> tuple[Schedule | None, BadInput | None]:
    """The schedule (a ring, the chain or recursive doubling) a ``schedule=`` argument names, or the table's
    verdict on it."""
    try:
        return schedule_of(name), None
    except (TypeError, ValueError) as exc:
        return None, BadInput(type(exc), str(exc))


def schedule_key(ring: Schedule | None, n: int) -> str:
    """The same text on every rank for the same schedule (offsets taken mod ``n``)."""
    return "invalid" if ring is None else ring.normalized(n).describe()


class Shards(NamedTuple):
    """The arguments of a reduce-scatter or an all-gather on one rank, which the check validates
    together (where an all-reduce's check validates its one tensor or array)."""

    collective: Collective
    output: object
    input: object


def ring_for(args: object, name: object, n: int) -> tuple[Schedule | None, BadInput | None]:
    """The ring a call runs, or the table's verdict on ``name``: :func:`ring_of` for an all-reduce,
    :func:`ring_ref.schedule.reduce_scatter_ring` for :class:`Shards` (whose ``None`` is ``"spec"``).

    >>> ring_for(Shards(Collective.REDUCE_SCATTER, None, None), None, 4)[0]
    RingSchedule(direction=1, offset=1, layout='even')
    >>> print(ring_for(Shards(Collective.ALL_GATHER, None, None), RingSchedule(1, 0, "even"), 4)[1].message)
    ... # doctest: +ELLIPSIS
    reduce-scatter and all-gather leave chunk r at rank r, ... RingSchedule(1, 1, 'even') ...
    """
    if not isinstance(args, Shards):
        ring, bad = ring_of(name)
        if ring is not None and isinstance(name, str) and isinstance(args, torch.Tensor | np.ndarray):
            size = args.numel() if isinstance(args, torch.Tensor) else args.size  # nested: no shape, a numel
            ring = preset_schedule(name, n, size)  # a preset by name: what its library runs at this size
        return ring, bad
    ring, bad = ring_of("spec" if name is None else name)
    if ring is None:
        return None, bad
    try:
        named = ring if isinstance(name, RingSchedule | ChainSchedule) else str(name or "spec")
        return reduce_scatter_ring(named, n), None
    except ValueError as exc:
        return None, BadInput(ValueError, str(exc))


SHARDS_KEYS: Final = tuple(f"{c} " for c in Collective if c.alone)
"""How :func:`call_key` starts for a reduce-scatter and an all-gather."""


def call_key(args: object, ring: Schedule | None, n: int) -> str:
    """:func:`schedule_key`, after the collective's name for :class:`Shards`: calls of different
    collectives have different keys, so the check refuses them."""
    key = schedule_key(ring, n)
    return f"{args.collective} schedule {key}" if isinstance(args, Shards) else key


def problem_of(bad: BadInput | None) -> tuple[str, str] | None:
    """A verdict as :attr:`Description.problem`: the exception's kind and its message."""
    return None if bad is None else (bad.kind.__name__, bad.message.rstrip("."))


@functools.cache
def code(text: str) -> int:
    """A name as a number, the same in every process (``hash`` of a str is salted per process)."""
    return zlib.crc32(text.encode())


EXACT_DIMS: Final = 8
"""How many leading dimensions a signature's shape words hold exactly (the rest are hashed)."""


def shape_words(shape: tuple[int, ...], count: int, *, exact_dims: int = EXACT_DIMS) -> list[int]:
    """A shape as ``exact_dims + 3`` integers: its length, ``count`` (the element count), the first
    ``exact_dims`` dimensions exactly (``-1`` past the end) and a 61-bit hash of the rest."""
    rest = 0
    for d in shape[exact_dims:]:
        rest = (rest * 1_000_003 + d + 1) % _HASH_MODULUS
    return [len(shape), count, *shape[:exact_dims], *([-1] * (exact_dims - len(shape))), rest]


def verdict(descriptions: Sequence[Description], *, call: str, things: str, same: str) -> Exception | None:
    """The one exception every rank raises for these descriptions, or ``None`` if all is well.

    A rank's own problem comes first (every rank with one is named); otherwise
    differing signatures are refused, listing every rank's ``summary``:
    ``call`` names the function, ``things`` what the ranks passed, and ``same``
    what must agree.

    >>> good, other = Description("shape (2,)", ((2,),), None), Description("shape (3,)", ((3,),), None)
    >>> verdict([good, good], call="f", things="arrays", same="shape") is None
    True
    >>> print(verdict([good, other], call="f", things="arrays", same="x"))  # doctest: +NORMALIZE_WHITESPACE
    f rejected the input on every rank: the ranks passed different arrays (rank 0: shape (2,);
    rank 1: shape (3,)). Every rank must pass the same x.
    """
    prefix = f"{call} rejected the input on every rank"
    failures = [(r, d.problem) for r, d in enumerate(descriptions) if d.problem is not None]
    if failures:
        kind = TypeError if failures[0][1][0] == "TypeError" else ValueError
        lines = "; ".join(f"rank {r}: {problem[1]}" for r, problem in failures)
        return kind(f"{prefix}: {lines}.")
    if len({d.signature for d in descriptions}) > 1:
        listing = "; ".join(f"rank {r}: {d.summary}" for r, d in enumerate(descriptions))
        return ValueError(
            f"{prefix}: the ranks passed different {things} ({listing}). "
            f"Every rank must pass the same {same}."
        )
    return None


class Wording(NamedTuple):
    """How :func:`verdict` names what a runtime's ranks pass (``things``) and what must be ``same``."""

    things: str
    same: str

    def verdict(
        self, descriptions: Sequence[Description], call: str = "ring_all_reduce_"
    ) -> Exception | None:
        """:func:`verdict` in these words."""
        return verdict(descriptions, call=call, things=self.things, same=self.same)


TENSORS: Final = Wording(
    "tensors, ops or schedules", "shape, dtype and device type, the same op and the same schedule"
)
"""``ring_ref.distributed``'s ranks pass tensors, an op and a schedule."""
ARRAYS: Final = Wording("arrays", "shape and dtype, and the same schedule")
"""``ring_ref.mpi``'s ranks pass numpy arrays and a schedule."""


class Exchange(Protocol):
    """How a runtime's ranks tell each other their part of the check: the one thing that torch's
    process groups and MPI's communicators do differently."""

    def agree(self, signature: list[int], clean: bool) -> bool:
        """Whether every rank's signature is ``signature`` and every rank is clean (one small collective)."""
        ...

    def descriptions(self, mine: Description) -> list[Description]:
        """Every rank's description, in rank order (after a disagreement)."""
        ...


def refuse_everywhere(exchange: Exchange, mine: Description, wording: Wording, call: str) -> None:
    """Exchange full descriptions and raise the one error they call for, the same on every rank."""
    error = wording.verdict(exchange.descriptions(mine), call)
    if error is not None:
        raise error


def check_everywhere(  # noqa: PLR0917 (the check's own parts)
    exchange: Exchange,
    signature: list[int],
    clean: bool,
    describe: Callable[[], Description],
    wording: Wording,
    call: str,
) -> None:
    """Raise the same bad-input error on every rank, or return on every rank: one small collective,
    and only on a disagreement the exchange of descriptions (``describe()``, this rank's)."""
    if not exchange.agree(signature, clean):
        refuse_everywhere(exchange, describe(), wording, call)


# --- torch tensors (ring_ref.distributed) ---------------------------------------------------------

TENSOR_SIGNATURE_LENGTH: Final = 6 + EXACT_DIMS + 3
"""Entries of a tensor's signature (17)."""


def _op_problem(op: object) -> tuple[Op | None, BadInput | None]:
    """The op by its name, or the table's error for one that is not an op."""
    try:
        return op_name(op), None
    except ValueError as exc:
        return None, BadInput(ValueError, str(exc))


def _tensor_problem(
    tensor: object, n: int, backend: str, ring: Schedule, *, finite: bool = True
) -> BadInput | None:
    """The table's verdict on one rank's tensor (or :class:`Shards`) for ``ring`` (only ``even`` needs
    ``N`` to divide ``M``)."""
    if isinstance(tensor, Shards):
        return rank_shards_problem(
            tensor.collective, tensor.output, tensor.input, n, backend, ring, finite=finite
        )
    return rank_tensor_problem(tensor, n, backend, finite=finite, divisible=ring.layout == "even")


def describe_tensor(
    tensor: object, n: int, backend: str, op: object = "sum", name: object = "spec"
) -> Description:
    """Check one rank's arguments on their own; the verdict is applied on every rank after the exchange.

    >>> TENSORS.verdict([describe_tensor(torch.zeros(6), 3, "gloo")] * 3) is None
    True
    >>> bad = TENSORS.verdict([describe_tensor(torch.zeros(6), 3, "gloo"), describe_tensor([0.0], 3, "gloo")])
    >>> print(bad)  # doctest: +ELLIPSIS
    ring_all_reduce_ rejected the input on every rank: rank 1: expects a torch.Tensor ...; got list.
    >>> print(TENSORS.verdict([describe_tensor(torch.zeros(6), 3, "gloo", name=s) for s in ("spec", "gloo")]))
    ... # doctest: +ELLIPSIS
    ring_all_reduce_ rejected ... (rank 0: ... on cpu; rank 1: ... cpu, schedule direction -1, offset 2, ...
    """
    reduce_op, op_bad = _op_problem(op)
    ring, ring_bad = ring_for(tensor, name, n)
    bad = ring_bad or (None if ring is None else _tensor_problem(tensor, n, backend, ring)) or op_bad
    problem = problem_of(bad)
    key = call_key(tensor, ring, n)
    if isinstance(tensor, Shards):
        tensor = tensor.input
    if not isinstance(tensor, torch.Tensor):
        kind = type(tensor).__name__
        return Description(kind, (kind, key), problem)
    shape = tuple(tensor.shape)
    summary = f"shape {shape} {tensor.dtype} on {tensor.device.type}"
    if reduce_op != "sum":
        summary += f", op {reduce_op or op!r}"
    if key != schedule_key(SPEC, n):
        summary += f", {'' if key.startswith(SHARDS_KEYS) else 'schedule '}{key}"
    signature = (shape, str(tensor.dtype), tensor.device.type, reduce_op, key)
    return Description(summary, signature, problem)


def tensor_metadata(
    tensor: object, n: int, backend: str, op: object = "sum", name: object = "spec"
) -> tuple[list[int], bool]:
    """This rank's fixed-size signature, and whether its arguments pass every row of the table but
    finiteness (which reads the values; :func:`tensor_signature` adds it)."""
    reduce_op, op_bad = _op_problem(op)
    ring, _ = ring_for(tensor, name, n)
    key = code(call_key(tensor, ring, n))
    args, tensor = tensor, tensor.input if isinstance(tensor, Shards) else tensor
    if not isinstance(tensor, torch.Tensor) or tensor.is_nested or op_bad or ring is None:
        return [0, code(type(tensor).__name__), key, *[0] * (TENSOR_SIGNATURE_LENGTH - 3)], False
    signature = [
        1,
        code(str(tensor.dtype)),
        code(tensor.device.type),
        code(str(tensor.layout)),
        *shape_words(tuple(tensor.shape), tensor.numel(), exact_dims=EXACT_DIMS),
        code(str(reduce_op)),
        key,
    ]
    return signature, _tensor_problem(args, n, backend, ring, finite=False) is None


def values_finite(tensor: torch.Tensor | Shards, n: int, backend: str, ring: Schedule) -> bool:
    """Whether every value of a tensor that passed the other rows is finite, at the cost of one sum.

    A NaN or infinity anywhere makes the sum non-finite; only then (or when finite
    values overflow the sum) are the elements scanned.  An all-gather copies any value.
    """
    if isinstance(tensor, Shards) and tensor.collective.gathers:
        return True
    values = tensor.input if isinstance(tensor, Shards) else tensor
    assert isinstance(values, torch.Tensor)
    total = (values.detach() if values.requires_grad else values).sum().item()
    return math.isfinite(total) or _tensor_problem(tensor, n, backend, ring) is None


def tensor_signature(
    tensor: object, n: int, backend: str, op: object = "sum", name: object = "spec"
) -> tuple[list[int], bool]:
    """This rank's fixed-size signature and whether its arguments are clean, at the cost of one sum.

    Equal signatures mean equal kind, dtype, device type, layout and shape
    (exactly for up to :data:`EXACT_DIMS` dimensions, by a 61-bit hash of
    the rest beyond), op and ring (offsets taken mod ``n``).

    >>> sign = tensor_signature
    >>> a, ok = sign(torch.zeros(6, 2), 3, "gloo")
    >>> ok, a == sign(torch.ones(6, 2), 3, "gloo")[0], a == sign(torch.zeros(6), 3, "gloo")[0]
    (True, True, False)
    >>> sign(torch.tensor([1.0, float("nan"), 0.0]), 3, "gloo")[1]
    False
    >>> a == sign(torch.zeros(6, 2), 3, "gloo", name=RingSchedule(1, 3, "even"))[0]
    True
    >>> a == sign(torch.zeros(6, 2), 3, "gloo", name="openmpi-ring")[0]
    False
    """
    signature, sound = tensor_metadata(tensor, n, backend, op, name)
    if not sound:
        return signature, False
    ring, _ = ring_for(tensor, name, n)
    assert isinstance(tensor, (torch.Tensor, Shards)) and ring is not None
    return signature, values_finite(tensor, n, backend, ring)


# --- numpy arrays (ring_ref.mpi) ------------------------------------------------------------------

_ARRAY_SIGNATURE_LENGTH: Final = 5 + EXACT_DIMS + 1


def _array_problem(array: object, n: int, name: object, *, finite: bool = True) -> BadInput | None:
    """The table's verdict on one rank's array (or :class:`Shards`)."""
    ring, bad = ring_for(array, name, n)
    if ring is None:
        return bad
    if isinstance(array, Shards):
        return rank_array_shards_problem(array.collective, array.output, array.input, n, ring, finite=finite)
    return rank_array_problem(array, n, finite=finite, divisible=ring.layout == "even")


def _array_key(array: object, name: object, n: int) -> str:
    """The same text on every rank for the same collective and ring (offsets taken mod ``n``)."""
    return call_key(array, ring_for(array, name, n)[0], n)


def describe_array(array: object, n: int, name: object = "spec") -> Description:
    """Check one rank's array on its own; the verdict is applied on every rank after the exchange.

    >>> ARRAYS.verdict([describe_array(np.zeros(6), 3)] * 3) is None
    True
    >>> print(ARRAYS.verdict([describe_array(np.zeros(6), 3), describe_array([0.0], 3)]))
    ... # doctest: +ELLIPSIS
    ring_all_reduce_ rejected the input on every rank: rank 1: expects a numpy.ndarray ...; got list.
    >>> print(ARRAYS.verdict([describe_array(np.zeros(6), 3), describe_array(np.zeros(3), 3)]))
    ... # doctest: +ELLIPSIS
    ring_all_reduce_ rejected ...: the ranks passed different arrays (rank 0: shape (6,) float64, schedule ...
    """
    bad = _array_problem(array, n, name)
    problem = problem_of(bad)
    key = _array_key(array, name, n)
    if isinstance(array, Shards):
        array = array.input
    if not isinstance(array, np.ndarray):
        kind = type(array).__name__
        return Description(f"{kind}, schedule {key}", (kind, key), problem)
    summary = f"shape {array.shape} {array.dtype}, schedule {key}"
    return Description(summary, (array.shape, array.dtype.str, key), problem)


def array_signature(array: object, n: int, name: object = "spec") -> tuple[list[int], bool]:
    """This rank's fixed-size signature and whether its array is clean, at the cost of one sum.

    The signature covers the kind, dtype, shape (the first :data:`EXACT_DIMS`
    dimensions exactly, a hash of the rest) and the schedule.

    >>> a, ok = array_signature(np.zeros((6, 2)), 3)
    >>> ok, a == array_signature(np.ones((6, 2)), 3)[0], a == array_signature(np.zeros(6), 3)[0]
    (True, True, False)
    >>> array_signature(np.array([1.0, np.nan, 0.0]), 3)[1]
    False
    """
    key = code(_array_key(array, name, n))
    args, array = array, array.input if isinstance(array, Shards) else array
    if not isinstance(array, np.ndarray):
        return [0, code(type(array).__name__), key, *[0] * (_ARRAY_SIGNATURE_LENGTH - 3)], False
    words = shape_words(tuple(array.shape), array.size, exact_dims=EXACT_DIMS)
    signature = [1, code(array.dtype.str), key, *words]
    if _array_problem(args, n, name, finite=False) is not None:
        return signature, False
    if isinstance(args, Shards) and args.collective.gathers:
        return signature, True  # a copy: any value
    with np.errstate(over="ignore", invalid="ignore"):
        total_finite = bool(np.isfinite(np.add.reduce(array, axis=None)))
    return signature, total_finite or _array_problem(args, n, name) is None
