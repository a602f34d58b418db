"""MLX's ring backend on one machine: a hostfile of loopback ports, and joining the ring from the environment.

MLX's ``ring`` backend (``mlx.core.distributed.init(backend="ring")``) learns
who a process is from two variables, as ``mlx.launch`` sets them:
``MLX_HOSTFILE``, a JSON file listing each rank's ``"ip:port"`` addresses (one
list per rank, in rank order), and ``MLX_RANK``.  :func:`loopback_hostfile`
writes one for ``N`` ranks on ``127.0.0.1`` (``difftest --ranks mlx``);
:func:`join_ring` joins the ring a process's environment names, the job's
``RANK`` standing in for a missing ``MLX_RANK`` (``torchrun``, and every
``--ranks job`` rank, which sets ``RANK``).  MLX's ring needs two ranks or
more (a hostfile of one rank waits for a neighbour that never comes): a
process without ``MLX_HOSTFILE`` is a group of one, MLX's singleton group, as
MLX gives a script started alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ring_ref._processes._shared import loopback_listener

if TYPE_CHECKING:
    from mlx.core.distributed import Group

__all__ = ["HOSTFILE", "RANK", "join_ring", "loopback_hostfile"]

HOSTFILE: Final = "MLX_HOSTFILE"
"""MLX's variable naming the hostfile (JSON: one list of ``"ip:port"`` per rank)."""
RANK: Final = "MLX_RANK"
"""MLX's variable naming this process's rank."""


def loopback_hostfile(n: int, path: Path) -> Path:
    """Write to ``path`` a hostfile for ``n`` ranks, each listening at a free port of ``127.0.0.1``.

    The ports are free when chosen (held together, then released), as MLX binds
    them itself.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     hosts = json.loads(loopback_hostfile(3, Path(d) / "hosts.json").read_text())
    >>> len(hosts), [len(h) for h in hosts], hosts[0][0].startswith("127.0.0.1:")
    (3, [1, 1, 1], True)
    """
    with contextlib.ExitStack() as held:
        ports = [held.enter_context(loopback_listener()).getsockname()[1] for _ in range(n)]
    path.write_text(json.dumps([[f"127.0.0.1:{port}"] for port in ports]), encoding="utf-8")
    return path


def join_ring() -> Group:
    """Join the MLX ring named by ``MLX_HOSTFILE`` and ``MLX_RANK`` (or the job's ``RANK``); see the module.

    The environment (which MLX reads) gains ``MLX_RANK`` from ``RANK`` when only
    that is set.  Without ``MLX_HOSTFILE`` the group is
    MLX's singleton, unless the job says it has more ranks (``WORLD_SIZE``):
    then ``RuntimeError``, since one rank alone would return its own input.
    Joining again returns the same group.
    """
    env = os.environ
    hostfile = env.get(HOSTFILE)
    if hostfile and RANK not in env and "RANK" in env:
        env[RANK] = env["RANK"]
    world = env.get("WORLD_SIZE", "1")
    if not hostfile and world.isdigit() and int(world) > 1:
        raise RuntimeError(
            f"this process is rank {env.get('RANK')} of a job of WORLD_SIZE={world}, but {HOSTFILE} is not "
            f"set: MLX's ring is joined from {HOSTFILE} (a JSON list of each rank's [\"ip:port\"]) and "
            f"{RANK} (or RANK); write one for the job's ranks, or let difftest start them (--ranks mlx)"
        )
    import mlx.core as mx  # the optional extra ring-ref[mlx], imported by the rank only

    return mx.distributed.init(strict=bool(hostfile), backend="ring")
