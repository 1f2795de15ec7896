"""The host lock of `provision up` (up/host_lock.py) against a real sshd on loopback, with
the real flock on this machine: a second run is refused and told who holds the host; the
lock is let go at the end of the run, and when the holding controller is killed.

Both inventory hosts are this machine ("one" as 127.0.0.1, "two" as localhost): one run
finds its own lock under the second name and goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from provision import inventory
from provision.up import host_lock
from tests.helpers import loopback_sshd
from tests.integration.test_facts_loopback import write_inventory

HOLDER = """
import sys, time
from provision import inventory
from provision.up import host_lock
with host_lock.held(inventory.load(sys.argv[1])) as locks:
    print("held" if locks.held else f"refused {locks.refused}", flush=True)
    time.sleep(600)
"""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = loopback_sshd.start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def _inventory(sshd, tmp_path, name: str = "inv.py"):
    known = tmp_path / "known_hosts"
    lines = sshd.known_hosts.read_text()
    known.write_text(lines + lines.replace("127.0.0.1", "localhost"))
    one = {**sshd.host_data(), "cluster_address": "127.0.0.3", "min_root_free_gb": 1}
    two = {
        **sshd.host_data(),
        "ssh_hostname": "localhost",
        "ssh_known_hosts_file": str(known),
        "cluster_address": "127.0.0.2",
        "min_root_free_gb": 1,
    }
    return write_inventory(tmp_path / name, [("one", one), ("two", two)])


def test_a_second_run_is_refused_with_the_holder_named_until_the_first_lets_go(sshd, tmp_path):
    first_inv, second_inv = _inventory(sshd, tmp_path, "first.py"), _inventory(sshd, tmp_path, "second.py")
    with host_lock.held(inventory.load(first_inv)) as first:
        # The two names are one machine: one of them takes the lock (whichever is first), the
        # other finds it held by this same run and goes on.
        assert len(first.held) == 1
        assert first.refused == {}
        with host_lock.held(inventory.load(second_inv)) as second:
            assert second.held == {}
            assert set(second.refused) == {"one", "two"}
            why = second.refused["two"]
            assert why.startswith(f"another run holds this host: provision up of {first_inv} from ")
            assert f"(pid {os.getpid()}, started " in why
            assert f"[run {first.token}]" in why
    with host_lock.held(inventory.load(second_inv)) as again:  # the first let go at its end
        assert len(again.held) == 1
        assert again.refused == {}


def test_a_killed_controller_lets_go_of_the_host(sshd, tmp_path):
    inv = _inventory(sshd, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(inv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read() if holder.poll() is not None else ""
        with host_lock.held(inventory.load(inv)) as refused:
            assert f"(pid {holder.pid}, started " in refused.refused["one"]
    finally:
        holder.send_signal(signal.SIGKILL)  # no release: the connection dies with the process
        holder.wait(timeout=30)
    deadline = time.monotonic() + 30
    while True:  # sshd sees the connection close, the remote `cat` its stdin end
        with host_lock.held(inventory.load(inv)) as locks:
            if locks.held:
                break
        assert time.monotonic() < deadline, f"still held 30 s after the holder died: {locks.refused}"
        time.sleep(0.5)


def test_up_on_hosts_another_run_holds_fails_them_at_once_naming_it(sshd, tmp_path):
    inv, other = _inventory(sshd, tmp_path), _inventory(sshd, tmp_path, "other.py")

    def up() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "provision", "up", str(inv), "--only", "preflight", "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PROVISION_STATE_DIR": str(tmp_path / "state")},
        )

    with host_lock.held(inventory.load(other)):
        done = up()
    assert done.returncode == 1, done.stderr
    hosts = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    for name in ("one", "two"):
        assert hosts[name]["steps"] == []  # nothing ran on it
        (failure,) = hosts[name]["failures"]
        assert failure.startswith(f"lock: another run holds this host: provision up of {other} from ")
        assert hosts[name]["reachable"] is True  # it answered: held, not unreachable
    done = up()  # the other run let go
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_host_whose_lock_cannot_be_asked_for_is_reported_unreachable(tmp_path):
    # It said "reachable": true in up's JSON while nothing answered on its port.
    dead = {"ssh_hostname": "127.0.0.1", "ssh_port": loopback_sshd.free_port(), "cluster_address": "127.0.0.2"}
    inv = write_inventory(tmp_path / "inv.py", [("gone", dead)])
    done = subprocess.run(
        [sys.executable, "-m", "provision", "up", str(inv), "--only", "preflight", "--json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PROVISION_STATE_DIR": str(tmp_path / "state")},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    (host,) = json.loads(done.stdout)["hosts"]
    assert host["reachable"] is False, host
    assert host["failures"][0].startswith("lock: could not take the host's lock: ")
