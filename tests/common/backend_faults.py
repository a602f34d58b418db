"""A fault on one rank of a ``"ring_ref"`` world, run under ``torchrun`` (``tests/nocover/test_backend.py``).

``python -m torch.distributed.run ... tests/common/backend_faults.py MODE OUT``: every rank joins the
backend with a 5 s timeout and all-reduces once; rank 1 misbehaves as ``MODE`` says (``shape``:
one element more; ``op``: ``MAX`` where the others sum; ``nan``: a NaN; ``dead``: its process ends
before the call, with status 0 so that ``torchrun`` lets the others run; ``hang``: it raises on its
own and lingers, never calling; ``subgroup``: no fault, ranks 0 and 1 all-reduce on a
``new_group()``).  Each rank writes what happened to it (``ok`` and the backends and result, or the
exception's type and text) and the seconds it took to ``OUT/rank<r>.txt``, then leaves at once (a
failed group is not torn down).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

import ring_ref.distributed  # noqa: F401 (registers the backend)

TIMEOUT_S = 5.0


def main(mode: str, out: Path) -> None:
    dist.init_process_group("ring_ref", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    tensor = torch.ones(4) * (rank + 1)
    op = dist.ReduceOp.SUM
    if rank == 1:
        if mode == "shape":
            tensor = torch.ones(5)
        elif mode == "op":
            op = dist.ReduceOp.MAX
        elif mode == "nan":
            tensor[2] = float("nan")
        elif mode == "dead":
            os._exit(0)
        elif mode == "hang":
            try:
                raise RuntimeError("planted failure on rank 1")
            except RuntimeError:
                time.sleep(4 * TIMEOUT_S)
                os._exit(0)
    group = None
    store = distributed_c10d._get_default_store()
    if mode == "subgroup":  # no fault: new_group() in a "ring_ref" world is a "ring_ref" group
        group = dist.new_group([0, 1])
        if rank > 1:  # not a member: it leaves once the members are done (leaving at once could close
            # its connections while a member still finishes the world's gloo mesh: "closed by peer")
            store.wait(["done0", "done1"], datetime.timedelta(seconds=4 * TIMEOUT_S))
            os._exit(0)
    start = time.monotonic()
    try:
        dist.all_reduce(tensor, op=op, group=group)
        outcome = f"ok {dist.get_backend(group)} {dist.get_backend()} {tensor.tolist()}"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    (out / f"rank{rank}.txt").write_text(f"{time.monotonic() - start:.2f}\n{outcome}")
    store.set(f"done{rank}", "1")
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
