"""The fast engine's compiled kernel across processes: its disk cache, and forked children.

An installed package often lives in a read-only directory.  The kernel's
machine code is then kept in the per-user cache (``~/.cache/ring_ref``); where
that is not writable either, the kernel is compiled in memory (:func:`ring_ref._fast._kernel.kernel`).
Each case runs fresh interpreters in a private mount namespace (``unshare -m``,
as root, as CI runs) with a copy of ``ring_ref`` bind-mounted read-only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.common.paths import ROOT

pytestmark = pytest.mark.clause("fold-order")

PROBE = """
import json
import numpy as np
from ring_ref._fast import _kernel
x = np.arange(32.0, dtype=np.float32).reshape(4, 8)
x.setflags(write=False)
out = np.empty(8, np.float32)
cycle = np.arange(4)
entries = np.array([[0, 4, 0]])
finite = _kernel.fold_chunks(x, out, cycle, entries, chunk_size=2, threads=1)
compiled = _kernel.kernel("float32", True)
path = str(compiled.path)
print(json.dumps({"finite": finite, "out": out.tolist(), "loaded": compiled.loaded, "path": path}))
"""

EXPECTED = [48.0, 52.0, 56.0, 60.0, 64.0, 68.0, 72.0, 76.0]
"""Column sums of ``arange(32).reshape(4, 8)``: every addition exact, so any order gives these."""


def run_read_only(tmp_path: Path, runs: int, *, home_read_only: bool) -> list[dict[str, Any]]:
    """``runs`` fresh interpreters running :data:`PROBE` against a read-only copy of the package."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("this test needs root and unshare(1) for a read-only bind mount (CI runs as root)")
    package, home = tmp_path / "site", tmp_path / "home"
    shutil.copytree(ROOT / "ring_ref", package / "ring_ref", ignore=shutil.ignore_patterns("__pycache__"))
    home.mkdir()
    mounts = f"mount --bind -o ro {package} {package}"
    if home_read_only:
        mounts += f" && mount --bind -o ro {home} {home}"
    (tmp_path / "probe.py").write_text(PROBE)
    probes = " && ".join([f"{sys.executable} probe.py"] * runs)
    env = {k: v for k, v in os.environ.items() if k not in ("RING_REF_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), PYTHONPATH=str(package))
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{mounts} && cd {tmp_path} && {probes}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_kernel_is_cached_per_user_when_the_package_directory_is_read_only(tmp_path: Path) -> None:
    first, second = run_read_only(tmp_path, 2, home_read_only=False)
    for probe in (first, second):
        assert probe["finite"] and probe["out"] == EXPECTED
    assert (first["loaded"], second["loaded"]) == (False, True)  # compiled and saved, then loaded
    assert first["path"] == second["path"]
    assert Path(first["path"]).parent == tmp_path / "home" / ".cache" / "ring_ref"
    assert [p.name for p in Path(first["path"]).parent.iterdir()] == [Path(first["path"]).name]
    assert not list((tmp_path / "site" / "ring_ref").rglob("__pycache__"))


def test_kernel_compiles_in_memory_when_nothing_is_writable(tmp_path: Path) -> None:
    (probe,) = run_read_only(tmp_path, 1, home_read_only=True)
    assert probe["finite"] and probe["out"] == EXPECTED
    assert (probe["loaded"], probe["path"]) == (False, "None")  # compiled in memory, nothing saved
    assert list((tmp_path / "home").iterdir()) == []


def test_a_forked_child_runs_the_kernel_on_threads_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent's worker threads are not in a forked child; the child starts its own and gets the bits."""
    import numpy as np
    import torch

    from ring_ref import ring_all_reduce
    from ring_ref._fast import _kernel

    before = torch.get_num_threads()
    monkeypatch.setattr(_kernel, "MIN_BYTES_PER_THREAD", 1)
    try:
        torch.set_num_threads(2)
        x = torch.randn(8, 2**14, dtype=torch.float64)
        want = ring_all_reduce(x, engine="fast")  # starts the parent's pool
        pid = os.fork()
        if pid == 0:  # the child
            got = ring_all_reduce(x, engine="fast")
            os._exit(0 if bool(np.array_equal(got.numpy(), want.numpy())) else 3)
        _, status = os.waitpid(pid, 0)
    finally:
        torch.set_num_threads(before)
    assert os.waitstatus_to_exitcode(status) == 0
