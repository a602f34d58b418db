"""Joining MLX's ring from the environment (``ring_ref._processes._mlx``), ``--ranks mlx``'s hub, in process.

No test here imports MLX: where a join must reach ``mlx.core.distributed.init``, a stand-in module records
the call (the real ring runs in ``tests/nocover/test_mlx_ranks.py``).
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from ring_ref._processes._mlx import join_ring, loopback_hostfile
from ring_ref.difftest import difftest
from ring_ref.difftest._ranks import _MlxHub, join_mlx

pytestmark = pytest.mark.clause("mlx-ranks")


class _Group:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


@pytest.fixture
def fake_mlx(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, str]]:
    """``mlx.core`` replaced by a stand-in whose ``distributed.init`` records ``(strict, backend)`` and
    returns a group as large as the hostfile lists (1 without one); the environment a copy."""
    calls: list[tuple[bool, str]] = []

    def init(strict: bool = False, backend: str = "any") -> _Group:
        calls.append((strict, backend))
        hostfile = os.environ.get("MLX_HOSTFILE")
        return _Group(len(json.loads(Path(hostfile).read_text())) if hostfile else 1)

    core = types.SimpleNamespace(distributed=types.SimpleNamespace(init=init))
    monkeypatch.setitem(sys.modules, "mlx", types.SimpleNamespace(core=core))
    monkeypatch.setitem(sys.modules, "mlx.core", core)
    # a copy of the environment, which the joins change, without the job's and MLX's variables
    names = ("MLX_HOSTFILE", "MLX_RANK", "RANK", "WORLD_SIZE")
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in names})
    return calls


def test_a_hostfile_lists_one_free_loopback_address_per_rank(tmp_path: Path) -> None:
    hosts = json.loads(loopback_hostfile(4, tmp_path / "hosts.json").read_text(encoding="utf-8"))
    assert len(hosts) == 4 and all(len(h) == 1 and h[0].startswith("127.0.0.1:") for h in hosts)
    assert len({h[0] for h in hosts}) == 4  # held together while chosen: four different ports


def test_join_ring_takes_the_jobs_rank_for_a_missing_mlx_rank(
    fake_mlx: list[tuple[bool, str]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLX_HOSTFILE", str(loopback_hostfile(2, tmp_path / "hosts.json")))
    monkeypatch.setenv("RANK", "1")
    assert join_ring().size() == 2
    assert fake_mlx == [(True, "ring")]  # strict: a hostfile that cannot be joined raises
    assert os.environ["MLX_RANK"] == "1"
    monkeypatch.setenv("MLX_RANK", "0")  # MLX's own variable wins over the job's
    join_ring()
    assert os.environ["MLX_RANK"] == "0"


def test_join_ring_without_a_hostfile_is_a_group_of_one_unless_the_job_is_larger(
    fake_mlx: list[tuple[bool, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert join_ring().size() == 1 and fake_mlx == [(False, "ring")]  # MLX's singleton group
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(RuntimeError, match=r"rank 2 of a job of WORLD_SIZE=4, but MLX_HOSTFILE is not set"):
        join_ring()
    assert len(fake_mlx) == 1  # refused before MLX is asked


def test_a_rank_joins_with_the_variables_mlx_launch_sets_and_checks_the_size(
    fake_mlx: list[tuple[bool, str]], tmp_path: Path
) -> None:
    hostfile = str(loopback_hostfile(3, tmp_path / "hosts.json"))
    join_mlx(hostfile, 2, 3)
    assert (os.environ["MLX_HOSTFILE"], os.environ["MLX_RANK"]) == (hostfile, "2")
    with pytest.raises(RuntimeError, match="MLX's ring joined a group of 3; expected 4"):
        join_mlx(hostfile, 2, 4)
    join_mlx(None, 0, 1)  # one rank: no hostfile (MLX's ring needs two), the singleton group
    assert "MLX_HOSTFILE" not in os.environ and os.environ["MLX_RANK"] == "0"


def test_the_hub_writes_a_hostfile_for_two_ranks_or_more_and_removes_it() -> None:
    one, three = _MlxHub(1), _MlxHub(3)
    assert one.hostfile is None and three.hostfile is not None
    hostfile = Path(three.hostfile)
    assert len(json.loads(hostfile.read_text(encoding="utf-8"))) == 3
    for hub in (one, three):
        hub.close()
    assert not hostfile.parent.exists()


def test_ranks_mlx_refuses_to_fork_a_process_that_imported_mlx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlx", types.SimpleNamespace())
    with pytest.raises(RuntimeError, match="forks its ranks from this process, which has imported mlx"):
        difftest("ring_ref.targets:mlx_all_sum", ranks="mlx", examples=1)


def test_a_job_of_two_ranks_without_a_hostfile_is_refused(
    fake_mlx: list[tuple[bool, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"of a job of WORLD_SIZE=2, but MLX_HOSTFILE is not set"):
        join_ring()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert join_ring().size() == 1 and fake_mlx == [(False, "ring")]
