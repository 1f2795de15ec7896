"""Connection retries against a real sshd on loopback behind a relay that drops the first
connections at once (tests/helpers/flaky_proxy): a transient drop is retried with a backoff
and the host is reached; a refused connection or a failed login is tried once."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import flaky_proxy, loopback_sshd
from tests.integration.test_facts_loopback import write_inventory


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = loopback_sshd.start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def _hostname_fact():
    from pyinfra.facts.server import Hostname

    return {"hostname": (Hostname, {})}


def _behind(sshd, proxy, tmp_path, **extra):
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts.read_text().replace(f"[127.0.0.1]:{sshd.port}", f"[127.0.0.1]:{proxy.port}"))
    data = {**sshd.host_data(), "ssh_port": proxy.port, "ssh_known_hosts_file": str(known), **extra}
    return write_inventory(tmp_path / "inv.py", [("flaky", data)])


def test_a_dropped_handshake_is_retried_and_the_host_is_reached(sshd, tmp_path):
    from provision import engine, inventory

    proxy = flaky_proxy.start(sshd.port, drop_first=2, work=tmp_path)
    try:
        cluster = inventory.load(_behind(sshd, proxy, tmp_path))
        result = engine.gather_facts(list(cluster.nodes), _hostname_fact())
        assert result.failed == {}
        assert result.facts["flaky"]["hostname"]
        assert proxy.accepted() == 3  # two dropped, the third relayed
    finally:
        proxy.stop()


def test_drops_past_the_retries_leave_the_host_unreachable_with_the_last_error(sshd, tmp_path):
    from provision import engine, inventory
    from provision.engine import connect

    proxy = flaky_proxy.start(sshd.port, drop_first=10, work=tmp_path)
    try:
        cluster = inventory.load(_behind(sshd, proxy, tmp_path))
        result = engine.gather_facts(list(cluster.nodes), _hostname_fact())
        assert "flaky" in result.failed
        assert connect.transient(result.failed["flaky"]), result.failed
        assert proxy.accepted() == connect.RETRIES + 1
    finally:
        proxy.stop()


def test_a_failed_login_is_not_retried(sshd, tmp_path):
    from provision import engine, inventory

    other_key = tmp_path / "not-authorized"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    proxy = flaky_proxy.start(sshd.port, drop_first=0, work=tmp_path)
    try:
        cluster = inventory.load(_behind(sshd, proxy, tmp_path, ssh_key=str(other_key)))
        result = engine.gather_facts(list(cluster.nodes), _hostname_fact())
        assert "Authentication error" in result.failed["flaky"]
        assert proxy.accepted() == 1
    finally:
        proxy.stop()
