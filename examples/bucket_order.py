"""Does DDP's ``bucket_cap_mb`` change the trained weights' bits?  Train the same model at two bucket sizes.

Launch (CPU, one machine), once per backend and order::

    torchrun --standalone --nproc-per-node 4 examples/bucket_order.py --backend gloo
    RING_REF_ORDER=spec  torchrun --standalone --nproc-per-node 4 examples/bucket_order.py --backend ring_ref
    RING_REF_ORDER=chain torchrun --standalone --nproc-per-node 4 examples/bucket_order.py --backend ring_ref

Every rank trains a 3-layer MLP (113,272 parameters) for 3 SGD steps with
``DistributedDataParallel`` (no hook, default settings) at ``bucket_cap_mb`` 0.05 and
at 25, on seeded per-rank batches, then rank 0 prints how many parameters differ in
their bits between the two runs, whether every rank holds the same bits, and (with
``RING_REF_ORDER=chain``) whether the weights equal a one-process replay that folds
each rank's gradient, divided by the world size as DDP does before it reduces, over
the ranks from left to right.  The only change from a gloo script is the backend's
name and the import of :mod:`ring_ref.distributed`, which registers it.  Exit status
1 where ranks disagree or the chain's replay differs.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ring_ref.distributed  # noqa: F401 (registers the "ring_ref" backend)

STEPS = 3
BATCH = 16
BUCKETS_MB = (0.05, 25.0)


def make_model() -> torch.nn.Module:
    """The same seeded MLP on every rank: 64 -> 256 -> 256 -> 120 (113,272 parameters)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 120),
    )


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s examples at ``step``, seeded so that a replay can rebuild them."""
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, 64, generator=gen), torch.randn(BATCH, 120, generator=gen)


def loss_of(model: torch.nn.Module, step: int, rank: int) -> torch.Tensor:
    x, y = batch(step, rank)
    return torch.nn.functional.mse_loss(model(x), y)


def train(bucket_cap_mb: float) -> torch.Tensor:
    """Train with DDP at ``bucket_cap_mb``; this rank's parameters afterwards, flat."""
    model = make_model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(ddp, step, dist.get_rank()).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def chain_replay(n: int) -> torch.Tensor:
    """One process: each step, every rank's gradient divided by ``n``, folded over the ranks left to right."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        folded: list[torch.Tensor] | None = None
        for rank in range(n):
            model.zero_grad()
            loss_of(model, step, rank).backward()  # type: ignore[no-untyped-call]
            grads = [p.grad.detach().clone() / n for p in model.parameters() if p.grad is not None]
            folded = grads if folded is None else [a + g for a, g in zip(folded, grads, strict=True)]
        assert folded is not None
        for p, g in zip(model.parameters(), folded, strict=True):
            p.grad = g
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def start(argv: list[str] | None, description: str) -> tuple[str, int, int, str]:
    """Read ``--backend`` (default ``ring_ref``) and join the default group on it: the backend, this
    rank, the world size and the order (``RING_REF_ORDER``, or gloo's own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--backend", default="ring_ref")
    backend: str = parser.parse_args(argv).backend
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    order = (os.environ.get("RING_REF_ORDER") or "spec") if backend == "ring_ref" else "gloo's own"
    return backend, dist.get_rank(), dist.get_world_size(), order


def main(argv: list[str] | None = None) -> int:
    """Train at both bucket sizes; rank 0 prints the comparison; 0 when every rank agrees."""
    backend, rank, n, order = start(argv, __doc__.splitlines()[0])
    runs = [train(mb) for mb in BUCKETS_MB]
    agree = True
    for params in runs:
        everyone = [torch.empty_like(params) for _ in range(n)]
        dist.all_gather(everyone, params)
        agree = agree and all(torch.equal(bits(p), bits(params)) for p in everyone)
    ok = agree
    if rank == 0:
        differing = int((bits(runs[0]) != bits(runs[1])).sum())
        print(f"backend {backend}, order {order}, {n} ranks, {runs[0].numel():,} parameters")
        print(f"  parameters differing in their bits, bucket_cap_mb 0.05 vs 25: {differing:,}")
        print(f"  every rank holds the same bits: {'yes' if agree else 'NO'}")
        if order == "chain":
            replay = chain_replay(n)
            same = all(torch.equal(bits(replay), bits(run)) for run in runs)
            print(f"  both runs equal the one-process left-fold replay: {'yes' if same else 'NO'}")
            ok = ok and same and differing == 0
    return finish(ok)


def finish(ok: bool) -> int:
    """Tear the job's group down once every rank is done (rank 0's replay included): 0 when ``ok``."""
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def leave(status: int) -> None:
    """Exit with ``status`` once the output is flushed, by ``os._exit``: gloo's threads can abort the
    interpreter's normal teardown (the train-order guide's "When a rank fails")."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    leave(main())
