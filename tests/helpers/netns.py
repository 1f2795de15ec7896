"""Fast local "hosts" for integration tests: network namespaces with their own sshd.

Each host is a network namespace with one veth NIC on a private /24 that exists nowhere
but here: the other end of every veth joins a bridge in the root namespace, which holds
the subnet's .1 address so the controller (pytest, `provision`) reaches the hosts. Each
namespace runs its own ``/usr/sbin/sshd -D`` on port 22 of its address, with a host key
and an authorized client key generated in a temporary directory and a known_hosts file
that pins every host key (strict checking stays on). The hosts share the machine's
filesystem, processes and Python, so a test can use the repository's venv on them.

    cluster = netns.start(2, tmp_path)    # needs root (ip netns, sshd)
    cluster.inventory                     # a pyinfra inventory file, group "nodes"
    cluster.stop()                        # sshd by pid, namespaces, veths, bridge

Traffic stays on the bridge: the subnet is picked among 10.231.X.0/24 after checking that
no route of the machine covers it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# pyinfra's CLI package monkey-patches threading with gevent when first imported; if that
# happens after paramiko's threads have run (wait_for_ssh below), later SSH calls in this
# process hang. Import it before any SSH, as provision/testbed/lifecycle.py does.
import pyinfra_cli  # noqa: F401

from provision.inventory import SshTarget
from provision.remote import wait_for_ssh

NIC = "cl0"  # the NIC name inside every namespace


@dataclass
class NetnsHost:
    name: str  # inventory name: ns0, ns1, ...
    netns: str  # network namespace name (ip netns)
    address: str  # its address on the private subnet: SSH and cluster address
    sshd: subprocess.Popen  # its sshd, stopped by pid


@dataclass
class NetnsCluster:
    hosts: list[NetnsHost]  # in inventory order
    subnet: str  # the private /24, e.g. 10.231.17.0/24
    bridge: str  # root-namespace bridge holding the subnet's .1
    gateway: str  # the controller's address on the subnet (the bridge's)
    key: Path  # client private key authorized for root on every host
    known_hosts: Path  # pins every host's key
    inventory: Path  # pyinfra inventory file: nodes = [(name, data), ...]
    tmp: Path  # keys, configs and sshd logs
    veths: list[str] = field(default_factory=list)  # root-namespace veth ends

    def host_data(self, host: NetnsHost) -> dict:
        """pyinfra host data reaching ``host`` with strict host-key checking."""
        return {
            "ssh_hostname": host.address,
            "ssh_port": 22,
            "ssh_user": "root",
            "ssh_key": str(self.key),
            "ssh_known_hosts_file": str(self.known_hosts),
            "ssh_strict_host_key_checking": "yes",
            "cluster_address": host.address,
        }

    def write_inventory(self, path: Path | None = None, **extra: object) -> Path:
        """(Re)write an inventory for these hosts; ``extra`` keys go to every host."""
        path = path or self.inventory
        hosts = [(h.name, {**self.host_data(h), **extra}) for h in self.hosts]
        path.write_text(f"# written by tests/helpers/netns.py\nnodes = {hosts!r}\n")
        return path

    def exec(self, host: NetnsHost, *cmd: str) -> subprocess.CompletedProcess:
        """Run a command inside a host's namespace, from the controller."""
        return subprocess.run(["ip", "netns", "exec", host.netns, *cmd], capture_output=True, text=True, timeout=30)

    def stop(self) -> None:
        """Stop every sshd by pid, then delete namespaces, veths and the bridge."""
        for host in self.hosts:
            _stop_process(host.sshd)
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)
        for veth in self.veths:
            if _link_exists(veth):
                _ip("link", "del", veth, check=False)
        if _link_exists(self.bridge):
            _ip("link", "del", self.bridge, check=False)

    def leftovers(self) -> list[str]:
        """What stop() should have removed and did not (for the fixture's own check)."""
        names = set(_ip("netns", "list").stdout.split())
        left = [h.netns for h in self.hosts if h.netns in names]
        left += [link for link in (self.bridge, *self.veths) if _link_exists(link)]
        left += [f"sshd pid {h.sshd.pid}" for h in self.hosts if h.sshd.poll() is None]
        return left


def start(n: int, tmp: Path, extra_host_data: dict | None = None) -> NetnsCluster:
    """Create n namespace hosts with sshd and write tmp/inventory.py. Needs root."""
    if os.geteuid() != 0:
        raise PermissionError("network namespaces need root")
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o700)
    tag = _free_tag()
    net = _free_subnet()
    gateway = str(net.network_address + 1)
    cluster = NetnsCluster(
        [], str(net), f"pvbr{tag}", gateway, tmp / "client_key", tmp / "known_hosts", tmp / "inventory.py", tmp
    )
    try:
        _keygen(tmp / "client_key")
        _ip("link", "add", cluster.bridge, "type", "bridge")
        _ip("addr", "add", f"{gateway}/{net.prefixlen}", "dev", cluster.bridge)
        _ip("link", "set", cluster.bridge, "up")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        for i in range(n):
            cluster.hosts.append(_add_host(cluster, tag, i, str(net.network_address + 10 + i)))
        for host in cluster.hosts:
            wait_for_ssh(
                SshTarget(host.address, 22, "root", str(cluster.key), str(cluster.known_hosts), "yes"),
                timeout_s=20,
                interval_s=0.2,
            )
        cluster.write_inventory(**(extra_host_data or {}))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _add_host(cluster: NetnsCluster, tag: str, i: int, address: str) -> NetnsHost:
    netns, outside = f"pv-{tag}-{i}", f"pv{tag}h{i}"
    _ip("netns", "add", netns)
    _ip("link", "add", outside, "type", "veth", "peer", "name", NIC, "netns", netns)
    cluster.veths.append(outside)
    _ip("link", "set", outside, "master", cluster.bridge, "up")
    prefix = ipaddress.ip_network(cluster.subnet).prefixlen
    for args in (
        ("addr", "add", f"{address}/{prefix}", "dev", NIC),
        ("link", "set", NIC, "up"),
        ("link", "set", "lo", "up"),
    ):
        _ip("-n", netns, *args)
    host_key = cluster.tmp / f"host_key_{i}"
    _keygen(host_key)
    kind, blob = host_key.with_suffix(".pub").read_text().split()[:2]
    with open(cluster.known_hosts, "a") as f:
        f.write(f"{address} {kind} {blob}\n")
    (cluster.tmp / "authorized_keys").write_text((cluster.tmp / "client_key.pub").read_text())
    config = cluster.tmp / f"sshd_config_{i}"
    config.write_text(
        f"Port 22\nListenAddress {address}\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {cluster.tmp / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"PidFile {cluster.tmp / f'sshd_{i}.pid'}\nSubsystem sftp internal-sftp\n"
        "MaxSessions 32\n"
    )
    with open(cluster.tmp / f"sshd_{i}.log", "w") as log:
        # `ip netns exec` enters the namespace and execs sshd: the pid is sshd's own.
        sshd = subprocess.Popen(
            ["ip", "netns", "exec", netns, "/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    return NetnsHost(f"ns{i}", netns, address, sshd)


def _free_tag() -> str:
    names = set(_ip("netns", "list").stdout.split())
    while True:
        tag = secrets.token_hex(2)
        if not any(name.startswith(f"pv-{tag}-") for name in names) and not _link_exists(f"pvbr{tag}"):
            return tag


def _free_subnet() -> ipaddress.IPv4Network:
    """A 10.231.X.0/24 that no route on this machine covers (other than the default)."""
    routes = json.loads(_ip("-j", "route", "show", "table", "all").stdout or "[]")
    used = []
    for r in routes:
        with contextlib.suppress(ValueError):
            if r.get("dst") not in (None, "default"):
                used.append(ipaddress.ip_network(r["dst"], strict=False))
    candidates = list(range(1, 255))
    random.shuffle(candidates)
    for x in candidates:
        net = ipaddress.ip_network(f"10.231.{x}.0/24")
        if not any(net.overlaps(u) for u in used if u.version == 4):
            return net
    raise RuntimeError("no free 10.231.X.0/24 subnet")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _link_exists(name: str) -> bool:
    return _ip("link", "show", name, check=False).returncode == 0


def _stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


if __name__ == "__main__":  # manual use: python -m tests.helpers.netns 2 /tmp/nshosts
    c = start(int(sys.argv[1]), Path(sys.argv[2]))
    print(c.inventory, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        c.stop()
