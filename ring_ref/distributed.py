"""The spec's ring all-reduce on real processes, over ``torch.distributed`` messages between ring neighbours.

:func:`ring_all_reduce_` is a deterministic drop-in for
``torch.distributed.all_reduce(tensor)`` (sum) when debugging numerics: every
rank of the group calls it with its own ``(M, ...)`` tensor, and every rank
ends with the same bits, equal to ``ring_ref.ring_all_reduce(torch.stack(...))``
of the ranks' inputs in rank order.  Group rank ``i`` plays worker ``i``; each
round sends to and receives from the ring neighbours following
:mod:`ring_ref.schedule` exactly (clauses ``rs-send-chunk``, ``ag-send-chunk``),
with reduce-scatter storing ``incoming + slot`` (``rs-add``) and all-gather
copying (``ag-copy-not-add``).  A reduce-scatter chunk lands in a separate
buffer and is added into its slot only once it has fully arrived, so a value is
never forwarded in the round it arrived (``simultaneous-rounds``).

``schedule=`` runs another ring of the family (:class:`ring_ref.schedule.RingSchedule`:
direction, offset, chunk layout; clause ``schedule-family``), as
``ring_all_reduce(x, schedule=...)`` does, with that call's bits: ``"gloo"``
gives the bits of ``torch.distributed.all_reduce`` on the gloo backend,
``"openmpi-ring"`` those of OpenMPI's ring.  The layouts ``blocks`` and ``gloo``
cut the tensor's elements (row-major) and accept any ``M``; gloo's layout may
leave chunks short or empty (an empty chunk is never sent).

``schedule="chain"`` runs the chain instead (spec section 15: a pipelined chain
reduce and broadcast, not a ring), every rank ending with the left fold over the
ranks.

:func:`ring_hook` plugs the same ring into ``DistributedDataParallel``
(``model.register_comm_hook(None, ring_hook)``).

**The backend.**  Importing this module registers the ``torch.distributed`` backend
``"ring_ref"`` (:data:`BACKEND`): ``dist.init_process_group("ring_ref")`` (or
``new_group(backend="ring_ref")``) makes a :class:`RingRefProcessGroup`, whose every reduction
(``all_reduce``, ``reduce``, ``reduce_scatter_tensor``, ``reduce_scatter``) runs one order, chosen
once per group by :class:`RingRefOptions` (``pg_options=``) or the environment variable
:data:`ORDER_ENV` (``spec``, ``chain`` or another preset) and checked equal on every rank, and
whose other collectives are an inner gloo group's.  DDP with no hook, FSDP2 with no custom comms
and the functional collectives run through it unchanged (spec ``backend.md``; the guide's *Train
with a specified order*).

:func:`ring_reduce_scatter_` and :func:`ring_all_gather_` (torch's ``reduce_scatter_tensor`` and
``all_gather_into_tensor``, argument order included; spec section 13) run one phase each of the
same code: the rounds of that phase alone, with the same check, transports and
timeouts, on a ring that finishes chunk ``r`` at rank ``r``
(:func:`ring_ref.schedule.reduce_scatter_ring`).  :class:`RingReduceScatter` and
:class:`RingAllGather` hand them to FSDP2 (``set_custom_reduce_scatter`` / ``set_custom_all_gather``).

**Speed.**  On gloo each chunk travels in segments (at least
:data:`SEGMENT_BYTES`, or :data:`EXCHANGE_SEGMENT_BYTES` on two ranks, at most
:data:`MAX_SEGMENTS` per chunk; every chunk of a call is cut into the same
number of segments, sized by the largest chunk): as
soon as segment ``s`` of the chunk received in one round has been added into
its slot, segment ``s`` of the next round's chunk (the same slot: every round of
every ring of the family forwards the chunk it has just completed) is sent,
while the remaining segments are still arriving.  The additions that make each
element are exactly the schedule's, in the same order, so the bits do not
depend on the segment size, nor on how the segments travel:

* three or more ranks use point-to-point sends.  A gloo send waits until its
  receiver has posted the receive, so every receive is posted before the first
  send: reduce-scatter's each into its own part of a reused staging buffer
  (``N - 1`` times the largest chunk, kept per thread between calls), and
  all-gather's straight into the slot.  That cannot overwrite bytes still to be
  sent from the slot: the chunk that lands there is final, so every rank's
  contribution to it has already been received, including the one this rank
  sent from that very slot in reduce-scatter.
* two ranks (:data:`_EXCHANGE_RANKS`) run each segment of each round as one
  ``alltoall`` collective, in which each rank sends its piece to the other;
  gloo runs collectives on its own worker thread, and on a busy machine they
  took far less variable time than sends and receives driven from Python.
  Each is a trip through that thread, so two-rank segments are larger.
  Reduce-scatter receives into staging, all-gather straight into the slot.
* when no chunk is larger than :data:`LEAD_BYTES`, the first round (reduce-scatter's,
  or a lone all-gather's) travels with the check below: each rank's signature
  message to its right neighbour also carries the chunk it sends first, so that
  round costs no exchange of its own.
* two ranks reducing at most :data:`SWAP_BYTES` need no rounds at all: a
  two-rank ring's only neighbour is the other rank, and each element's result
  is one combine of the two inputs, made by the rank that receives its chunk in
  reduce-scatter (its value ``own``, the other's ``incoming``) and copied by
  all-gather.  So each rank sends its whole tensor to the other, in the same
  ``alltoall`` message as its signature for the check below, and makes every
  combine itself with those roles: the ring's combines and bits, the same bytes
  on the wire, one exchange in all instead of two (the check carrying
  reduce-scatter, then all-gather), and twice the combines, which is why larger
  tensors take the rounds.  The chain on two ranks swaps alike: every element
  is the one combine ``incoming = x_0``, ``own = x_1``.
* the chain on three or more ranks (or larger) posts every receive first and
  sends each segment on as soon as it is ready, rather than step by step.

Contiguous tensors are reduced in place; a non-contiguous one is reduced in a
contiguous copy that is written back at the end.  Other backends (NCCL) run
one ``batch_isend_irecv`` per round, unsegmented.  What a call's metadata
decides (its signature, the table's verdict but finiteness, and the index
arithmetic of chunks, segments and steps) is computed once and reused for
later calls with the same shape, strides, dtype, device, group size, rank, op
and schedule.

**Bad input** is rejected with the same exception on *every* rank, before
anything is written.  Each rank checks its own tensor (the spec's bad-input
table, :mod:`ring_ref._ranks._rules`) and condenses its shape, dtype, device type,
layout, op, schedule and verdict into a fixed-size signature; one collective
tells every rank every rank's signature: on gloo one ``alltoall`` in which
every rank sends its signature to every rank (all messages at once, where an
``allgather`` or ``allreduce`` passes them round in ``N - 1`` or more steps),
on other backends one ``allgather``; gloo is given the call's ``timeout``.  On
gloo that ``alltoall`` may also carry data (two ranks' whole tensors, or the
first reduce-scatter chunk, above): every rank receives from its two
neighbours (the only ranks any ring of the family sends to first) into room
for the most any rank sends, so a peer with another shape, dtype or ring
cannot overrun it, and the data is combined only once every signature
matches; the collective completes on every rank, so nothing is left pending
for the next call.  Only
when the signatures differ or a verdict is bad do the ranks exchange full
descriptions (``all_gather_object``) so that every rank can word the same
error naming every offending rank.  The finiteness check is a sum of the
tensor (a NaN or infinity anywhere makes it non-finite); only a non-finite sum
(bad input, or an overflowing sum of finite values) pays for the element-wise
scan.

**Failures.**  A peer that fails mid-ring or never calls makes the others raise
``RuntimeError`` naming the round (or the check before the ring) and the
neighbours, after ``timeout`` if given, else after the group's timeout
(``init_process_group(timeout=...)``; gloo's default is 30 minutes).  After a
timeout the group's connections to that peer are closed: destroy the group
and start a new one.  **What the tensor holds after a failure:** a contiguous
tensor is reduced in place, so after a failure mid-ring its elements are a mix
of inputs, partial sums and final sums, an element being received at that
moment may hold a mixture of old and new bytes, and a receive posted before
the failure may still write into it until the group is destroyed; treat it as
garbage (recompute it); nothing is written before the check's exchange is
complete, so a failure there (and in a two-rank swap, whose only exchange it
is) leaves it unchanged.  A non-contiguous
tensor is reduced in a private copy and is left unchanged.  Bad input never
modifies anything.
"""

# In the order of the API page (mkdocstrings lists re-exported names as they are imported).
from ring_ref._ranks._plans import (  # noqa: I001
    SEGMENT_BYTES,
    EXCHANGE_SEGMENT_BYTES,
    MAX_SEGMENTS,
    SWAP_BYTES,
    LEAD_BYTES,
)
from ring_ref._ranks._torch import ring_all_reduce_, ring_reduce_scatter_, ring_all_gather_
from ring_ref._ranks._adapters import RingReduceScatter, RingAllGather, RingHookState, ring_hook
from ring_ref._ranks._backend import BACKEND, ORDER_ENV, RingRefOptions, RingRefProcessGroup

__all__ = [
    "BACKEND",
    "EXCHANGE_SEGMENT_BYTES",
    "LEAD_BYTES",
    "MAX_SEGMENTS",
    "ORDER_ENV",
    "SEGMENT_BYTES",
    "SWAP_BYTES",
    "RingAllGather",
    "RingHookState",
    "RingReduceScatter",
    "RingRefOptions",
    "RingRefProcessGroup",
    "ring_all_gather_",
    "ring_all_reduce_",
    "ring_hook",
    "ring_reduce_scatter_",
]
