"""The ring schedule as pure index math: no tensors, no buffers.

Every function here is a closed form from the spec (``spec/ring_all_reduce.md``, ``spec/schedules.md``); the
clause each one implements is named in its docstring.  Workers and chunks are
numbered ``0 .. n-1``; rounds of each phase are numbered ``0 .. n-2``.

>>> [rs_send_chunk(i, 0, 4) for i in range(4)]
[0, 1, 2, 3]
>>> [ag_send_chunk(i, 0, 4) for i in range(4)]
[1, 2, 3, 0]
>>> for s in sends(REDUCE_SCATTER, 1, 3):
...     print(s)
Send(phase='reduce-scatter', round=1, src=0, dst=1, chunk=2)
Send(phase='reduce-scatter', round=1, src=1, dst=2, chunk=0)
Send(phase='reduce-scatter', round=1, src=2, dst=0, chunk=1)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal, NamedTuple

__all__ = [
    "ALL_GATHER",
    "ALL_REDUCE",
    "BELOW_N",
    "CHAIN",
    "COLLECTIVES",
    "GLOO",
    "INTEL_RING",
    "LAYOUTS",
    "MLX_RING",
    "MPICH_RING",
    "OPENMPI_RING",
    "PHASES",
    "PRESETS",
    "RECURSIVE_DOUBLING",
    "REDUCE_SCATTER",
    "SPEC",
    "ChainSchedule",
    "Collective",
    "CollectiveName",
    "DoublingSchedule",
    "Layout",
    "Phase",
    "RingSchedule",
    "Schedule",
    "Send",
    "ag_recv_chunk",
    "ag_send_chunk",
    "all_rounds",
    "elements_sent_per_worker",
    "left",
    "owned_chunk",
    "preset_schedule",
    "reduce_scatter_ring",
    "right",
    "rounds_per_phase",
    "rs_recv_chunk",
    "rs_send_chunk",
    "send_chunk",
    "sends",
]


Phase = Literal["reduce-scatter", "all-gather"]
REDUCE_SCATTER: Final = "reduce-scatter"
ALL_GATHER: Final = "all-gather"
PHASES: Final[tuple[Phase, Phase]] = (REDUCE_SCATTER, ALL_GATHER)
CollectiveName = Literal["all-reduce", "reduce-scatter", "all-gather"]
ALL_REDUCE: Final = "all-reduce"
COLLECTIVES: Final[tuple[CollectiveName, CollectiveName, CollectiveName]] = (
    ALL_REDUCE,
    REDUCE_SCATTER,
    ALL_GATHER,
)
"""The collectives' names: both phases (all-reduce), or one alone (``spec/reduce_scatter_all_gather.md``).

The one owner of the names that ``ring-ref trace``, ``difftest`` and ``reveal`` take as ``--collective``."""


class Collective(StrEnum):
    """A collective as a value: the one place its name is compared (``spec/reduce_scatter_all_gather.md``).

    ``Collective(name)`` reads a name (``ValueError`` if it is none of :data:`COLLECTIVES`) and
    returns a value unchanged; a value is its name wherever a string is (printed, in JSON, compared),
    so the public functions keep taking the names.  The facts every layer shares are here (the
    phases, the shapes, the option that names it); the layers above hold their own part (the
    reference function, the oracle, the report's wording) in tables keyed by the value
    (``docs/architecture.md``, *Collectives*).

    >>> c = Collective("reduce-scatter")
    >>> c is Collective.REDUCE_SCATTER, c.phases, f"{c}", c.result_shape(2, 4, (3,)), c.option
    (True, ('reduce-scatter',), 'reduce-scatter', (2, 2, 3), ' --collective reduce-scatter')
    """

    ALL_REDUCE = ALL_REDUCE
    REDUCE_SCATTER = REDUCE_SCATTER
    ALL_GATHER = ALL_GATHER

    @property
    def phases(self) -> tuple[Phase, ...]:
        """The phases it runs: both (all-reduce), or its own alone."""
        return PHASES if self is Collective.ALL_REDUCE else (REDUCE_SCATTER if self.scatters else ALL_GATHER,)

    @property
    def alone(self) -> bool:
        """One phase alone: reduce-scatter or all-gather, per rank ``TARGET(output, input)``."""
        return self is not Collective.ALL_REDUCE

    @property
    def scatters(self) -> bool:
        """Reduce-scatter: rank ``r`` ends with chunk ``r`` of the reduction, ``M / N`` rows."""
        return self is Collective.REDUCE_SCATTER

    @property
    def gathers(self) -> bool:
        """All-gather: every rank ends with every shard, each bit copied, no op applied."""
        return self is Collective.ALL_GATHER

    @property
    def reduces(self) -> bool:
        """Whether it applies an op: all-reduce and reduce-scatter; all-gather only copies."""
        return not self.gathers

    @property
    def option(self) -> str:
        """The command-line words that name it, ``""`` for the default (all-reduce), else with a space
        first: `` --collective reduce-scatter``."""
        return f" --collective {self}" if self.alone else ""

    def result_shape(
        self, n: int, m: int, trailing: tuple[int, ...], rank: int | None = None
    ) -> tuple[int, ...]:
        """The shape of its result on an input of shape ``(N, M, *trailing)`` (for all-gather ``M`` is
        the shard's rows ``S``): stacked (``rank`` ``None``) or of one rank.

        >>> [c.result_shape(2, 4, (3,), 1) for c in Collective]
        [(4, 3), (2, 3), (8, 3)]
        """
        if self.scatters:
            shard = (m // n, *trailing)
            return shard if rank is not None else (n, *shard)
        if self.gathers:
            return (n * m, *trailing)
        return (m, *trailing)


class Send(NamedTuple):
    """One transfer: in ``round`` of ``phase``, ``src`` sends slot ``chunk`` to ``dst``."""

    phase: Phase
    round: int
    src: int
    dst: int
    chunk: int


def right(i: int, n: int) -> int:
    """The worker that ``i`` sends to (clause ``ring-topology``).

    >>> right(3, 4)
    0
    """
    return (i + 1) % n


def left(i: int, n: int) -> int:
    """The worker that ``i`` receives from (clause ``ring-topology``).

    >>> left(0, 4)
    3
    """
    return (i - 1) % n


def rounds_per_phase(n: int) -> int:
    """``n - 1`` rounds in each phase; none at all when ``n == 1`` (``n1-no-rounds``).

    >>> rounds_per_phase(1), rounds_per_phase(5)
    (0, 4)
    """
    return n - 1


def rs_send_chunk(i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` sends in reduce-scatter round ``r`` (``rs-send-chunk``)."""
    return (i - r) % n


def rs_recv_chunk(i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` receives (and adds into) in reduce-scatter round ``r``."""
    return rs_send_chunk(left(i, n), r, n)


def ag_send_chunk(i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` sends in all-gather round ``r`` (``ag-send-chunk``)."""
    return (i + 1 - r) % n


def ag_recv_chunk(i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` receives (and copies into) in all-gather round ``r``."""
    return ag_send_chunk(left(i, n), r, n)


def send_chunk(phase: Phase, i: int, r: int, n: int) -> int:
    """The chunk worker ``i`` sends in round ``r`` of ``phase``."""
    if phase == REDUCE_SCATTER:
        return rs_send_chunk(i, r, n)
    return ag_send_chunk(i, r, n)


def owned_chunk(i: int, n: int) -> int:
    """The chunk worker ``i`` holds complete after reduce-scatter (``rs-owned-chunk``).

    >>> [owned_chunk(i, 4) for i in range(4)]
    [1, 2, 3, 0]
    """
    return (i + 1) % n


def sends(phase: Phase, r: int, n: int) -> tuple[Send, ...]:
    """All ``n`` transfers of round ``r`` of ``phase``, ordered by sender."""
    return tuple(Send(phase, r, i, right(i, n), send_chunk(phase, i, r, n)) for i in range(n))


def all_rounds(n: int) -> tuple[tuple[Phase, int], ...]:
    """Every ``(phase, round)`` pair in execution order: ``2 (n - 1)`` of them.

    >>> all_rounds(3)
    (('reduce-scatter', 0), ('reduce-scatter', 1), ('all-gather', 0), ('all-gather', 1))
    """
    return tuple((phase, r) for phase in PHASES for r in range(rounds_per_phase(n)))


def elements_sent_per_worker(n: int, s: int) -> int:
    """Elements one worker transmits over the whole run: ``2 (n-1) s / n`` (``traffic``).

    ``s`` is the number of elements each worker holds; it must be a multiple of ``n``.

    >>> elements_sent_per_worker(2, 2)
    2
    """
    return 2 * rounds_per_phase(n) * (s // n)


# --- The ring schedule family (clauses schedule-family, schedule-presets) ----------------------------

Layout = Literal["even", "blocks", "gloo", "ceil", "floor"]
"""How a worker's elements are cut into the ``n`` chunks (:func:`ring_ref._chunks.chunk_bounds`)."""

LAYOUTS: Final[tuple[Layout, ...]] = ("even", "blocks", "gloo", "ceil", "floor")


class RingSchedule(NamedTuple):
    """One ring of the family: direction ``d``, offset ``k`` and chunk layout (``schedule-family``).

    Worker ``i`` sends to worker ``i + d``; the fold of chunk ``c`` starts at
    worker ``c + k`` and visits ``c + k, c + k + d, c + k + 2d, ...`` (mod ``n``).
    The spec's ring is ``RingSchedule(1, 0, "even")`` (:data:`SPEC`), whose
    methods agree with the module-level functions above on every input.  The
    entry points (``ring_all_reduce(x, schedule=...)``) check a schedule with
    :func:`ring_ref._validate.schedule_of`; the methods assume ``d`` is ``+1`` or ``-1``.

    >>> GLOO.fold_order(0, 4)
    (3, 2, 1, 0)
    >>> [GLOO.rs_send_chunk(i, 0, 4) for i in range(4)], [GLOO.owned_chunk(i, 4) for i in range(4)]
    ([1, 2, 3, 0], [0, 1, 2, 3])
    """

    direction: int = 1
    offset: int = 0
    layout: Layout = "even"

    def right(self, i: int, n: int) -> int:
        """The worker that ``i`` sends to: ``i + d``."""
        return (i + self.direction) % n

    def left(self, i: int, n: int) -> int:
        """The worker that ``i`` receives from: ``i - d``."""
        return (i - self.direction) % n

    def fold_start(self, c: int, n: int) -> int:
        """The worker whose chunk ``c`` starts the fold: ``c + k``."""
        return (c + self.offset) % n

    def fold_order(self, c: int, n: int) -> tuple[int, ...]:
        """The workers whose chunks ``c`` are added, in order (``schedule-fold-order``)."""
        return tuple((c + self.offset + j * self.direction) % n for j in range(n))

    def position(self, i: int, c: int, n: int) -> int:
        """How many steps along chunk ``c``'s fold worker ``i`` stands: ``((i - c - k) d) mod n``."""
        return ((i - c - self.offset) * self.direction) % n

    def rs_send_chunk(self, i: int, r: int, n: int) -> int:
        """The chunk worker ``i`` sends in reduce-scatter round ``r``: ``i - k - r d``."""
        return (i - self.offset - r * self.direction) % n

    def rs_recv_chunk(self, i: int, r: int, n: int) -> int:
        """The chunk worker ``i`` receives (and adds into) in reduce-scatter round ``r``."""
        return self.rs_send_chunk(self.left(i, n), r, n)

    def owned_chunk(self, i: int, n: int) -> int:
        """The chunk worker ``i`` holds complete after reduce-scatter: ``i - k - (n - 1) d``."""
        return (i - self.offset - (n - 1) * self.direction) % n

    def ag_send_chunk(self, i: int, r: int, n: int) -> int:
        """The chunk worker ``i`` sends in all-gather round ``r``: the one owned by ``i - r d``."""
        return self.owned_chunk((i - r * self.direction) % n, n)

    def ag_recv_chunk(self, i: int, r: int, n: int) -> int:
        """The chunk worker ``i`` receives (and copies into) in all-gather round ``r``."""
        return self.ag_send_chunk(self.left(i, n), r, n)

    def send_chunk(self, phase: Phase, i: int, r: int, n: int) -> int:
        """The chunk worker ``i`` sends in round ``r`` of ``phase``."""
        if phase == REDUCE_SCATTER:
            return self.rs_send_chunk(i, r, n)
        return self.ag_send_chunk(i, r, n)

    def recv_chunk(self, phase: Phase, i: int, r: int, n: int) -> int:
        """The chunk worker ``i`` receives in round ``r`` of ``phase``."""
        return self.send_chunk(phase, self.left(i, n), r, n)

    def sends(self, phase: Phase, r: int, n: int) -> tuple[Send, ...]:
        """All ``n`` transfers of round ``r`` of ``phase``, ordered by sender."""
        return tuple(Send(phase, r, i, self.right(i, n), self.send_chunk(phase, i, r, n)) for i in range(n))

    def all_rounds(self, n: int) -> tuple[tuple[Phase, int], ...]:
        """Every ``(phase, round)`` pair in execution order (:func:`all_rounds`)."""
        return all_rounds(n)

    def normalized(self, n: int) -> RingSchedule:
        """The same ring for ``n`` workers with the offset in ``0 .. n - 1``.

        >>> GLOO.normalized(4)
        RingSchedule(direction=-1, offset=3, layout='gloo')
        """
        return self._replace(offset=self.offset % n)

    def describe(self) -> str:
        """``direction -1, offset -1, layout gloo``.

        >>> SPEC.describe()
        'direction +1, offset 0, layout even'
        """
        return f"direction {self.direction:+d}, offset {self.offset}, layout {self.layout}"


SPEC: Final = RingSchedule(1, 0, "even")
"""The spec's ring (the default): ``d = +1``, ``k = 0``, ``M / N`` rows per chunk."""

OPENMPI_RING: Final = RingSchedule(1, 0, "blocks")
"""OpenMPI's ring allreduce (``coll_tuned_allreduce_algorithm`` 4): the spec's fold on OpenMPI's blocks."""

GLOO: Final = RingSchedule(-1, -1, "gloo")
"""gloo's ring allreduce (``torch.distributed`` on the gloo backend): the ring run the other way."""

MPICH_RING: Final = RingSchedule(1, 1, "ceil")
"""MPICH's ring allreduce (``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM=ring``): chunk ``c`` folds from worker
``c + 1``, on ``ceil(S / N)``-element chunks."""

MLX_RING: Final = RingSchedule(-1, 0, "ceil")
"""MLX's ring all-reduce (``mx.distributed.all_sum``, ring backend, below ``2 N 256 KiB`` per rank, where it
runs one ring): rank ``i`` sends to ``i - 1`` and chunk ``c`` folds from worker ``c`` down, on
``ceil(S / N)``-element chunks.  Past that size MLX runs two rings, one per half, in opposite directions
(no preset names it; ``docs/guide/ranks.md``)."""

INTEL_RING: Final = RingSchedule(1, 0, "floor")
"""Intel MPI's ring allreduce (``I_MPI_ADJUST_ALLREDUCE=8``): the spec's fold on ``floor(S / N)``-element
chunks, the rest on the last."""


# --- The chain (clauses chain-*): not a ring ------------------------------------------------------


class ChainSchedule(NamedTuple):
    """The chain: every segment folds over the workers ``0, 1, ..., n - 1``, whatever ``M`` (``chain-order``).

    It is not a ring of the family.  Each worker's elements are cut into ``n``
    segments under ``layout`` (``blocks`` by default, so any ``M`` works).
    Phase ``reduce-scatter`` is a pipelined chain reduce: in step ``t`` worker
    ``i < n - 1`` sends segment ``t - i`` (its partial sum ``x_0 + ... + x_i``)
    to worker ``i + 1``, which adds its own segment to it; worker ``n - 1``
    ends with every segment complete.  Phase ``all-gather`` is a pipelined
    broadcast along ``n - 1 -> 0 -> 1 -> ... -> n - 2``: worker ``i`` stands at
    position ``p = (i + 1) mod n`` and in step ``t`` forwards segment
    ``t - p``.  Each phase has ``2 n - 2`` steps (``chain-steps``); a worker
    with nothing to send or receive in a step idles.

    >>> CHAIN.fold_order(2, 4)
    (0, 1, 2, 3)
    >>> [CHAIN.send_segment(REDUCE_SCATTER, i, 1, 3) for i in range(3)]
    [1, 0, None]
    >>> for s in CHAIN.sends(ALL_GATHER, 0, 3):
    ...     print(s)
    Send(phase='all-gather', round=0, src=2, dst=0, chunk=0)
    """

    layout: Layout = "blocks"

    def right(self, i: int, n: int) -> int:
        """The worker that ``i`` sends to: ``i + 1`` (``n - 1`` sends to ``0`` in the broadcast only)."""
        return (i + 1) % n

    def left(self, i: int, n: int) -> int:
        """The worker that ``i`` receives from: ``i - 1``."""
        return (i - 1) % n

    def steps_per_phase(self, n: int) -> int:
        """``2 n - 2`` steps per phase: ``n`` segments through ``n - 1`` links; none when ``n == 1``.

        >>> CHAIN.steps_per_phase(1), CHAIN.steps_per_phase(4)
        (0, 6)
        """
        return 2 * n - 2

    def all_rounds(self, n: int) -> tuple[tuple[Phase, int], ...]:
        """Every ``(phase, step)`` pair in execution order: ``4 (n - 1)`` of them."""
        return tuple((phase, t) for phase in PHASES for t in range(self.steps_per_phase(n)))

    def position(self, phase: Phase, i: int, n: int) -> int:
        """Worker ``i``'s place along ``phase``'s chain: ``i`` in the reduce, ``(i + 1) mod n`` in the
        broadcast."""
        return i if phase == REDUCE_SCATTER else (i + 1) % n

    def send_segment(self, phase: Phase, i: int, t: int, n: int) -> int | None:
        """The segment worker ``i`` sends in step ``t`` of ``phase``: ``t - p``, or ``None`` when it idles
        (``chain-steps``)."""
        p = self.position(phase, i, n)
        s = t - p
        return s if p < n - 1 and 0 <= s < n else None

    def recv_segment(self, phase: Phase, i: int, t: int, n: int) -> int | None:
        """The segment worker ``i`` receives in step ``t`` of ``phase``: ``t - p + 1``, or ``None``."""
        return self.send_segment(phase, self.left(i, n), t, n)

    def sends(self, phase: Phase, t: int, n: int) -> tuple[Send, ...]:
        """The transfers of step ``t`` of ``phase``, ordered by sender (idle workers send nothing)."""
        return tuple(
            Send(phase, t, i, self.right(i, n), s)
            for i in range(n)
            if (s := self.send_segment(phase, i, t, n)) is not None
        )

    def fold_order(self, c: int, n: int) -> tuple[int, ...]:
        """The workers whose segments ``c`` are added, in order: ``0, 1, ..., n - 1`` for every ``c``."""
        return tuple(range(n))

    def normalized(self, n: int) -> ChainSchedule:
        """The chain itself: it has no offset to normalise."""
        return self

    def describe(self) -> str:
        """``chain 0 -> N-1, layout blocks``.

        >>> CHAIN.describe()
        'chain 0 -> N-1, layout blocks'
        """
        return f"chain 0 -> N-1, layout {self.layout}"


CHAIN: Final = ChainSchedule("blocks")
"""The chain (``chain-order``): the left fold ``((x_0 + x_1) + x_2) + ...`` for every element."""

# --- Recursive doubling (clauses doubling-*): not a ring either ------------------------------------


class DoublingSchedule(NamedTuple):
    """Recursive doubling as MPICH and OpenMPI run it: one tree for every element (``doubling-order``).

    It is not a ring of the family: every worker exchanges its whole buffer, so
    every element sums in the same tree, whatever ``M``.  With ``P`` the largest
    power of two ``<= n`` and ``rem = n - P``: in the pre-step (only when
    ``rem > 0``) worker ``2 j`` sends to ``2 j + 1`` for ``j < rem``, which stores
    ``x_{2j} ∘ x_{2j+1}`` and takes part as new rank ``j``; worker ``i >= 2 rem``
    takes part as new rank ``i - rem``; the even workers below ``2 rem`` wait.
    In doubling step ``s = 1 .. log2 P`` new ranks ``v`` and ``v XOR 2^(s-1)``
    swap their buffers and both store ``lower ∘ upper`` (the lower new rank's
    value first), so both hold the same bits.  Phase ``reduce-scatter`` is the
    pre-step and the doubling steps; phase ``all-gather`` is the post-step
    (only when ``rem > 0``): worker ``2 j + 1`` sends the result to ``2 j``, which
    copies it.  ``layout`` only cuts each buffer into the ``n`` slots the
    engines carry; it does not change any element's tree.

    >>> RECURSIVE_DOUBLING.all_rounds(3)
    (('reduce-scatter', 0), ('reduce-scatter', 1), ('all-gather', 0))
    >>> [RECURSIVE_DOUBLING.partner(REDUCE_SCATTER, i, 1, 3) for i in range(3)]
    [None, 2, 1]
    >>> [RECURSIVE_DOUBLING.new_rank(i, 6) for i in range(6)]
    [None, 0, None, 1, 2, 3]
    """

    layout: Layout = "blocks"
    kind: Literal["recursive-doubling"] = "recursive-doubling"
    """Tells it from the chain, whose tuple ``(layout,)`` would otherwise equal this one's."""

    def powers(self, n: int) -> tuple[int, int]:
        """``(P, rem)``: the largest power of two ``P <= n`` and ``rem = n - P``."""
        p = 1 << (n.bit_length() - 1)
        return p, n - p

    def new_rank(self, i: int, n: int) -> int | None:
        """Worker ``i``'s rank among the ``P`` workers of the doubling steps; ``None`` for an even
        worker below ``2 rem``, which hands its buffer on in the pre-step."""
        _, rem = self.powers(n)
        if i < 2 * rem:
            return i // 2 if i % 2 else None
        return i - rem

    def old_rank(self, v: int, n: int) -> int:
        """The worker that takes part as new rank ``v``."""
        _, rem = self.powers(n)
        return 2 * v + 1 if v < rem else v + rem

    def all_rounds(self, n: int) -> tuple[tuple[Phase, int], ...]:
        """Every ``(phase, step)`` pair in execution order: the pre-step and ``log2 P`` doubling steps,
        then the post-step (the steps around the doubling only when ``rem > 0``)."""
        p, rem = self.powers(n)
        reduce = (1 if rem else 0) + p.bit_length() - 1
        return tuple((REDUCE_SCATTER, t) for t in range(reduce)) + tuple(
            (ALL_GATHER, t) for t in range(1 if rem else 0)
        )

    def doubling_step(self, t: int, n: int) -> int:
        """Which doubling step ``s`` (``1 .. log2 P``) reduce-scatter step ``t`` is; ``0``: the pre-step."""
        _, rem = self.powers(n)
        return t if rem else t + 1

    def partner(self, phase: Phase, i: int, t: int, n: int) -> int | None:
        """The worker that ``i`` receives from in step ``t`` of ``phase``, or ``None`` when it receives
        nothing (``doubling-steps``)."""
        _, rem = self.powers(n)
        if phase == ALL_GATHER:
            return i + 1 if i < 2 * rem and i % 2 == 0 else None
        s = self.doubling_step(t, n)
        if s == 0:
            return i - 1 if i < 2 * rem and i % 2 else None
        v = self.new_rank(i, n)
        return None if v is None else self.old_rank(v ^ (1 << (s - 1)), n)

    def first(self, phase: Phase, i: int, t: int, n: int) -> bool:
        """Whether worker ``i`` puts what it receives first in step ``t`` of ``phase``: the sender holds
        the lower workers' sum (``doubling-order``)."""
        sender = self.partner(phase, i, t, n)
        return sender is not None and sender < i

    def sends(self, phase: Phase, t: int, n: int) -> tuple[Send, ...]:
        """The transfers of step ``t`` of ``phase``, one per slot of each buffer that moves, by sender."""
        return tuple(
            Send(phase, t, src, dst, c)
            for src in range(n)
            for dst in range(n)
            if self.partner(phase, dst, t, n) == src
            for c in range(n)
        )

    def normalized(self, n: int) -> DoublingSchedule:
        """Recursive doubling itself: it has no offset to normalise."""
        return self

    def describe(self) -> str:
        """``recursive doubling, layout blocks``.

        >>> RECURSIVE_DOUBLING.describe()
        'recursive doubling, layout blocks'
        """
        return f"recursive doubling, layout {self.layout}"


RECURSIVE_DOUBLING: Final = DoublingSchedule("blocks")
"""Recursive doubling (``doubling-order``): ``((x_0 + x_1) + (x_2 + x_3))`` for every element at ``N = 4``;
the default of MPICH, of Intel MPI for large messages and of OpenMPI below 16 KB at ``N = 3``."""

Schedule = RingSchedule | ChainSchedule | DoublingSchedule
"""Any schedule the engines run: a ring of the family, the chain or recursive doubling."""

PRESETS: Final[dict[str, Schedule]] = {
    "spec": SPEC,
    "openmpi-ring": OPENMPI_RING,
    "gloo": GLOO,
    "chain": CHAIN,
    "mpich-ring": MPICH_RING,
    "intel-ring": INTEL_RING,
    "mlx-ring": MLX_RING,
    "recursive-doubling": RECURSIVE_DOUBLING,
}
"""The named schedules, in the order ``reveal`` reports matches (and they were published in)."""

BELOW_N: Final[dict[str, Schedule]] = {
    "openmpi-ring": RECURSIVE_DOUBLING,
    "mlx-ring": RingSchedule(1, 0, "ceil"),
}
"""What a library's ring runs when a worker holds fewer elements than there are workers (``S < N``),
by the preset's name (clause ``schedule-below-n``): OpenMPI's ring hands the call to its recursive
doubling; MLX pads the input to ``N`` elements and runs its ring the other way round (rank ``i`` sends
to ``i + 1``, element ``c`` folds ``c, c + 1, ...``).  Only a preset *named* runs these; a
:class:`RingSchedule` given as a value is the ring of the family at every size."""


def preset_schedule(name: str, n: int, s: int) -> Schedule:
    """The schedule the preset ``name`` runs on ``n`` workers of ``s`` elements each (:data:`BELOW_N`).

    >>> preset_schedule("openmpi-ring", 4, 2).describe(), preset_schedule("openmpi-ring", 4, 4).describe()
    ('recursive doubling, layout blocks', 'direction +1, offset 0, layout blocks')
    >>> preset_schedule("mlx-ring", 3, 1).describe(), preset_schedule("gloo", 3, 1) == GLOO
    ('direction +1, offset 0, layout ceil', True)
    """
    return BELOW_N[name] if name in BELOW_N and 0 < s < n else PRESETS[name]


def reduce_scatter_ring(schedule: str | Schedule | None, n: int) -> RingSchedule:
    """The ring a reduce-scatter or an all-gather of ``n`` ranks runs: it leaves chunk ``r`` at rank ``r``.

    A ring leaves chunk ``r`` at rank ``r`` exactly when its offset equals its
    direction mod ``n`` (``owned_chunk(i) = i - k - (n - 1) d = i`` iff
    ``k = d``; clause ``rsc-ring``).  ``None`` is the preset ``"spec"``; a preset
    name gives that preset's direction and layout with ``k = d``; a
    :class:`RingSchedule` is taken as it is if ``k = d`` (mod ``n``, any ``k`` for
    ``n = 1``) and refused with a ``ValueError`` otherwise.  The caller has
    checked the name and the fields (:func:`ring_ref._validate.schedule_of`).

    >>> reduce_scatter_ring(None, 4), reduce_scatter_ring("gloo", 4)
    (RingSchedule(direction=1, offset=1, layout='even'), RingSchedule(direction=-1, offset=-1, layout='gloo'))
    >>> reduce_scatter_ring(SPEC, 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: reduce-scatter and all-gather leave chunk r at rank r, ... RingSchedule(1, 1, 'even') ...
    """
    rings = ", ".join(repr(name) for name, ring in PRESETS.items() if isinstance(ring, RingSchedule))
    named = PRESETS.get(schedule) if isinstance(schedule, str) else schedule
    if not isinstance(named, RingSchedule | None):
        what = "the chain (spec section 15)" if isinstance(named, ChainSchedule) else "recursive doubling"
        raise ValueError(
            f"reduce-scatter and all-gather run on a ring; {what} is not one: use "
            f"a ring preset ({rings}) or a RingSchedule(d, d, layout)"
        )
    if schedule is None or isinstance(schedule, str):
        preset = PRESETS["spec" if schedule is None else schedule]
        assert isinstance(preset, RingSchedule)
        return RingSchedule(preset.direction, preset.direction, preset.layout)
    assert isinstance(schedule, RingSchedule)
    d, k, layout = schedule
    if n > 1 and (k - d) % n:
        raise ValueError(
            "reduce-scatter and all-gather leave chunk r at rank r, which a ring does only when its "
            f"offset equals its direction mod N; the ring ({schedule.describe()}) leaves chunk "
            f"{schedule.owned_chunk(0, n)} at rank 0 for N = {n}. Use RingSchedule({d}, {d}, {layout!r}) "
            f"or a preset name ({rings}), which takes the preset's direction and layout with "
            "offset = direction."
        )
    return schedule
