"""Processes the test suite left behind: the check behind the session fixture in ``tests/conftest.py``.

At the start of the session the pytest process becomes a *child subreaper*
(Linux ``PR_SET_CHILD_SUBREAPER``): a process whose parent dies is then
re-parented to pytest instead of to init, so nothing a test starts can escape
the check by being orphaned.  At the end, every child of pytest still alive
after a grace period is reported, except multiprocessing's own long-lived
helpers (the forkserver and the resource tracker), which end with pytest.
Zombie children are reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from pathlib import Path
from typing import Final

__all__ = ["become_subreaper", "left_behind"]

_PR_SET_CHILD_SUBREAPER: Final = 36
_EXPECTED: Final = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (Linux only); whether that worked."""
    with contextlib.suppress(OSError, AttributeError):
        return bool(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1) == 0)
    return False


def _children() -> dict[int, tuple[str, str]]:
    """This process' children: pid -> (state letter, command line)."""
    me, found = os.getpid(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == me:
            found[int(entry.name)] = (fields[0], cmdline.strip())
    return found


def left_behind(grace_s: float = 5.0) -> list[str]:
    """Children still alive after ``grace_s`` seconds (zombies reaped), as ``"pid: command"`` lines."""
    if not Path("/proc/self/stat").exists():
        return []
    give_up = time.monotonic() + grace_s
    while True:
        alive = {}
        for pid, (state, cmdline) in _children().items():
            if state == "Z":
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            elif not any(name in cmdline for name in _EXPECTED):
                alive[pid] = cmdline
        if not alive or time.monotonic() >= give_up:
            return [f"{pid}: {cmdline or '?'}" for pid, cmdline in sorted(alive.items())]
        time.sleep(0.1)
