"""The testbed for real: qemu VMs with strict SSH host keys, data disks by id, a
private cluster network, and a lifecycle that stops exactly what it started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provision import inventory as inventory_lib
from provision import remote
from provision.inventory import SshTarget
from provision.testbed import Testbed, apt_sources, keys, procs

PROVISION = [sys.executable, "-m", "provision"]


def _cluster(shared):
    return inventory_lib.load(shared.inventory_path)


def _run(node, command: str) -> remote.CommandResult:
    result = remote.run(node, command, timeout=60)
    assert result.exited != -1, result.stderr
    return result


def test_inventory_passes_inventory_check(testbed) -> None:
    done = subprocess.run(
        [*PROVISION, "inventory", "check", str(testbed.inventory_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    hosts = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    assert set(hosts) == {"node1", "node2"}
    assert "storage" in hosts["node1"]["groups"]
    assert "storage" not in hosts["node2"]["groups"]


def test_nodes_answer_ssh_with_their_own_pinned_host_keys(testbed) -> None:
    cluster = _cluster(testbed)
    for node in cluster.nodes:
        assert node.ssh.strict_host_key_checking == "yes"
        assert _run(node, "hostname").stdout.strip() == node.name
    served = {n.name: _run(n, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1] for n in cluster.nodes}
    assert served["node1"] != served["node2"]  # each node has its own key


def test_a_wrong_pinned_host_key_is_refused(testbed, tmp_path: Path) -> None:
    node1, _node2 = _cluster(testbed).nodes
    node2_key = testbed.testbed.state_dir / "nodes" / "node2" / "ssh_host_ed25519_key"
    wrong = tmp_path / "known_hosts"
    keys.write_known_hosts(wrong, [(node1.ssh.port, keys.public(node2_key))])
    target = SshTarget("127.0.0.1", node1.ssh.port, "root", node1.ssh.key, str(wrong), "yes")
    with pytest.raises(remote.RemoteError, match="host key refused"):
        remote.wait_for_ssh(target, timeout_s=20)


def test_each_node_has_its_data_disks_by_id(testbed) -> None:
    for node in _cluster(testbed).nodes:
        disks = node.settings.data_disks
        assert disks == [f"/dev/disk/by-id/virtio-NVME-{node.name}-{k}" for k in (1, 2)]
        result = _run(node, " && ".join(f"test -b {d}" for d in disks))
        assert result.ok, f"{node.name}: {result.stderr}"


def test_each_node_has_its_cluster_address_on_eth1(testbed) -> None:
    for node in _cluster(testbed).nodes:
        shown = _run(node, "ip -4 -o addr show dev eth1").stdout
        assert f"inet {node.cluster_address}/24" in shown


def test_node1_reaches_node2_over_the_cluster_network(testbed) -> None:
    node1, node2 = _cluster(testbed).nodes
    ping = _run(node1, f"ping -c 2 -W 5 -I eth1 {node2.cluster_address}")
    assert ping.ok, ping.stdout + ping.stderr
    connect = _run(
        node1,
        'python3 -c "import socket; s = socket.create_connection(('
        f"'{node2.cluster_address}', 22), timeout=10); print(s.recv(64).decode())\"",
    )
    assert connect.stdout.startswith("SSH-2.0-"), connect.stderr


def test_guests_use_the_controllers_apt_mirror(testbed) -> None:
    mirror = apt_sources.debian_mirror(apt_sources.read_system_sources())
    node1 = _cluster(testbed).nodes[0]
    sources = _run(node1, "cat /etc/apt/sources.list.d/debian.sources").stdout
    assert f"URIs: {mirror.uri}\n" in sources
    assert _run(node1, "test ! -e /etc/apt/sources.list").ok


def test_status_reports_running_nodes_as_json(testbed) -> None:
    done = subprocess.run(
        [*PROVISION, "testbed", "status", "--json", "--state-dir", str(testbed.testbed.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    nodes = json.loads(done.stdout)["nodes"]
    assert [(n["name"], n["state"]) for n in nodes] == [("node1", "running"), ("node2", "running")]
    assert all(procs.alive(n["pid"]) for n in nodes)


def test_provision_facts_sees_hostnames_disks_and_cluster_nics(testbed) -> None:
    done = subprocess.run(
        [*PROVISION, "facts", str(testbed.inventory_path), "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    hosts = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    for name, address in (("node1", "10.77.0.11"), ("node2", "10.77.0.12")):
        host = hosts[name]
        assert host["hostname"] == name
        assert host["os"]["id"] == "debian"
        by_id = {i for d in host["block_devices"] for i in d["by_id"]}
        assert {f"/dev/disk/by-id/virtio-NVME-{name}-{k}" for k in (1, 2)} <= by_id
        eth1 = next(n for n in host["nics"] if n["name"] == "eth1")
        assert f"{address}/24" in eth1["addresses"]


def test_lifecycle_up_is_idempotent_restarts_killed_nodes_and_down_leaves_nothing(tmp_path: Path) -> None:
    """A second, one-node testbed (the shared one stays up): up twice, kill, up, down."""
    state_dir, inventory = tmp_path / "state", tmp_path / "testbed.py"
    tb = Testbed(state_dir, inventory_path=inventory)
    try:
        first = tb.up(nodes=1, disks=1, memory_mb=1024)
        again = tb.up(nodes=1, disks=1, memory_mb=1024)
        assert again[0].pid == first[0].pid  # running nodes stay as they are
        # /etc/hosts is seeded once; what the node adds to it must survive a restart.
        node = inventory_lib.load(inventory).nodes[0]
        # sync: a hard stop is a power cut, and an unsynced write would be lost with it.
        assert _run(node, "echo '10.77.0.99 added-by-test' >> /etc/hosts && sync").ok
        assert tb.stop_node("node1", hard=True)
        assert not procs.alive(first[0].pid)
        assert [r.running for r in tb.status()] == [False]
        restarted = tb.up(nodes=1, disks=1, memory_mb=1024)
        assert restarted[0].running
        assert restarted[0].pid != first[0].pid
        node = inventory_lib.load(inventory).nodes[0]
        assert node.ssh.port == restarted[0].ssh_port
        hosts = _run(node, "cat /etc/hosts").stdout
        assert "added-by-test" in hosts, hosts
        assert "node1" in hosts, hosts
        recorded = [restarted[0].pid, json.loads((state_dir / "state.json").read_text())["vde_pid"]]
    finally:
        stopped = tb.down()
    assert sorted(stopped) == sorted(recorded)
    assert not any(procs.alive(pid) for pid in recorded)
    assert not state_dir.exists()
    assert not inventory.exists()
