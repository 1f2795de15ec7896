"""Addresses and switches: loopback ports for SSH forwards, MACs, cluster addresses,
and the private vde switch that carries the cluster network (10.77.0.0/24). The switch
has no host interface: only the testbed's VMs are on it."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import time
from pathlib import Path

from provision.errors import TestbedError
from provision.testbed import procs
from provision.testbed.guest_files import CLUSTER_CIDR

FIRST_HOST = 10  # node i gets host number FIRST_HOST + i: node1 -> 10.77.0.11


def cluster_address(index: int, cidr: str = CLUSTER_CIDR) -> str:
    """Cluster address of node ``index`` (1-based)."""
    network = ipaddress.ip_network(cidr)
    return str(network.network_address + FIRST_HOST + index)


def cluster_prefix(cidr: str = CLUSTER_CIDR) -> int:
    return ipaddress.ip_network(cidr).prefixlen


def mac(network: int, index: int) -> str:
    """A locally administered MAC (qemu's 52:54:00 prefix): network 0 mgmt, 1 cluster."""
    return f"52:54:00:77:{network:02x}:{index:02x}"


def port_free(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:port right now. Bound as qemu's user network
    binds its forwards (SO_REUSEADDR): connections of a VM killed a moment ago stay in
    TIME_WAIT for a minute and do not stop qemu from listening there again, so they must
    not send the VM to another port (a run that knew the old one could not follow it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(taken: set[int]) -> int:
    """A loopback port the kernel says is free and that no node of ours has recorded."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port
    raise TestbedError("could not find a free loopback port for an SSH forward")


def wait_for_banner(port: int, timeout_s: float, host: str = "127.0.0.1") -> float:
    """Wait until the guest's sshd sends its "SSH-" banner through the forward; return the
    seconds it took. Raises TimeoutError.

    Only a cheap first stage: the forward accepts TCP before the guest listens, and SSH
    clients that connect that early leave half-open sessions behind. The caller still
    waits for a real SSH login (provision.remote.wait_for_ssh) afterwards.
    """
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            with socket.create_connection((host, port), timeout=5) as s:
                s.settimeout(10)
                if s.recv(64).startswith(b"SSH-"):
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{host}:{port}: no SSH banner within {timeout_s:.0f}s")


def start_switch(run_dir: Path, marker: str) -> int:
    """Start the cluster network's vde_switch (daemonized); return its pid."""
    run_dir.mkdir(parents=True, exist_ok=True)
    sock, pidfile = run_dir / "vde.ctl", run_dir / "vde.pid"
    pidfile.unlink(missing_ok=True)
    done = subprocess.run(
        ["vde_switch", "-sock", str(sock), "-daemon", "-pidfile", str(pidfile)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    deadline = time.monotonic() + 10
    while procs.read_pidfile(pidfile) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = procs.read_pidfile(pidfile)
    if done.returncode != 0 or not procs.owned(pid, marker):
        raise TestbedError(
            f"vde_switch did not start (exit {done.returncode}): {done.stderr.strip() or 'no pid in ' + str(pidfile)}"
        )
    return pid  # type: ignore[return-value]


def switch_socket(run_dir: Path) -> Path:
    return run_dir / "vde.ctl"
