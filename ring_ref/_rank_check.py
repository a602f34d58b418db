"""The pieces of the check before a multi-process ring that do not depend on the transport.

``ring_ref.distributed`` (torch.distributed) and ``ring_ref.mpi`` (mpi4py) both
refuse bad input with the same exception on every rank: each rank condenses its
arguments into a fixed-size signature of integers (the same on every rank for
the same arguments: :func:`code`, :func:`shape_words`), and only when the
signatures differ do the ranks exchange :class:`Description` records, from
which every rank words the same error (:func:`verdict`).

>>> shape_words((4, 3), 12, exact_dims=3)
[2, 12, 4, 3, -1, 0]
>>> code("float32") == code("float32") != code("float64")
True
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from ring_ref._validate import BadInput, schedule_of
from ring_ref.schedule import (
    ALL_GATHER,
    REDUCE_SCATTER,
    ChainSchedule,
    Phase,
    RingSchedule,
    Schedule,
    reduce_scatter_ring,
)

__all__ = [
    "EXACT_DIMS",
    "SHARDS_KEYS",
    "Description",
    "Shards",
    "call_key",
    "code",
    "problem_of",
    "ring_for",
    "ring_of",
    "schedule_key",
    "shape_words",
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
    """The schedule (a ring or the chain) a ``schedule=`` argument names, or the table's verdict on it."""
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

    collective: Phase
    output: object
    input: object


def ring_for(args: object, name: object, n: int) -> tuple[Schedule | None, BadInput | None]:
    """The ring a call runs, or the table's verdict on ``name``: :func:`ring_of` for an all-reduce,
    :func:`ring_ref.schedule.reduce_scatter_ring` for :class:`Shards` (whose ``None`` is ``"spec"``).

    >>> ring_for(Shards(REDUCE_SCATTER, None, None), None, 4)[0]
    RingSchedule(direction=1, offset=1, layout='even')
    >>> print(ring_for(Shards(ALL_GATHER, None, None), RingSchedule(1, 0, "even"), 4)[1].message)
    ... # doctest: +ELLIPSIS
    reduce-scatter and all-gather leave chunk r at rank r, ... RingSchedule(1, 1, 'even') ...
    """
    if not isinstance(args, Shards):
        return ring_of(name)
    ring, bad = ring_of("spec" if name is None else name)
    if ring is None:
        return None, bad
    try:
        named = ring if isinstance(name, RingSchedule | ChainSchedule) else str(name or "spec")
        return reduce_scatter_ring(named, n), None
    except ValueError as exc:
        return None, BadInput(ValueError, str(exc))


SHARDS_KEYS: Final = (f"{REDUCE_SCATTER} ", f"{ALL_GATHER} ")
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
