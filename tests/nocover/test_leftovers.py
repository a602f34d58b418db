"""The session's left-behind-process check finds a process a test forgot, orphaned or not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.common.leftovers import become_subreaper, left_behind


def test_a_forgotten_child_is_reported_and_an_ended_one_is_not() -> None:
    child = subprocess.Popen(["sleep", "300"])
    try:
        assert any(line.startswith(f"{child.pid}: sleep 300") for line in left_behind(grace_s=0.2))
    finally:
        child.kill()
        child.wait()
    assert not any(line.startswith(f"{child.pid}:") for line in left_behind(grace_s=0.2))


def test_an_orphaned_grandchild_is_reported() -> None:
    assert become_subreaper()
    # The middle process starts a grandchild (output to /dev/null) and exits at once, orphaning it.
    script = "import subprocess as s; print(s.Popen(['sleep', '300'], stdout=s.DEVNULL).pid)"
    middle = subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, check=True)
    orphan = int(middle.stdout)
    try:
        time.sleep(0.1)
        assert any(line.startswith(f"{orphan}: sleep 300") for line in left_behind(grace_s=0.2))
    finally:
        os.kill(orphan, signal.SIGKILL)
    assert not any(line.startswith(f"{orphan}:") for line in left_behind(grace_s=1.0))
