"""One data-parallel training step whose gradients are combined with the reference ring.

Launch (CPU, gloo, one machine; the local batch sizes are per rank)::

    torchrun --standalone --nproc-per-node 3 examples/data_parallel_step.py --batch-sizes 1,3,4

Every rank builds the same tiny model (same seed, so the same parameters) and
the same global batch, takes its own slice of ``batch_sizes[rank]`` examples,
and computes the gradient of its *local mean* loss.  The gradients are then
combined with :func:`ring_ref.distributed.ring_all_reduce_` in one flat bucket:

* **weighted** (correct for any batch sizes): each rank sends
  ``count * local_mean_gradient`` with its ``count`` appended, and divides the
  summed gradient by the summed count;
* **mean of means** (correct only for equal batch sizes): each rank sends its
  local mean gradient and divides the sum by the world size.

Both are compared with the gradient of the mean loss over the whole global
batch in one process.  See ``docs/data_parallel.md``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Final

import torch
import torch.distributed as dist

from ring_ref.distributed import ring_all_reduce_

IN_FEATURES: Final = 3
HIDDEN: Final = 4
DTYPE: Final = torch.float64


def tiny_model(seed: int = 0) -> torch.nn.Module:
    """The same small MLP on every rank: seeded, so every rank starts from the same parameters."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 1)
    ).to(DTYPE)


def global_batch(total: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``total`` seeded examples ``(inputs, targets)``, identical on every rank."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(total, IN_FEATURES, generator=gen, dtype=DTYPE)
    targets = torch.randn(total, 1, generator=gen, dtype=DTYPE)
    return inputs, targets


def mean_loss_gradient(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The gradient of the mean squared error over ``inputs``, flattened into one vector."""
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


def ring_sum(flat: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum a 1-D bucket across ranks with the ring, zero-padding it to a multiple of the group size."""
    n = dist.get_world_size(group)
    bucket = torch.cat([flat, flat.new_zeros((-flat.numel()) % n)])
    ring_all_reduce_(bucket, group)
    return bucket[: flat.numel()]


def data_parallel_gradients(rank: int, world_size: int, batch_sizes: list[int]) -> dict[str, torch.Tensor]:
    """Run one step's gradient combination on this rank; return the combined and reference gradients.

    ``batch_sizes[r]`` is rank ``r``'s local batch size.  Returned: ``weighted``
    (example-weighted ring combination), ``mean_of_means`` (ring sum of the local
    means divided by the world size) and ``full_batch`` (the single-process
    gradient of the mean loss over all examples).
    """
    if len(batch_sizes) != world_size:
        raise ValueError(f"need one batch size per rank: {world_size} ranks, got {batch_sizes}")
    model = tiny_model()
    inputs, targets = global_batch(sum(batch_sizes))
    start = sum(batch_sizes[:rank])
    local = slice(start, start + batch_sizes[rank])
    local_mean = mean_loss_gradient(model, inputs[local], targets[local])
    count = torch.tensor([float(batch_sizes[rank])], dtype=DTYPE)

    summed = ring_sum(torch.cat([local_mean * count, count]))
    weighted = summed[:-1] / summed[-1]
    mean_of_means = ring_sum(local_mean) / world_size
    full_batch = mean_loss_gradient(model, inputs, targets)
    return {"weighted": weighted, "mean_of_means": mean_of_means, "full_batch": full_batch}


def main(argv: list[str] | None = None) -> int:
    """Under torchrun: combine the gradients, print the gaps to the full-batch gradient on rank 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default=None, help="comma-separated, one per rank (default 1,2,..)")
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    try:
        rank, n = dist.get_rank(), dist.get_world_size()
        sizes = [int(s) for s in args.batch_sizes.split(",")] if args.batch_sizes else list(range(1, n + 1))
        grads = data_parallel_gradients(rank, n, sizes)
        gap_weighted = float((grads["weighted"] - grads["full_batch"]).abs().max())
        gap_means = float((grads["mean_of_means"] - grads["full_batch"]).abs().max())
        if rank == 0:
            print(f"local batch sizes {sizes}; max |difference| from the full-batch gradient:")
            print(f"  weighted by example count:  {gap_weighted:.3e}")
            print(f"  mean of the workers' means: {gap_means:.3e}")
        return 0 if gap_weighted < 1e-12 else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
