"""Processes by pid, never by name. Every pid the testbed acts on was recorded by the
testbed itself (qemu -pidfile, vde_switch -pidfile), and before a signal is sent the
process's command line must still name the testbed's state dir: a pid reused by an
unrelated process after a crash is left alone."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def read_pidfile(path: Path) -> int | None:
    """The pid in a pidfile, or None when the file is missing or not a number."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    """True while the process exists and is not a zombie."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def owned(pid: int | None, marker: str) -> bool:
    """True if pid is alive and its command line contains ``marker`` (our state dir)."""
    if not alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return marker in cmdline


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until pid is gone (or a zombie); True if it went within the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.1)
    return not alive(pid)


def stop(pid: int | None, marker: str, hard: bool = False, grace_s: float = 10.0) -> bool:
    """Stop one of our processes: SIGKILL when hard, else SIGTERM then SIGKILL after grace.

    Returns True if a process of ours was running and is now gone; False when there was
    nothing of ours to stop. Raises OSError only if the process survives SIGKILL.
    """
    if pid is None or not owned(pid, marker):
        return False
    _signal(pid, signal.SIGKILL if hard else signal.SIGTERM)
    if wait_gone(pid, 2.0 if hard else grace_s):
        return True
    _signal(pid, signal.SIGKILL)
    if not wait_gone(pid, 5.0):
        raise OSError(f"process {pid} did not exit after SIGKILL")
    return True


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
