"""Helpers for the tests that interrupt a command's process group (sweeps, Flower audits):
how the command is started, whether anything of its group is left, and the cleanup."""
from __future__ import annotations

import os
import signal
import subprocess
import time


def as_in_a_terminal() -> None:
    """In the command's process before it starts: SIGINT as a terminal's Ctrl-C finds it. A shell
    starts background jobs with SIGINT ignored, and so would a test suite run as one; the
    command rightly keeps an inherited ignore, which is not what these tests are about."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def group_ends(pgid: int, seconds: float = 10.0) -> bool:
    """Whether every process of the group is gone within `seconds`."""
    deadline = time.monotonic() + seconds
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not group_alive(pgid)


def kill_group(proc: subprocess.Popen) -> None:
    """The cleanup after a test: the whole group killed if its leader still runs."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
