"""Run the reference ring on real processes and check it against the simulation, bit for bit.

Launch (CPU, gloo, one machine)::

    torchrun --standalone --nproc-per-node 4 examples/torchrun_ring.py

Every rank builds the same seeded stacked input ``x`` of shape ``(N, M, 3)``
(``N`` = world size), reduces its own row ``x[rank]`` in place with
:func:`ring_ref.distributed.ring_all_reduce_`, and compares the bits with
``ring_ref.ring_all_reduce(x)``, the single-process simulation, for each
supported dtype.  With ``--backend nccl`` each rank uses CUDA device
``LOCAL_RANK``.  The exit status is 1 if any rank saw a difference.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from ring_ref import ring_all_reduce
from ring_ref.distributed import ring_all_reduce_

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def stacked_input(n: int, dtype: torch.dtype, rows_per_chunk: int = 2, seed: int = 0) -> torch.Tensor:
    """A seeded ``(N, M, 3)`` input of widely spread magnitudes, so that the order of additions shows."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n, n * rows_per_chunk, 3)
    scale = torch.pow(10.0, torch.randint(-3, 4, shape, generator=gen).to(torch.float64))
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bit patterns."""
    as_int = _INT_OF_SIZE[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(as_int), b.view(as_int))


def main(argv: list[str] | None = None) -> int:
    """Check every dtype on this rank; print one line per dtype; return 0 when all are bitwise equal."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    args = parser.parse_args(argv)
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    try:
        rank, n = dist.get_rank(), dist.get_world_size()
        ok = True
        for dtype in DTYPES:
            x = stacked_input(n, dtype)
            mine = x[rank].clone().to(device)
            ring_all_reduce_(mine)
            expected = ring_all_reduce(x)
            equal = same_bits(mine.cpu(), expected)
            ok = ok and equal
            verdict = "equals the simulation bit for bit" if equal else "DIFFERS from the simulation"
            line = f"rank {rank}/{n} {args.backend} {dtype!s:>14} {tuple(mine.shape)}: {verdict}\n"
            sys.stdout.write(line)  # one write per line, so the ranks' lines do not interleave
            sys.stdout.flush()
        return 0 if ok else 1
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
