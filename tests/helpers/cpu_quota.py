"""A CPU quota for the processes a test picks: a cgroup of its own with a hard cap on CPU
time (cgroup v2's cpu.max, or v1's CFS quota). A capped process is slow by a bound that
holds however busy the machine is, which signals (SIGSTOP cycles) and nice levels do not
give: the scheduler may run a task woken from a stop ahead of one that kept running."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CGROUP = Path("/sys/fs/cgroup")


@contextmanager
def cpu_quota(quota_us: int, period_us: int) -> Iterator[Path]:
    """A cgroup limited to ``quota_us`` of CPU time every ``period_us`` (all its processes'
    threads together): cgroup v2 (cpu.max) where the cpu controller is enabled, else v1's cpu
    hierarchy. Yields its cgroup.procs: a pid written there moves that process, every thread
    of it, into the group. Skips the test where neither exists. Removed afterwards, once the
    processes in it have exited or left."""
    name = f"provision-test-quota-{uuid.uuid4().hex[:8]}"
    # v2: the cpu controller enabled for the root's children (subtree_control), not only
    # present (cgroup.controllers): without it a new group has no cpu.max.
    enabled = CGROUP / "cgroup.subtree_control"
    if enabled.is_file() and "cpu" in enabled.read_text().split():
        group, limits = CGROUP / name, {"cpu.max": f"{quota_us} {period_us}"}
    elif (CGROUP / "cpu" / "cpu.cfs_quota_us").is_file():
        group = CGROUP / "cpu" / name
        limits = {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)}
    else:
        pytest.skip("no cgroup cpu controller to set a CPU quota with")
    group.mkdir()
    try:
        for file, value in limits.items():
            (group / file).write_text(value)
        yield group / "cgroup.procs"
    finally:
        _remove(group)


def release(procs: Path) -> None:
    """Move every process still in the group back to the root group, uncapped (a test's
    processes that outlive its quota: a run that goes on after the slow phase)."""
    root = procs.parent.parent / "cgroup.procs"
    for pid in procs.read_text().split():
        with contextlib.suppress(OSError):  # exited meanwhile
            root.write_text(pid)


def _remove(group: Path) -> None:
    """rmdir once the last task has left: a process that exited under the quota may take a
    few throttled periods to be gone from the group."""
    for _ in range(300):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    group.rmdir()  # the error, if it is still busy
