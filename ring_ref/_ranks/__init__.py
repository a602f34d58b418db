"""The per-rank runtimes: the ring run by real processes, each rank calling with its own data.

The public names are :mod:`ring_ref.distributed` (``torch.distributed``) and
:mod:`ring_ref.mpi` (``mpi4py``), which re-export from here:

* :mod:`~ring_ref._ranks._rules`: the bad-input table's rows for one rank's tensor or array
  (and a reduce-scatter's or all-gather's pair);
* :mod:`~ring_ref._ranks._check`: the one check before the ring that both runtimes run, every
  rank raising the same error, over an ``Exchange`` (how a runtime's ranks exchange signatures);
* :mod:`~ring_ref._ranks._plans`: what a call's metadata decides (its plan: chunks, segments,
  staging), kept between calls, the tuning constants and the per-thread scratch buffers;
* :mod:`~ring_ref._ranks._transport`: how torch ranks move the data (the gloo check carrying
  data, pipelined point-to-point sends, ``alltoall`` exchanges, per-round batches, the chain);
* :mod:`~ring_ref._ranks._torch`: ``ring_ref.distributed``'s collectives;
* :mod:`~ring_ref._ranks._adapters`: FSDP2's ``RingReduceScatter``/``RingAllGather`` and DDP's
  ``ring_hook``;
* :mod:`~ring_ref._ranks._mpi`: ``ring_ref.mpi``'s collectives.
"""
