"""Reveal MLX's ring all-reduce (``mx.distributed.all_sum``, ring backend): ``mlx.launch -n N --backend ring
--python PYTHON tests/common/mlx_reveal.py M``.

Rank 0 runs :func:`ring_ref._reveal.reveal`; every call hands each rank its row (rank 0's bits sent as
``int32`` through ``all_sum``, the other ranks adding zeros, so they arrive exactly), runs ``all_sum`` on
every rank and brings every rank's result back the same way, checking that the ranks agree.  Rank 0 prints
one JSON line: ``{"n", "m", "matches", "ring"}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import numpy.typing as npt
import torch


def _exact(group: Any, bits: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """``all_sum`` of ``int32`` arrays of which at most one rank's is not zero: that rank's, exactly."""
    import mlx.core as mx  # not at import: pytest imports this module, and --ranks mlx forks no mlx

    return np.array(mx.distributed.all_sum(mx.array(bits), group=group), dtype=np.int32)


def _call(group: Any, m: int, rows: npt.NDArray[np.float32] | None) -> npt.NDArray[np.int32] | None:
    """One ``all_sum`` of rank 0's ``(N, M)`` rows, every rank's result as bits; ``None`` once rank 0 is
    done (``rows`` is ``None`` on rank 0)."""
    import mlx.core as mx  # not at import: pytest imports this module, and --ranks mlx forks no mlx

    rank, n = group.rank(), group.size()
    go = np.array([0 if rows is None else 1], np.int32) if rank == 0 else np.zeros(1, np.int32)
    if _exact(group, go)[0] == 0:
        return None
    sent = rows.view(np.int32).reshape(-1) if rows is not None else np.zeros(n * m, np.int32)
    mine = _exact(group, sent).reshape(n, m)[rank].view(np.float32)
    out = np.array(mx.distributed.all_sum(mx.array(mine), group=group), dtype=np.float32)
    spread = np.zeros((n, m), np.int32)
    spread[rank] = out.view(np.int32)
    return _exact(group, spread.reshape(-1)).reshape(n, m)


def main(m: int) -> None:
    import mlx.core as mx  # not at import: pytest imports this module, and --ranks mlx forks no mlx

    group = mx.distributed.init(backend="ring", strict=True)
    if group.rank() != 0:
        while _call(group, m, None) is not None:
            pass
        return
    from ring_ref._reveal import reveal

    def target(x: torch.Tensor) -> torch.Tensor:
        every = _call(group, m, np.ascontiguousarray(x.numpy()))
        assert every is not None and all((row == every[0]).all() for row in every), "the ranks disagree"
        return torch.from_numpy(every[0].view(np.float32).copy())

    found = reveal(target, group.size(), m, name="mx.distributed.all_sum")
    _call(group, m, None)
    ring = None if found.ring is None else found.ring._asdict()
    print(json.dumps({"n": found.n, "m": m, "matches": found.matches, "ring": ring}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
