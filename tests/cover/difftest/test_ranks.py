"""How forked JAX and MLX ranks find each other (``ring_ref.difftest._ranks``), in pytest's own process.

The hubs, what each rank runs to join, and the refusal to fork a process that has imported the library,
with stand-ins for ``jax`` and for MLX's ring: no rank is forked and neither library is imported here.
The groups on real ranks: ``nocover/test_jax_ranks.py``, ``nocover/test_mlx_ranks.py``,
``nocover/test_difftest_ranks.py``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ring_ref.difftest import _ranks
from ring_ref.difftest._ranks import JaxRanks, MlxRanks, _in_environment, join_jax, join_mlx


def test_a_rank_sets_the_environment_before_it_joins() -> None:
    seen: list[str | None] = []
    try:
        _in_environment(
            {"RING_REF_TEST_JOIN": "set"}, lambda: seen.append(os.environ.get("RING_REF_TEST_JOIN"))
        )
        assert seen == ["set"]
    finally:
        os.environ.pop("RING_REF_TEST_JOIN", None)


class _FakeJax(types.ModuleType):
    """``jax`` as :func:`join_jax` uses it: the calls recorded, the group's size given."""

    def __init__(self, processes: int, devices: int) -> None:
        super().__init__("jax")
        self.calls: list[tuple[str, Any]] = []
        self._processes, self._devices = processes, devices
        self.config = types.SimpleNamespace(update=lambda *args: self.calls.append(("config", args)))
        self.distributed = types.SimpleNamespace(
            initialize=lambda **kw: self.calls.append(("initialize", kw))
        )

    def process_count(self) -> int:
        return self._processes

    def devices(self) -> list[int]:
        return list(range(self._devices))


def test_a_jax_rank_joins_the_coordinator_on_loopback_over_gloo_with_one_cpu_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = _FakeJax(3, 3)
    monkeypatch.setitem(sys.modules, "jax", fake)
    join_jax(4321, 2, 3, 57)
    assert fake.calls == [
        ("config", ("jax_cpu_collectives_implementation", "gloo")),
        ("config", ("jax_num_cpu_devices", 1)),
        (
            "initialize",
            {
                "coordinator_address": "127.0.0.1:4321",
                "num_processes": 3,
                "process_id": 2,
                "coordinator_bind_address": "127.0.0.1:4321",
                "initialization_timeout": 57,
            },
        ),
    ]


@pytest.mark.parametrize(("processes", "devices"), [(2, 3), (3, 4)])
def test_a_jax_group_of_another_size_is_an_error_naming_both(
    monkeypatch: pytest.MonkeyPatch, processes: int, devices: int
) -> None:
    monkeypatch.setitem(sys.modules, "jax", _FakeJax(processes, devices))
    with pytest.raises(RuntimeError) as raised:
        join_jax(4321, 0, 3, 57)
    assert str(raised.value) == (
        f"jax.distributed joined {processes} processes with {devices} devices; expected 3 and 3"
    )


def test_the_jax_hub_is_a_loopback_port_and_each_rank_joins_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    hub = JaxRanks("ring_ref:ring_all_reduce", 12.5).hub(4)
    assert isinstance(hub, _ranks._JaxHub)
    assert (hub.n, hub.timeout_s) == (4, 55)  # twice the call's time limit and 30 s, whole seconds
    assert 0 < hub.port < 1 << 16  # a port of loopback_listener's (tested with it), let go of
    setup = hub.rank_setup(3)
    assert isinstance(setup, functools.partial)
    assert (setup.func, setup.args, setup.keywords) == (join_jax, (hub.port, 3, 4, 55), {})
    hub.started()
    hub.close()


def test_the_mlx_hub_writes_a_hostfile_of_loopback_ports_and_removes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "mlx", raising=False)
    hub = MlxRanks("ring_ref:ring_all_reduce", 10.0).hub(3)
    assert isinstance(hub, _ranks._MlxHub) and hub.n == 3 and hub.hostfile is not None
    hostfile = Path(hub.hostfile)
    assert hostfile.parent == Path(hub.directory) and hostfile.parent.name.startswith("ring-ref-mlx-")
    hosts = json.loads(hostfile.read_text())
    assert len(hosts) == 3 and all(len(h) == 1 and h[0].startswith("127.0.0.1:") for h in hosts)
    assert all(0 < int(h[0].rsplit(":", 1)[1]) < 1 << 16 for h in hosts)
    setup = hub.rank_setup(1)
    assert isinstance(setup, functools.partial)
    assert (setup.func, setup.args, setup.keywords) == (join_mlx, (hub.hostfile, 1, 3), {})
    hub.started()
    hub.close()
    assert not hostfile.parent.exists()
    hub.close()  # closing again finds nothing to remove: no error
    two = _ranks._MlxHub(2)  # the smallest ring
    assert two.hostfile is not None and len(json.loads(Path(two.hostfile).read_text())) == 2
    two.close()
    one = _ranks._MlxHub(1)  # MLX's singleton group: no hostfile
    assert one.hostfile is None and Path(one.directory).is_dir()
    one.close()
    assert not Path(one.directory).exists()


class _Group:
    def __init__(self, n: int) -> None:
        self.n = n

    def size(self) -> int:
        return self.n


@pytest.mark.parametrize("hostfile", ["/tmp/hosts.json", None])
def test_an_mlx_rank_joins_with_the_variables_mlx_launch_sets(
    monkeypatch: pytest.MonkeyPatch, hostfile: str | None
) -> None:
    monkeypatch.setenv("MLX_RANK", "stale")
    monkeypatch.setenv("MLX_HOSTFILE", "stale")
    seen: list[tuple[str | None, str | None]] = []

    def join() -> _Group:
        seen.append((os.environ.get("MLX_RANK"), os.environ.get("MLX_HOSTFILE")))
        return _Group(3)

    monkeypatch.setattr(_ranks, "join_ring", join)
    join_mlx(hostfile, 2, 3)
    assert seen == [("2", hostfile)]


def test_a_lone_mlx_rank_joins_with_no_hostfile_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLX_RANK", "stale")  # restored after the test, as join_mlx sets it
    monkeypatch.delenv("MLX_HOSTFILE", raising=False)
    monkeypatch.setattr(_ranks, "join_ring", lambda: _Group(1))
    join_mlx(None, 0, 1)
    assert "MLX_HOSTFILE" not in os.environ and os.environ["MLX_RANK"] == "0"


def test_an_mlx_ring_of_another_size_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ranks, "join_ring", lambda: _Group(2))
    monkeypatch.setenv("MLX_RANK", "0")  # restored after the test, as join_mlx sets it
    with pytest.raises(RuntimeError) as raised:
        join_mlx("/tmp/hosts.json", 0, 3)
    assert str(raised.value) == "MLX's ring joined a group of 2; expected 3"


@pytest.mark.parametrize(
    ("group", "module", "words"),
    [
        (
            JaxRanks,
            "jax",
            "ranks='jax' forks its ranks from this process, which has imported jax (a forked jax process "
            "may hang): run difftest --ranks jax from a process that does not import jax (the ring-ref "
            "command), or test the target stacked with framework='jax'",
        ),
        (
            MlxRanks,
            "mlx",
            "ranks='mlx' forks its ranks from this process, which has imported mlx (a forked mlx process "
            "may hang): run difftest --ranks mlx from a process that does not import mlx (the ring-ref "
            "command)",
        ),
    ],
)
def test_ranks_are_not_forked_from_a_process_that_imported_their_library(
    monkeypatch: pytest.MonkeyPatch, group: type[JaxRanks] | type[MlxRanks], module: str, words: str
) -> None:
    monkeypatch.setitem(sys.modules, module, types.ModuleType(module))
    with pytest.raises(RuntimeError) as raised:
        group("ring_ref:ring_all_reduce", 10.0).hub(2)
    assert str(raised.value) == words
