"""`provision verify` checks each host in its own pytest process, side by side and under its
own deadline: a host that hangs is reported as timed out, and the others keep their results.
A host's checks share one SSH login."""

from __future__ import annotations

import time
from pathlib import Path

from provision import verify
from provision.inventory import Cluster, Node, SshTarget
from provision.settings import Settings
from tests.helpers import loopback_sshd

SUITE = """
import os, time

def test_this_host(host):
    name = host.backend.get_hostname()
    if name == "hung":
        time.sleep(120)
    assert name != "broken"
"""


def _node(name: str) -> Node:
    ssh = SshTarget("127.0.0.1", 22, "root", None, None, "yes")  # never dialled: the suite uses no command
    return Node(name=name, ssh=ssh, groups=(), settings=Settings())


def test_a_hung_host_times_out_and_the_others_keep_their_results(tmp_path, monkeypatch) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_hosts.py").write_text(SUITE)
    monkeypatch.setattr(verify, "SUITE", suite)
    cluster = Cluster(tmp_path / "inv.py", tuple(_node(n) for n in ("good", "hung", "broken")))

    started = time.monotonic()
    result = verify.run(cluster, str(tmp_path / "work"), extra=["-v"], timeout_s=20)
    assert time.monotonic() - started < 120  # the hung host was stopped at its deadline, not slept out

    assert result.exit_code == verify.INTERRUPTED  # a host not checked outranks a failed check
    sections = dict(part.split("\n", 1) for part in result.output.split(verify.HOST_HEADER)[1:])
    assert "1 passed" in sections["good"]
    assert "1 failed" in sections["broken"]
    assert "hung timed out after 20 s" in sections["hung"]


CHECKS = """
import pytest

@pytest.mark.parametrize("k", range(6))
def test_a_command(host, k):
    assert host.run(f"echo {k}").stdout.strip() == str(k)
"""


def test_every_check_on_a_host_shares_one_login_and_nothing_outlives_the_run(tmp_path, monkeypatch) -> None:
    """pytest-testinfra starts an ssh per command; through the shared control socket they
    are one login (sshd logs each), and the shared connection is closed when the host is done."""
    sshd = loopback_sshd.start(tmp_path / "sshd")
    try:
        suite = tmp_path / "suite"
        suite.mkdir()
        (suite / "test_checks.py").write_text(CHECKS)
        monkeypatch.setattr(verify, "SUITE", suite)
        ssh = SshTarget("127.0.0.1", sshd.port, "root", str(sshd.key), str(sshd.known_hosts), "yes")
        cluster = Cluster(tmp_path / "inv.py", (Node(name="box", ssh=ssh, groups=(), settings=Settings()),))
        work = tmp_path / "work"
        result = verify.run(cluster, str(work), timeout_s=120)
        assert result.exit_code == 0, result.output
        assert "6 passed" in result.output, result.output
        logins = (tmp_path / "sshd" / "sshd.log").read_text().count("Accepted publickey")
        assert logins == 1, (tmp_path / "sshd" / "sshd.log").read_text()
        assert _processes_mentioning(str(work / "ssh_config")) == []
    finally:
        sshd.stop()


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline)
    return found
