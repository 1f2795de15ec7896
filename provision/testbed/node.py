"""One node's files and its qemu process: the copy-on-write overlay of the base image,
sparse data disks, its own host key and seed disk, and starting qemu for it."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from provision.errors import TestbedError
from provision.testbed import guest_files, keys, network, procs, qemu, seed
from provision.testbed.image import BaseImage
from provision.testbed.state import NodeRecord

START_TIMEOUT_S = 60  # qemu -daemonize returns once the VM is set up, well within this


@dataclass(frozen=True)
class NodeFiles:
    """Where one node's files live, all inside its folder of the state dir."""

    dir: Path  # state_dir/nodes/<name>

    @property
    def overlay(self) -> Path:
        return self.dir / "root.qcow2"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def seed_dir(self) -> Path:
        return self.dir / "seed"

    @property
    def seed_image(self) -> Path:
        return self.dir / "seed.img"

    def data_disk(self, k: int) -> Path:
        return self.dir / f"data{k}.img"


def files(state_dir: Path, name: str) -> NodeFiles:
    return NodeFiles(state_dir / "nodes" / name)


def serial(name: str, k: int) -> str:
    """Data disk serial, e.g. NVME-node1-1 (at most 20 characters)."""
    return f"NVME-{name}-{k}"


def create_disks(f: NodeFiles, base: BaseImage, record: NodeRecord, disk_bytes: int) -> None:
    """Make the overlay and data disks that do not exist yet (existing ones keep their data)."""
    f.dir.mkdir(parents=True, exist_ok=True)
    if not f.overlay.is_file():
        done = subprocess.run(
            ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base.root), "-F", "raw", str(f.overlay)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise TestbedError(f"qemu-img create {f.overlay} failed: {done.stderr.strip()}")
    for k in range(1, len(record.serials) + 1):
        disk = f.data_disk(k)
        if not disk.is_file():
            with open(disk, "wb"):
                pass
            os.truncate(disk, disk_bytes)  # sparse: costs no space until written


def write_seed(f: NodeFiles, record: NodeRecord, client_public_key: str, peers: dict[str, str]) -> None:
    """(Re)write the node's seed disk: host key, root's key, network, /etc/hosts."""
    keys.generate(f.host_key, f"root@{record.name}")
    networks = guest_files.node_networks(
        network.mac(0, record.index), network.mac(1, record.index), record.cluster_address, network.cluster_prefix()
    )
    seed.write_tree(f.seed_dir, f.host_key, client_public_key, networks, guest_files.node_hosts(record.name, peers))
    seed.make_image(f.seed_dir, f.seed_image)


def spec(f: NodeFiles, record: NodeRecord, base: BaseImage, accel: str, vde_sock: Path | None) -> qemu.VmSpec:
    disks = tuple(qemu.DataDisk(f.data_disk(k), s) for k, s in enumerate(record.serials, 1))
    return qemu.VmSpec(
        name=record.name,
        accel=accel,
        memory_mb=record.memory_mb,
        cpus=record.cpus,
        kernel=base.kernel,
        initrd=base.initrd,
        root_label=base.label,
        root_disk=f.overlay,
        seed_disk=f.seed_image,
        data_disks=disks,
        ssh_port=record.ssh_port,
        mgmt_mac=network.mac(0, record.index),
        cluster_mac=network.mac(1, record.index),
        vde_sock=vde_sock,
        run_dir=f.dir,
        disk_bps_total=record.disk_bps_total,
    )


class PortTaken(TestbedError):
    """qemu could not bind the SSH forward: another process took the port meanwhile."""


def start(vm: qemu.VmSpec, marker: str) -> int:
    """Start qemu daemonized; return its pid once it runs."""
    vm.pidfile.unlink(missing_ok=True)
    vm.console_log.unlink(missing_ok=True)
    try:
        done = subprocess.run(qemu.argv(vm), capture_output=True, text=True, timeout=START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{vm.name}: qemu did not start within {START_TIMEOUT_S}s") from None
    if done.returncode != 0:
        message = done.stderr.strip()[-400:]
        if "host forwarding rule" in message:
            raise PortTaken(f"{vm.name}: port {vm.ssh_port} taken: {message}")
        raise TestbedError(f"{vm.name}: qemu failed (exit {done.returncode}): {message}")
    pid = procs.read_pidfile(vm.pidfile)
    if not procs.owned(pid, marker):
        raise TestbedError(f"{vm.name}: qemu exited right after starting; see {vm.console_log}")
    return pid  # type: ignore[return-value]


def console_tail(f: NodeFiles, lines: int = 8) -> str:
    """The last lines of the node's serial console, for error messages."""
    try:
        text = (f.dir / "console.log").read_text(errors="replace")
    except OSError:
        return "(no console output)"
    return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())
