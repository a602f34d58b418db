"""The harnesses that run ranks as processes on this machine, loopback only.

* :mod:`~ring_ref._processes._shared`: what every launcher shares (the
  loopback ``TCPStore`` and joining a group through it, dying with the parent,
  the lifecycle base class :class:`~ring_ref._processes._shared.Harness`, which
  difftest's forked ranks (:class:`~ring_ref.difftest._ranks.ForkedRanks`)
  derive from too, the stop token, the stacks of ranks that hang);
* :mod:`~ring_ref._processes._gloo`: :class:`~ring_ref._processes._gloo.SpawnedGroup`,
  ``world_size`` spawned ranks of one ``torch.distributed`` group;
* :mod:`~ring_ref._processes._mpi_job`: :class:`~ring_ref._processes._mpi_job.MpiJob`,
  ``world_size`` ranks of one ``mpirun`` job, each running
  :mod:`~ring_ref._processes._mpi_rank`, with ``mpirun`` in a network namespace
  of its own (:mod:`~ring_ref._processes._netns`) where ``unshare`` works;
* :mod:`~ring_ref._processes._mlx`: MLX's ring, a hostfile of loopback ports
  and joining the ring from the environment.
"""
