"""The deploy CLI starts the local Ray cluster with SIGINT ignored, so the cluster's processes keep running
through a terminal's Ctrl-C (sent to the whole foreground process group) until the CLI has stopped Serve."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.deploy import _children_ignore_ctrl_c


def _ignores_sigint(pid: int) -> bool:
    """Is SIGINT in the process's ignored-signal mask (Linux ``/proc/PID/status`` ``SigIgn``)?"""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError("no SigIgn line")


def _child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def test_processes_started_inside_ignore_ctrl_c_and_this_one_gets_its_handler_back():
    before = signal.getsignal(signal.SIGINT)
    with _children_ignore_ctrl_c():
        inside = _child()
    outside = _child()
    try:
        assert _ignores_sigint(inside.pid) and not _ignores_sigint(outside.pid)
        assert signal.getsignal(signal.SIGINT) is before
        inside.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C does to the group
        outside.send_signal(signal.SIGINT)
        assert outside.wait(timeout=10) != 0
        time.sleep(0.5)
        assert inside.poll() is None  # still running
    finally:
        for p in (inside, outside):
            p.kill()
            p.wait()
