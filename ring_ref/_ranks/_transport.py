"""How the ranks of a ``torch.distributed`` group move the data: the check before the ring and the rounds.

The check (:func:`check_group`; on gloo :func:`check_gloo`, one ``alltoall`` that may
also carry the first round's chunk, or two ranks' whole tensors) and four ways of
running the rounds: point-to-point sends pipelined by segment (gloo, three or more
ranks: :func:`_ring_pipelined`), one ``alltoall`` per segment (gloo, two ranks:
:func:`_ring_exchanges`), one ``batch_isend_irecv`` per round (NCCL: :func:`_ring_rounds`)
and the chain's steps (:func:`chain_steps`).  :class:`Waiter` words every failure
with the rank and the round.
"""

import datetime
from collections.abc import Callable
from typing import Final

import torch
import torch.distributed as dist

from ring_ref._ops import COMMUTING_OPS
from ring_ref._ranks._check import (
    TENSORS,
    Description,
    Shards,
    check_everywhere,
    describe_tensor,
    refuse_everywhere,
    values_finite,
)
from ring_ref._ranks._plans import (
    BYTES,
    ROW_WORDS,
    SCRATCH,
    ChainPlan,
    DoublingPlan,
    Known,
    Plan,
    by_exchanges,
    check_layout,
    check_room,
    check_row,
    plan_call,
)
from ring_ref.schedule import ALL_GATHER, REDUCE_SCATTER, Phase

__all__ = [
    "Waiter",
    "chain_pipelined",
    "chain_steps",
    "check_gloo",
    "check_group",
    "doubling_steps",
    "run_rounds",
]


class Waiter:
    """Waits on works with the call's ``timeout``; rewords any failure with the rank and the round."""

    def __init__(
        self,
        rank: int,
        n: int,
        timeout: datetime.timedelta | None,
        right: int = 0,
        left: int = 0,
        *,
        call: str = "ring_all_reduce_",
    ) -> None:
        self.rank, self.n, self.timeout = rank, n, timeout
        self.right, self.left, self.call = right, left, call

    def _failed(self, where: str, exc: RuntimeError) -> RuntimeError:
        return RuntimeError(
            f"{self.call}: rank {self.rank} of {self.n}{where} failed or timed out; a peer "
            f"probably raised, exited or did not call {self.call}. Cause: {exc}"
        )

    def wait(self, work: dist.Work, where: str) -> None:
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(timeout=self.timeout)
        except RuntimeError as exc:
            raise self._failed(where, exc) from exc

    def round(self, work: dist.Work, phase: Phase, r: int) -> None:
        """Wait on one of round ``r``'s sends or receives (its description is worded only on failure)."""
        try:
            if self.timeout is None:
                work.wait()
            else:
                work.wait(timeout=self.timeout)
        except RuntimeError as exc:
            where = (
                f", {phase} round {r}: exchanging chunks with rank {self.right} (send) and rank "
                f"{self.left} (receive)"
            )
            raise self._failed(where, exc) from exc


_CHECKING: Final = ": checking every rank's tensor before the ring"


def _all_to_all(  # noqa: PLR0917 (the collective's own arguments)
    group: dist.ProcessGroup,
    output: torch.Tensor,
    tensor: torch.Tensor,
    output_splits: list[int],
    input_splits: list[int],
    timeout: datetime.timedelta | None,
) -> dist.Work:
    """``alltoall`` on ``group``: ``input_splits[j]`` elements of ``tensor`` go to rank ``j``,
    ``output_splits[j]`` elements of ``output`` come from it; gloo gives up after ``timeout``."""
    return group.alltoall_base(output, tensor, output_splits, input_splits, timeout=timeout)


def _all_gather(
    group: dist.ProcessGroup,
    outputs: list[torch.Tensor],
    tensor: torch.Tensor,
    timeout: datetime.timedelta | None,
) -> dist.Work:
    """``allgather`` on ``group`` into ``outputs`` (one per rank); gloo gives up after ``timeout``."""
    return group.allgather(outputs, tensor, timeout=timeout)


def _gather_signatures(
    flags: torch.Tensor, group: dist.ProcessGroup, waiter: Waiter
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's row ``flags`` in rank order, and this rank's row as often: one ``allgather``
    (backends other than gloo, which checks with :func:`check_gloo`).  The two results are equal
    exactly when every rank's row is this rank's.
    """
    n = waiter.n
    gathered = flags.new_empty((n, flags.numel()))
    waiter.wait(_all_gather(group, list(gathered.unbind(0)), flags, waiter.timeout), _CHECKING)
    return gathered.view(-1), flags.repeat(n)


class _GroupExchange:
    """:class:`ring_ref._ranks._check.Exchange` over a ``torch.distributed`` group: every rank's row
    in one ``allgather`` (:func:`_gather_signatures`; gloo checks with :func:`check_gloo` instead),
    the descriptions with ``all_gather_object``.  ``row`` is the clean row when already made."""

    def __init__(
        self, group: dist.ProcessGroup, backend: str, waiter: Waiter, row: torch.Tensor | None = None
    ) -> None:
        self.group, self.backend, self.waiter, self.row = group, backend, waiter, row

    def agree(self, signature: list[int], clean: bool) -> bool:
        n = self.waiter.n
        if n == 1:
            return clean
        flags = self.row
        if flags is None or not clean:
            flags = check_row(signature, clean, n, self.backend)
        everyone, own = _gather_signatures(flags, self.group, self.waiter)
        return clean and torch.equal(everyone, own)

    def descriptions(self, mine: Description) -> list[Description]:
        n, call = self.waiter.n, self.waiter.call
        descriptions: list[Description | None] = [None] * n
        try:
            dist.all_gather_object(descriptions, mine, group=self.group)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{call}: rank {self.waiter.rank} of {n}: exchanging tensor descriptions before the "
                f"ring failed or timed out; a peer probably raised, exited or did not call "
                f"{call}. Cause: {exc}"
            ) from exc
        return [d for d in descriptions if d is not None]


def check_group(
    tensor: object,
    group: dist.ProcessGroup,
    backend: str,
    waiter: Waiter,
    *,
    op: object = "sum",
    name: object = "spec",
) -> Known:
    """Raise the same bad-input error on every rank, or return on every rank; one small collective
    (one rank, or backends other than gloo: :func:`check_gloo` checks gloo groups).

    Returns what the metadata decided (the ring and this rank's plan among it).
    """
    n = waiter.n
    known = plan_call(tensor, waiter.rank, n, backend, op=op, name=name)
    clean = known.sound
    if clean:
        assert isinstance(tensor, (torch.Tensor, Shards)) and known.ring is not None
        clean = values_finite(tensor, n, backend, known.ring)
    check_everywhere(
        _GroupExchange(group, backend, waiter, known.flags),
        known.signature,
        clean,
        lambda: describe_tensor(tensor, n, backend, op, name),
        TENSORS,
        waiter.call,
    )
    return known


def _payload(
    flat: torch.Tensor | None, plan: Plan | ChainPlan, first: int, source: torch.Tensor | None
) -> torch.Tensor | None:
    """What a clean call sends with the check (:func:`check_gloo`): its whole ``flat`` buffer
    (:attr:`Plan.swap`), the chunk it sends at step ``first`` (:attr:`Plan.lead`; ``source``
    when given, else read from ``flat``), or nothing."""
    if plan.swap:
        return flat
    if not isinstance(plan, Plan) or not plan.lead:
        return None
    if source is not None:
        payload = source.detach().reshape(-1)
        assert payload.numel() == plan.chunks[plan.sent[first]], "a lone all-gather sends its input first"
        return payload
    assert flat is not None
    start = sum(plan.chunks[: plan.sent[first]])
    return flat[start : start + plan.chunks[plan.sent[first]]]


def check_gloo(  # noqa: PLR0917 (the call's own arguments)
    tensor: object,
    flat: torch.Tensor | None,
    known: Known,
    group: dist.ProcessGroup,
    waiter: Waiter,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None] | None,
    *,
    op: object,
    name: object,
    first: int = 0,
    source: torch.Tensor | None = None,
) -> tuple[bool, tuple[torch.Tensor, ...] | None]:
    """gloo: the check before the ring in one ``alltoall`` that also carries the first piece of
    data.  Returns whether the reduction is done and, when the rounds are still to run, the
    segments of the chunk the left neighbour sends at step ``first`` (the first step the call
    runs) if it came with the check (:attr:`Plan.lead`).  ``source``, when given, is what this
    rank sends at that step (a lone all-gather's input, not yet in its slot); otherwise it is
    read from ``flat``.

    Every rank sends every other rank its signature and verdict (:func:`tensor_signature`), all
    messages at once (an ``allgather`` or ``allreduce`` would pass them round the ring in
    ``N - 1`` or more steps).  When its tensor is clean, its message to its right neighbour
    also carries either the bytes of its whole ``flat`` buffer (two ranks, at most
    :data:`SWAP_BYTES`) or the chunk it sends first (at most :data:`LEAD_BYTES`).  Each rank
    receives from its two neighbours (the only ranks a ring of
    the family sends to first, whatever its direction) into room for the larger of the two
    after the row, so unequal tensors cannot overrun it, and nothing is written before every
    row is compared.  Equal clean rows mean equal tensors and rings.

    Two ranks swapping: every element of a chunk this rank receives in reduce-scatter becomes
    ``combine(incoming=theirs, own=mine)`` (``rs-add``), and every element of the chunk it sends
    becomes ``combine(incoming=mine, own=theirs)``, the combine the other rank makes in the ring,
    which all-gather would have copied here (``ag-copy-not-add``), one chunk of
    :attr:`Plan.swap` after another; for the ops of :data:`ring_ref._ops.COMMUTING_OPS` that is
    ``combine(incoming=theirs, own=mine)``'s bits, made in place.  A first chunk that came is the
    staging of reduce-scatter's first receive, which the rounds then add in.  Otherwise the ranks
    exchange full descriptions (:func:`ring_ref._ranks._check.refuse_everywhere`).
    """
    n, rank = waiter.n, waiter.rank
    plan = known.plan  # the chain sends data with the check only to swap (ChainPlan.swap); doubling none
    if not isinstance(plan, Plan | ChainPlan) or (isinstance(plan, ChainPlan) and not plan.swap):
        plan = None
    clean = known.sound
    if clean:
        assert isinstance(tensor, (torch.Tensor, Shards)) and known.ring is not None
        clean = values_finite(tensor, n, "gloo", known.ring)
    payload = _payload(flat, plan, first, source) if clean and plan is not None else None
    flags = known.flags if clean and known.flags is not None else check_row(known.signature, clean, n, "gloo")
    rows = flags.view(torch.uint8)  # this rank's row N times (cached for clean calls)
    head = rows.numel() // n
    assert head == ROW_WORDS * flags.element_size(), "a row per rank"
    layout = check_layout(n, rank, head, check_room())
    sending = [0 if j == rank else head for j in range(n)]
    outbox = rows[: head * (n - 1)]
    if payload is not None:
        assert plan is not None
        size = payload.numel() * payload.element_size()
        sending[plan.right] += size
        cut = (plan.right + (plan.right < rank)) * head  # where the right neighbour's row ends
        outbox = SCRATCH.get("check-out", head * (n - 1) + size, BYTES)
        outbox[:cut].copy_(rows[:cut])
        outbox[cut : cut + size].view(payload.dtype).copy_(payload)
        if cut < head * (n - 1):
            outbox[cut + size :].copy_(rows[cut : head * (n - 1)])
    inbox = SCRATCH.get("check-in", sum(layout.receiving), BYTES)
    waiter.wait(_all_to_all(group, inbox, outbox, layout.receiving, sending, waiter.timeout), _CHECKING)
    if clean and all(torch.equal(inbox[start:stop], rows[: stop - start]) for start, stop in layout.runs):
        if payload is None:
            return False, None
        assert plan is not None and combine_into is not None
        came = inbox[layout.offsets[plan.left] + head :]
        if not plan.swap:
            assert isinstance(plan, Plan)
            count, chunk = plan.per_chunk, plan.received[first]
            arrived = came[: plan.chunks[chunk] * payload.element_size()].view(payload.dtype)
            return False, arrived.split_with_sizes(plan.pieces[chunk * count : (chunk + 1) * count])
        staging = came[: payload.numel() * payload.element_size()].view(payload.dtype)
        for start, stop, here in plan.swap:
            own, incoming = payload[start:stop], staging[start:stop]
            if here or known.reduce_op in COMMUTING_OPS:
                combine_into(incoming, own)
            else:
                combine_into(own, incoming)
                own.copy_(incoming)
        return True, None
    mine = describe_tensor(tensor, n, "gloo", op, name)
    refuse_everywhere(_GroupExchange(group, "gloo", waiter), mine, TENSORS, waiter.call)
    return False, None


def _ring_pipelined(
    slots: tuple[torch.Tensor, ...],
    stages: tuple[torch.Tensor, ...],
    plan: Plan,
    group: dist.ProcessGroup,
    waiter: Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
    lead: tuple[torch.Tensor, ...] | None = None,
    steps: range,
) -> None:
    """The schedule's rounds ``steps`` on the segments ``slots`` of a flat buffer, pipelined.

    ``slots[c * per_chunk + s]`` is segment ``s`` of chunk ``c`` and
    ``stages[t * (per_chunk + 1) + s]`` its staging at step ``t`` (:class:`Plan`).
    Step ``t`` is the ``t``-th ``(phase, round)`` of :func:`ring_ref.schedule.all_rounds`.
    Every step forwards the chunk the previous step completed (``sent[t + 1] ==
    received[t]``, checked when the plan is made), so segment ``s`` of step
    ``t + 1`` is sent as soon as segment ``s`` of step ``t`` has arrived and
    been added.

    A gloo send goes out only once the receiver has posted its receive, so every
    receive is posted before the first send: each reduce-scatter step into its own
    part of the staging, each all-gather step straight into the slot.  An
    all-gather segment is final, so it comes only after every rank's contribution
    to it has been received, this rank's included, which was sent from the same
    slot segment: it cannot land on bytes still to be sent.
    Empty segments (of short or empty chunks) are neither sent nor received.  ``lead``, when
    given, holds the segments of the first step, already come with the check
    (:func:`check_gloo`).  ``steps`` are the steps to run: all of them (all-reduce), or one phase's.
    """
    count, received, rounds, filled, rs_steps = (
        plan.per_chunk,
        plan.received,
        plan.steps,
        plan.filled,
        plan.rs_steps,
    )
    right, left = plan.right, plan.left
    # Sends are waited on at the end (a gloo work must be waited on once only): no addition writes
    # a slot a send still reads, as reduce-scatter sends each chunk once and adds into a chunk
    # before it sends it (checked when the plan is made), and all-gather's receives are final.
    sending: list[tuple[int, dist.Work]] = []
    receiving: dict[int, dist.Work] = {}

    def post_send(t: int, piece: int, s: int) -> None:
        sending.append((t, group.send([slots[piece]], right, t * count + s)))

    first = steps.start
    for t in steps[0 if lead is None else 1 :]:
        for s in filled[received[t]]:
            into = stages[t * (count + 1) + s] if t < rs_steps else slots[received[t] * count + s]
            receiving[t * count + s] = group.recv([into], left, t * count + s)
    for s in filled[plan.sent[first]] if lead is None else ():
        post_send(first, plan.sent[first] * count + s, s)

    def arrive(t: int, piece: int, s: int) -> None:
        """Segment ``s`` of step ``t`` has come: in reduce-scatter, add it into its slot; in
        all-gather, copy it there when it came with the check."""
        came = lead[s] if lead is not None and t == first else None
        if came is None:
            waiter.round(receiving.pop(t * count + s), *rounds[t])
        if t < rs_steps:
            stage = stages[t * (count + 1) + s] if came is None else came
            combine_into(stage, slots[piece])  # incoming + own (or the op's): rs-add
        elif came is not None:
            slots[piece].copy_(came)  # ag-copy-not-add

    last = steps.stop - 1
    for t in steps:
        c = received[t]
        for s in range(count):
            piece = c * count + s
            if plan.pieces[piece]:
                arrive(t, piece, s)
                if t < last:
                    post_send(t + 1, piece, s)
    for step, work in sending:
        waiter.round(work, *rounds[step])


def _ring_exchanges(
    slots: tuple[torch.Tensor, ...],
    stages: tuple[torch.Tensor, ...],
    plan: Plan,
    group: dist.ProcessGroup,
    waiter: Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
    lead: tuple[torch.Tensor, ...] | None = None,
    steps: range,
) -> None:
    """The schedule's rounds ``steps``, each segment of each round one ``alltoall`` collective, pipelined.

    Segment ``s`` of step ``t``: this rank's piece of chunk ``sent[t]`` goes to the
    right neighbour and the left neighbour's piece of chunk ``received[t]`` comes
    in (every other rank exchanges nothing with it), into staging for
    reduce-scatter (added into the slot once it has arrived) and straight into
    the slot for all-gather.  A collective completes its send and its receive
    together, so no send is pending when a slot is overwritten.  Segment ``s`` of
    step ``t + 1`` is started as soon as segment ``s`` of step ``t`` is done
    (the same slot: :func:`_ring_pipelined`), while the other segments are under way.
    ``lead``, when given, holds the segments of the first step, already come with the check
    (:func:`check_gloo`).
    """
    count, received, sent, pieces = plan.per_chunk, plan.received, plan.sent, plan.pieces
    works: dict[int, dist.Work] = {}

    def start(t: int, s: int) -> None:
        out, into = sent[t] * count + s, received[t] * count + s
        output = stages[t * (count + 1) + s] if t < plan.rs_steps else slots[into]
        input_splits, output_splits = plan.splits[t * count + s]
        works[t * count + s] = _all_to_all(
            group, output, slots[out], output_splits, input_splits, waiter.timeout
        )

    for s in range(count if lead is None else 0):
        start(steps.start, s)
    last = steps.stop - 1
    for t in steps:
        phase, r = plan.steps[t]
        for s in range(count):
            came = lead[s] if lead is not None and t == steps.start else None
            if came is None:
                waiter.round(works.pop(t * count + s), phase, r)
            if t < plan.rs_steps and pieces[received[t] * count + s]:
                # incoming + own (or the op's), as rs-add states
                incoming = stages[t * (count + 1) + s] if came is None else came
                combine_into(incoming, slots[received[t] * count + s])
            elif came is not None and pieces[received[t] * count + s]:
                slots[received[t] * count + s].copy_(came)  # ag-copy-not-add
            if t < last:
                start(t + 1, s)


def _ring_rounds(
    chunks: tuple[torch.Tensor, ...],
    staging: torch.Tensor,
    plan: Plan,
    group: dist.ProcessGroup,
    waiter: Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
    steps: range,
) -> None:
    """The schedule's rounds ``steps``, one ``batch_isend_irecv`` each (backends that need grouped
    sends: NCCL)."""
    for t in steps:
        phase, r = plan.steps[t]
        out, slot = chunks[plan.sent[t]], chunks[plan.received[t]]
        into = staging[: slot.numel()] if phase == REDUCE_SCATTER else slot
        ops = []
        if out.numel():
            ops.append(dist.P2POp(dist.isend, out, group=group, group_peer=plan.right))
        if slot.numel():
            ops.append(dist.P2POp(dist.irecv, into, group=group, group_peer=plan.left))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                waiter.round(work, phase, r)
        if phase == REDUCE_SCATTER and slot.numel():
            combine_into(into, slot)


def chain_steps(
    flat: torch.Tensor,
    work: torch.Tensor,
    plan: ChainPlan,
    group: dist.ProcessGroup,
    waiter: Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """The chain's steps on ``flat``, one ``batch_isend_irecv`` each (clause ``chain-steps``).

    In a reduce step the segment received lands in staging and is then added
    into its slot (``incoming + own``); in a broadcast step it lands in the
    slot.  Sender and receiver of a step compute the same segment, and empty
    segments are neither sent nor received.  Every step's links form a chain
    (no cycle), so waiting on each step before the next cannot deadlock.
    """
    segments = [flat[start:stop] for start, stop in plan.bounds]
    staging = SCRATCH.get("staging", max(stop - start for start, stop in plan.bounds), work)
    for (phase, t), out, slot in zip(plan.steps, plan.sent, plan.received, strict=True):
        ops = []
        if out is not None and segments[out].numel():
            ops.append(dist.P2POp(dist.isend, segments[out], group=group, group_peer=plan.right))
        into = None
        if slot is not None and segments[slot].numel():
            into = staging[: segments[slot].numel()] if phase == REDUCE_SCATTER else segments[slot]
            ops.append(dist.P2POp(dist.irecv, into, group=group, group_peer=plan.left))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                waiter.round(request, phase, t)
        if phase == REDUCE_SCATTER and into is not None and slot is not None:
            combine_into(into, segments[slot])


def chain_pipelined(
    flat: torch.Tensor,
    plan: ChainPlan,
    group: dist.ProcessGroup,
    waiter: Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """The chain's steps on ``flat`` over gloo's point-to-point sends, driven by the data rather than
    by the steps (clause ``chain-steps``: the same transfers and combines as :func:`chain_steps`).

    Every receive is posted first (a gloo send waits for its receive): a reduce step's into its
    own part of staging, a broadcast step's straight into the slot.  Then each segment is sent on
    as soon as it is ready: a reduce segment once it has arrived and been added into its slot
    (``incoming + own``; rank 0's at once), a broadcast segment once it has arrived (the last rank's
    once its reduce is complete).  No step waits for the steps of other segments, so the ``4 (n - 1)``
    steps cost no wake-up each, and no slot is overwritten while a send still reads it: a
    broadcast segment arrives only once it is complete, after the next rank has received this
    rank's partial sum sent from the same slot.  The sends are waited on at the end.
    """
    segments = [flat[start:stop] for start, stop in plan.bounds]
    stages = SCRATCH.get("staging", flat.numel(), flat)  # flat is work (contiguous): the same key
    sending: list[tuple[int, dist.Work]] = []
    receiving: dict[int, tuple[int, torch.Tensor | None, dist.Work]] = {}
    for k, ((phase, _), c) in enumerate(zip(plan.steps, plan.received, strict=True)):
        if c is not None and segments[c].numel():
            start, stop = plan.bounds[c]
            into = stages[start:stop] if phase == REDUCE_SCATTER else None
            receiving[k] = (c, into, group.recv([segments[c] if into is None else into], plan.left, k))
    sends = {
        (phase, c): k
        for k, ((phase, _), c) in enumerate(zip(plan.steps, plan.sent, strict=True))
        if c is not None and segments[c].numel()
    }

    def send_on(phase: Phase, c: int) -> None:
        k = sends.get((phase, c))
        if k is not None:
            sending.append((k, group.send([segments[c]], plan.right, k)))

    added = {c for c, into, _ in receiving.values() if into is not None}
    for phase, c in sends:  # reduce segments that receive nothing first (rank 0's): sent at once
        if phase == REDUCE_SCATTER and c not in added:
            send_on(phase, c)
    for k in sorted(receiving):
        c, into, request = receiving.pop(k)
        waiter.round(request, *plan.steps[k])
        if into is not None:
            combine_into(into, segments[c])  # incoming + own (or the op's)
            send_on(REDUCE_SCATTER, c)
            if (REDUCE_SCATTER, c) not in sends:  # the last rank: complete, so broadcast it
                send_on(ALL_GATHER, c)
        else:
            send_on(ALL_GATHER, c)
    for k, request in sending:
        waiter.round(request, *plan.steps[k])


def doubling_steps(
    flat: torch.Tensor,
    work: torch.Tensor,
    plan: DoublingPlan,
    group: dist.ProcessGroup,
    waiter: Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
) -> None:
    """Recursive doubling's steps on ``flat``, one ``batch_isend_irecv`` of whole buffers each (clause
    ``doubling-steps``).

    In a reduce step the buffer received lands in staging and this rank stores ``lower ∘ upper``, the
    lower rank's value first (``doubling-order``); in the post-step it lands in ``flat``.  Every send of
    a step reads the buffer at the start of the step (the receive goes to staging), and each step's
    pairs are disjoint or swap with each other, so waiting on each step before the next cannot
    deadlock.
    """
    staging = SCRATCH.get("staging", flat.numel(), work)
    for (phase, t), dest, source in zip(plan.steps, plan.dest, plan.source, strict=True):
        waiter.right, waiter.left = (rank if rank is not None else waiter.rank for rank in (dest, source))
        ops = []
        if dest is not None:
            ops.append(dist.P2POp(dist.isend, flat, group=group, group_peer=dest))
        into = staging if phase == REDUCE_SCATTER else flat
        if source is not None:
            ops.append(dist.P2POp(dist.irecv, into, group=group, group_peer=source))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                waiter.round(request, phase, t)
        if phase == REDUCE_SCATTER and source is not None:
            if source < waiter.rank:
                combine_into(staging, flat)  # flat = received (the lower ranks) ∘ own
            else:
                combine_into(flat, staging)  # staging = own (the lower ranks) ∘ received
                flat.copy_(staging)


def run_rounds(  # noqa: PLR0917 (the call's own arguments)
    flat: torch.Tensor,
    slots: tuple[torch.Tensor, ...] | None,
    work: torch.Tensor,
    plan: Plan,
    group: dist.ProcessGroup,
    waiter: Waiter,
    *,
    combine_into: Callable[[torch.Tensor, torch.Tensor], None],
    lead: tuple[torch.Tensor, ...] | None,
    steps: range,
) -> None:
    """The ring's rounds ``steps`` on ``flat`` over the transport the backend calls for: on gloo
    (``slots``, its segments) ``alltoall`` exchanges or point-to-point sends, elsewhere one batch
    per round.  Only reduce-scatter's steps receive into staging."""
    if slots is None:
        staging = SCRATCH.get("staging", max(plan.chunks), work)
        chunks = flat.split_with_sizes(plan.chunks)
        _ring_rounds(chunks, staging, plan, group, waiter, combine_into=combine_into, steps=steps)
        return
    stages = SCRATCH.split("staging", plan.staging, work) if steps.start < plan.rs_steps else ()
    ring = _ring_exchanges if by_exchanges(waiter.n) else _ring_pipelined
    ring(slots, stages, plan, group, waiter, combine_into=combine_into, lead=lead, steps=steps)
