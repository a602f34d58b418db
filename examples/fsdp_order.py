"""FSDP2 with no custom comms on the ``"ring_ref"`` backend: do the ranks' weights equal a one-process replay?

Launch (CPU, one machine), once per order (and once on gloo for comparison)::

    RING_REF_ORDER=spec  torchrun --standalone --nproc-per-node 4 examples/fsdp_order.py
    RING_REF_ORDER=chain torchrun --standalone --nproc-per-node 4 examples/fsdp_order.py
    torchrun --standalone --nproc-per-node 4 examples/fsdp_order.py --backend gloo

Every rank trains the MLP of ``examples/bucket_order.py`` (113,272 parameters, the same
seeded batches) for 3 SGD steps, each ``Linear`` and the whole model under FSDP2's
``fully_shard`` with torch's own comms: its gradient reduce-scatter and parameter
all-gather are the process group's.  Rank 0 then gathers every rank's full parameters,
prints whether every rank holds the same bits and, on ``"ring_ref"``, whether they equal
a one-process replay of the group's order (:func:`replay`), which uses no backend code:
each rank's gradients are computed in one process and laid out as FSDP2 lays out its
reduce-scatter input (per parameter, ``dim 0`` zero-padded to a multiple of the world size
and cut into one shard per rank; rank ``r``'s row the ``r``-th shards one after another),
then reduced with ``ReduceOp.AVG`` (which FSDP2 passes for float32 gradients) in the
order: ``ring_ref.ring_reduce_scatter`` of the stacked rows (the stacked reference) for a
ring, and for the chain the plain left fold ``((g_0 + g_1) + g_2) + ...`` divided once by
the world size.  Exit status 1 where ranks disagree or the replay differs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from bucket_order import STEPS, bits, finish, leave, loss_of, make_model, start

import ring_ref.distributed  # noqa: F401 (registers the "ring_ref" backend)
from ring_ref import ring_reduce_scatter

LR = 0.1


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards, innermost first: each ``Linear``, then the whole model. Each is one
    parameter group of FSDP2, so one reduce-scatter per step."""
    return [*(m for m in model.modules() if isinstance(m, torch.nn.Linear)), model]


def train(n: int) -> torch.Tensor:
    """FSDP2 (no custom comms) on the default group; the full parameters afterwards, flat."""
    from torch.distributed.fsdp import fully_shard  # importing FSDP takes a second

    model = make_model()
    for module in layers(model):
        fully_shard(module)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_of(model, step, dist.get_rank()).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    full = []
    for p in model.parameters():
        shard = p.to_local().detach()  # type: ignore[attr-defined]  # a DTensor
        rows = -(-p.shape[0] // n)  # FSDP2 pads dim 0 to a multiple of n: every shard has `rows` rows
        padded = torch.zeros(rows, *p.shape[1:])
        padded[: shard.shape[0]] = shard
        gathered = [torch.empty_like(padded) for _ in range(n)]
        dist.all_gather(gathered, padded)
        full.append(torch.cat(gathered)[: p.shape[0]].reshape(-1))
    return torch.cat(full)


def reduce_scatter_rows(grads: list[torch.Tensor], n: int) -> torch.Tensor:
    """One rank's reduce-scatter input for a parameter group, as ``(n, S)``: row ``r`` holds every
    parameter's ``r``-th shard of ``dim 0``, zero-padded to ``ceil(dim0 / n)`` rows, flattened."""
    pieces = []
    for g in grads:
        rows = -(-g.shape[0] // n)
        padded = torch.zeros(n * rows, *g.shape[1:])
        padded[: g.shape[0]] = g
        pieces.append(padded.reshape(n, -1))
    return torch.cat(pieces, dim=1)


def reduce_in_order(stacked: torch.Tensor, order: str) -> torch.Tensor:
    """``(n, n, S)`` (rank, shard, element) -> ``(n, S)``, shard ``r`` reduced over the ranks with
    ``AVG`` in ``order``."""
    n = stacked.shape[0]
    if order == "chain":
        total = stacked[0].clone()
        for rank in range(1, n):
            total = total + stacked[rank]
        return total / n
    return ring_reduce_scatter(stacked.reshape(n, -1), schedule=order, op="avg")


def replay(n: int, order: str) -> torch.Tensor:
    """One process: FSDP2's training in ``order`` (the module docstring says how); the parameters, flat."""
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    groups = [list(module.parameters(recurse=False)) for module in layers(model)]
    for step in range(STEPS):
        per_rank = []
        for rank in range(n):
            model.zero_grad()
            loss_of(model, step, rank).backward()  # type: ignore[no-untyped-call]
            per_rank.append({p: p.grad.detach().clone() for p in model.parameters() if p.grad is not None})
        for params in (g for g in groups if g):
            stacked = torch.stack([reduce_scatter_rows([grads[p] for p in params], n) for grads in per_rank])
            shards = reduce_in_order(stacked, order)  # (n, S): shard r is rank r's reduced row
            offset = 0
            for p in params:
                rows = -(-p.shape[0] // n)
                size = rows * p[0].numel()
                padded = shards[:, offset : offset + size].reshape(n * rows, *p.shape[1:])
                p.grad = padded[: p.shape[0]].clone()
                offset += size
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main(argv: list[str] | None = None) -> int:
    """Train; rank 0 prints the comparison; 0 when every rank agrees (and equals the replay)."""
    backend, rank, n, order = start(argv, __doc__.splitlines()[0])
    params = train(n)
    everyone = [torch.empty_like(params) for _ in range(n)]
    dist.all_gather(everyone, params)
    ok = all(torch.equal(bits(p), bits(params)) for p in everyone)
    if rank == 0:
        print(f"FSDP2, backend {backend}, order {order}, {n} ranks, {params.numel():,} parameters")
        print(f"  every rank holds the same bits: {'yes' if ok else 'NO'}")
        if backend == "ring_ref":
            same = torch.equal(bits(replay(n, order)), bits(params))
            print(f"  equal to the one-process replay of the order: {'yes' if same else 'NO'}")
            ok = ok and same
    return finish(ok)


if __name__ == "__main__":
    leave(main())
