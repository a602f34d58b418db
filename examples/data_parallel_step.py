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
batch in one process.

Then the rest of the step (:func:`training_step`): each rank splits its
examples into microbatches and accumulates ``count * microbatch_mean_gradient``
(the same weighting), the ranks combine once, every rank applies **one**
optimizer step to the combined gradient, and only then updates an exponential
moving average of the parameters.  :func:`averaged_independent_steps` shows
the pitfall: Adam stepped independently on each rank, weights averaged
afterwards, is not Adam on the combined gradient (plain SGD is the case where
the two agree).  See ``docs/guide/training.md``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class StepSpec:
    """One training step: each rank's microbatch sizes, the optimizer, its learning rate, the EMA decay."""

    microbatches: tuple[tuple[int, ...], ...]
    optimizer: str = "adam"  # or "sgd" (plain, no momentum)
    lr: float = 0.1
    ema_decay: float = 0.9

    def rank_examples(self, rank: int) -> slice:
        """The slice of the global batch that ``rank`` owns."""
        start = sum(sum(sizes) for sizes in self.microbatches[:rank])
        return slice(start, start + sum(self.microbatches[rank]))

    @property
    def total(self) -> int:
        return sum(sum(sizes) for sizes in self.microbatches)


def make_optimizer(spec: StepSpec, model: torch.nn.Module) -> torch.optim.Optimizer:
    """Adam, or plain SGD (the optimizer that is linear in the gradient)."""
    if spec.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=spec.lr)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(model.parameters(), lr=spec.lr)
    raise ValueError(f"unknown optimizer {spec.optimizer!r}; choose 'adam' or 'sgd'.")


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter, flattened and concatenated (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def set_gradients(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Unpack a flat gradient into the parameters' ``.grad``, in ``model.parameters()`` order."""
    offset = 0
    for p in model.parameters():
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def accumulated_gradient(
    model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, sizes: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Example-weighted microbatch accumulation: ``sum_mb count_mb * mean_gradient_mb``, ``sum count``.

    Each microbatch's mean-loss gradient is weighted by its example count, so the
    sum is the gradient of the *summed* loss over this rank's examples, whatever
    the microbatch sizes (averaging the microbatch means would weight a short
    last microbatch as much as a full one).
    """
    summed = torch.zeros(sum(p.numel() for p in model.parameters()), dtype=DTYPE)
    start = 0
    for size in sizes:
        mb = slice(start, start + size)
        start += size
        summed += mean_loss_gradient(model, inputs[mb], targets[mb]) * size
    return summed, torch.tensor([float(start)], dtype=DTYPE)


def combined_gradient(
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    sizes: tuple[int, ...],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """The global mean-loss gradient: every rank's accumulated sum and count, ring-summed, divided."""
    summed, count = accumulated_gradient(model, inputs, targets, sizes)
    total = ring_sum(torch.cat([summed, count]), group)
    return total[:-1] / total[-1]


def training_step(rank: int, world_size: int, spec: StepSpec) -> dict[str, torch.Tensor]:
    """One synchronized step on this rank; returns the gradient, the parameters and the EMA after it.

    1. accumulate this rank's microbatches (example-weighted), combine across ranks once;
    2. one optimizer step on the combined gradient (the same bits on every rank, so the
       same parameters and the same optimizer state everywhere);
    3. then, once per optimizer step and from the updated parameters, the EMA:
       ``ema = decay * ema + (1 - decay) * parameters``.
    """
    if len(spec.microbatches) != world_size:
        raise ValueError(f"need microbatch sizes for each of the {world_size} ranks; got {spec.microbatches}")
    model = tiny_model()
    optimizer = make_optimizer(spec, model)
    ema = flat_parameters(model)  # the EMA starts at the initial parameters
    inputs, targets = global_batch(spec.total)
    local = spec.rank_examples(rank)
    gradient = combined_gradient(model, inputs[local], targets[local], spec.microbatches[rank])
    set_gradients(model, gradient)
    optimizer.step()
    optimizer.zero_grad()
    parameters = flat_parameters(model)
    ema.mul_(spec.ema_decay).add_(parameters, alpha=1 - spec.ema_decay)
    return {"gradient": gradient, "parameters": parameters, "ema": ema}


def averaged_independent_steps(rank: int, world_size: int, spec: StepSpec) -> dict[str, torch.Tensor]:
    """The pitfall: each rank steps its own optimizer on its own gradient, then the weights are averaged.

    Returned: ``combined`` (one step on the combined gradient, as in :func:`training_step`)
    and ``averaged`` (independent steps from the same start, the parameters then averaged
    across ranks weighted by example count).  With plain SGD the two agree to rounding,
    because the step is linear in the gradient; with Adam they do not.
    """
    inputs, targets = global_batch(spec.total)
    local = spec.rank_examples(rank)
    sizes = spec.microbatches[rank]

    model = tiny_model()
    optimizer = make_optimizer(spec, model)
    set_gradients(model, combined_gradient(model, inputs[local], targets[local], sizes))
    optimizer.step()
    combined = flat_parameters(model)

    model = tiny_model()
    optimizer = make_optimizer(spec, model)
    summed, count = accumulated_gradient(model, inputs[local], targets[local], sizes)
    set_gradients(model, summed / count)
    optimizer.step()
    total = ring_sum(torch.cat([flat_parameters(model) * count, count]))
    return {"combined": combined, "averaged": total[:-1] / total[-1]}


def main(argv: list[str] | None = None) -> int:
    """Under torchrun: combine the gradients, take the step, show the pitfall; print the figures on rank 0."""
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
        # Microbatches of at most 2 examples on every rank (a short last one where the count is odd).
        micro = tuple(tuple([2] * (b // 2) + [1] * (b % 2)) for b in sizes)
        step = training_step(rank, n, StepSpec(micro))
        initial = flat_parameters(tiny_model())
        gaps = {
            name: float((d["combined"] - d["averaged"]).abs().max())
            for name in ("adam", "sgd")
            for d in [averaged_independent_steps(rank, n, StepSpec(micro, optimizer=name))]
        }
        if rank == 0:
            print(f"local batch sizes {sizes}; max |difference| from the full-batch gradient:")
            print(f"  weighted by example count:  {gap_weighted:.3e}")
            print(f"  mean of the workers' means: {gap_means:.3e}")
            change = float((step["parameters"] - initial).abs().max())
            lag = float((step["ema"] - initial).abs().max())
            print(f"microbatches {[list(m) for m in micro]}: one Adam step on the combined gradient,")
            print(f"  max |parameter change| {change:.3e}; the EMA (decay 0.9) moved {lag:.3e}")
            print("independent steps on each rank, weights averaged, vs one step on the combined gradient:")
            print(f"  Adam: max |difference| {gaps['adam']:.3e}")
            print(f"  SGD:  max |difference| {gaps['sgd']:.3e}")
        return 0 if gap_weighted < 1e-12 else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
