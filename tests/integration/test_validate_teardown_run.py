"""validate's all-reduce teardown runs for real: it signals the group a pid file names only
when the file sits in the run's own 0700 directory and the process carries the run's marker."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provision.inventory import Node, SshTarget
from provision.settings import Settings
from provision.validate import netrun

NOBODY = 65534


def private_run(token: str, marked: bool) -> tuple[subprocess.Popen, Path]:
    """A stand-in for the all-reduce's torchrun: a session leader whose pid is in the pid
    file of its private directory, with or without the marker in its environment."""
    d = Path(netrun.private_dir(token))
    d.mkdir(mode=0o700)
    env = {"PATH": os.environ["PATH"], **({"PROVISION_ALLREDUCE": token} if marked else {})}
    proc = subprocess.Popen(["setsid", "sleep", "300"], env=env)
    (d / "pid").write_text(f"{proc.pid}\n")
    return proc, d


@pytest.fixture
def stray_runs() -> Iterator[list[tuple[subprocess.Popen, Path]]]:
    """Runs a test expects teardown to leave alone: killed and removed after the test."""
    runs: list[tuple[subprocess.Popen, Path]] = []
    yield runs
    for proc, d in runs:
        proc.kill()
        proc.wait()
        shutil.rmtree(d, ignore_errors=True)


def teardown(token: str) -> None:
    subprocess.run(["sh", "-c", netrun.teardown_command(token)], check=True, timeout=30)


def ended(proc: subprocess.Popen, within_s: float = 10) -> bool:
    """The process is gone or a zombie (gevent's wait does not see every exit here)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z" or proc.poll() is not None:
            return True
        time.sleep(0.05)
    return False


def test_teardown_stops_the_marked_group_and_removes_its_directory():
    token = f"n0-{secrets.token_hex(4)}"
    proc, d = private_run(token, marked=True)
    teardown(token)
    assert ended(proc)
    assert not d.exists()


def test_teardown_leaves_a_process_without_the_marker_alone(stray_runs):
    token = f"n0-{secrets.token_hex(4)}"
    proc, d = private_run(token, marked=False)
    stray_runs.append((proc, d))
    teardown(token)
    assert proc.poll() is None, "a process without the run's marker was signalled"


def test_teardown_ignores_a_directory_another_user_made_and_a_pid_file_of_garbage(stray_runs):
    token = f"n0-{secrets.token_hex(4)}"
    proc, d = private_run(token, marked=True)
    stray_runs.append((proc, d))
    os.chown(d, NOBODY, NOBODY)  # someone else's directory: its pid file is not ours to believe
    teardown(token)
    assert proc.poll() is None
    assert d.exists()  # and it is not ours to remove
    os.chown(d, 0, 0)
    (d / "pid").write_text(f"-{proc.pid}")  # a group id, or any non-number
    teardown(token)
    assert proc.poll() is None


def test_the_all_reduce_refuses_to_start_in_a_directory_someone_made_first():
    token = f"n0-{secrets.token_hex(4)}"
    d = Path(netrun.private_dir(token))
    d.mkdir(mode=0o777)
    node = Node("n0", SshTarget("127.0.0.1", 22, None, None, None, "yes"), (), Settings(cluster_address="127.0.0.1"))
    try:
        cmd = netrun.torchrun_command(node, 0, 1, node, "/nonexistent/agent.py", 0, token)
        r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        assert "File exists" in r.stderr
        assert list(d.iterdir()) == []  # no pid file, no log written into it
    finally:
        shutil.rmtree(d, ignore_errors=True)
