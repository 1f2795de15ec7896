"""The qemu command line for one node (a pure function of a VmSpec), and a minimal QMP
client for the changes made to a running VM (disk throttling, power button).

Why the command line looks the way it does (docs/ARCHITECTURE.md, "The testbed": measured pitfalls):
- the root disk is booted by label with the image's own kernel, because adding data
  disks shifts /dev/vdX names; NICs are pinned with net.ifnames=0;
- data disks carry ``serial=`` on ``-device`` so they appear as
  /dev/disk/by-id/virtio-<serial>;
- ``-daemonize`` with ``-pidfile`` gives a pid to stop later; ``-nographic`` cannot be
  combined with it, so the serial console goes to a file;
- ``-cpu host`` under KVM aborts on an MSR here, so KVM uses ``-cpu max`` as TCG does.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision.testbed.guest_files import SEED_SERIAL

SERIAL_MAX = 20  # virtio-blk serials longer than this are cut by the guest


@dataclass(frozen=True)
class DataDisk:
    """One extra virtio disk standing in for an NVMe drive."""

    path: Path  # raw sparse file on the controller
    serial: str  # virtio serial; the guest sees /dev/disk/by-id/virtio-<serial>

    @property
    def by_id(self) -> str:
        return f"/dev/disk/by-id/virtio-{self.serial}"


@dataclass(frozen=True)
class VmSpec:
    """Everything qemu needs to start one node."""

    name: str  # node name; also its hostname
    accel: str  # "kvm" or "tcg"
    memory_mb: int  # guest RAM
    cpus: int  # guest vCPUs (-smp)
    kernel: Path  # the image's vmlinuz
    initrd: Path  # the image's initrd
    root_label: str  # ext4 label of the root filesystem
    root_disk: Path  # qcow2 overlay of the base image
    seed_disk: Path | None  # per-node seed image (None for the accel probe)
    data_disks: tuple[DataDisk, ...]  # extra disks, in order
    ssh_port: int  # loopback port forwarded to the guest's port 22
    mgmt_mac: str  # MAC of eth0 (user networking)
    cluster_mac: str | None  # MAC of eth1 on the vde switch; None: no cluster NIC
    vde_sock: Path | None  # the vde switch's control directory
    run_dir: Path  # where the pidfile, QMP socket and console log go
    disk_bps_total: int | None = None  # throttle each data disk to this many bytes/s

    @property
    def pidfile(self) -> Path:
        return self.run_dir / "qemu.pid"

    @property
    def qmp_socket(self) -> Path:
        return self.run_dir / "qmp.sock"

    @property
    def console_log(self) -> Path:
        return self.run_dir / "console.log"


def kernel_cmdline(root_label: str, hostname: str) -> str:
    """Boot by filesystem label, serial console, classic NIC names, hostname per node.

    mitigations=off: a throwaway test VM has no secrets, and page-table isolation makes
    every syscall a TLB flush, which is slow under TCG emulation.
    """
    return (
        f"root=LABEL={root_label} rw console=ttyS0 net.ifnames=0 systemd.hostname={hostname} panic=-1 mitigations=off"
    )


# The guest CPU under TCG: Westmere (x86-64-v2: SSE4.2, POPCNT, AES-NI), no AVX. `max`
# offers AVX2, so glibc, OpenSSL, numpy and torch take their AVX2 paths, and qemu 7.2
# emulates those far slower than SSE on some hosts: on a 2-core Xeon host, python3 under
# qemu-x86_64 ran a hashing/zlib/json loop 2.9x slower with `-cpu max` than with
# Westmere, and a torch 256x256 matmul loop 32x slower (BENCHMARKS.md, issue 21). Every
# package the testbed installs runs on x86-64-v2. KVM keeps `max`: there it is the host's
# own CPU, at native speed.
TCG_CPU = "Westmere"


def accel_args(accel: str) -> list[str]:
    if accel not in ("kvm", "tcg"):
        raise ValueError(f"accel must be kvm or tcg, not {accel!r}")
    return ["-accel", accel, "-cpu", TCG_CPU if accel == "tcg" else "max"]


def argv(spec: VmSpec) -> list[str]:
    """The full qemu-system-x86_64 command line for a node."""
    args = [
        "qemu-system-x86_64",
        "-name",
        spec.name,
        *accel_args(spec.accel),
        "-smp",
        str(spec.cpus),
        "-m",
        str(spec.memory_mb),
        "-nodefaults",
        "-display",
        "none",
        "-serial",
        f"file:{spec.console_log}",
        "-qmp",
        f"unix:{spec.qmp_socket},server=on,wait=off",
        "-daemonize",
        "-pidfile",
        str(spec.pidfile),
        "-kernel",
        str(spec.kernel),
        "-initrd",
        str(spec.initrd),
        "-append",
        kernel_cmdline(spec.root_label, spec.name),
        "-device",
        "virtio-rng-pci",
    ]
    args += _nics(spec)  # first, so eth0 (management) and eth1 (cluster) keep their order
    args += _drive("root", spec.root_disk, "qcow2")
    if spec.seed_disk is not None:
        args += _drive("seed", spec.seed_disk, "raw", extra=",readonly=on", serial=SEED_SERIAL)
    for i, disk in enumerate(spec.data_disks, 1):
        args += _drive(f"data{i}", disk.path, "raw", extra=_throttle(spec.disk_bps_total), serial=disk.serial)
    return args


def _nics(spec: VmSpec) -> list[str]:
    args = [
        "-netdev",
        f"user,id=mgmt,hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
        "-device",
        f"virtio-net-pci,netdev=mgmt,mac={spec.mgmt_mac}",
    ]
    if spec.cluster_mac and spec.vde_sock:
        args += [
            "-netdev",
            f"vde,id=cluster,sock={spec.vde_sock}",
            "-device",
            f"virtio-net-pci,netdev=cluster,mac={spec.cluster_mac}",
        ]
    return args


def _drive(drive_id: str, path: Path, fmt: str, extra: str = "", serial: str = "") -> list[str]:
    device = f"virtio-blk-pci,drive={drive_id},id=dev-{drive_id}"
    if serial:
        if len(serial) > SERIAL_MAX:
            raise ValueError(f"disk serial {serial!r} is longer than {SERIAL_MAX} characters")
        device += f",serial={serial}"
    return ["-drive", f"file={path},format={fmt},if=none,id={drive_id}{extra}", "-device", device]


def _throttle(bps_total: int | None) -> str:
    return f",throttling.bps-total={bps_total}" if bps_total else ""


def qmp(sock: Path, command: str, arguments: dict[str, Any] | None = None, timeout_s: float = 10.0) -> Any:
    """Run one QMP command on a VM's monitor socket; return its "return" value."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(str(sock))
        stream = s.makefile("rw")
        _reply(stream)  # greeting
        for cmd, args in (("qmp_capabilities", None), (command, arguments)):
            stream.write(json.dumps({"execute": cmd, **({"arguments": args} if args else {})}) + "\n")
            stream.flush()
            reply = _reply(stream)
        if "error" in reply:
            raise RuntimeError(f"QMP {command}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return")


def _reply(stream: Any) -> dict[str, Any]:
    """The next reply or greeting, skipping asynchronous events."""
    while True:
        line = stream.readline()
        if not line:
            raise ConnectionError("QMP socket closed")
        message: dict[str, Any] = json.loads(line)
        if "event" not in message:
            return message


def throttle_args(device_id: str, bps_total: int | None) -> dict[str, Any]:
    """Arguments of QMP block_set_io_throttle for one data disk (0 means unlimited)."""
    limits = {k: 0 for k in ("bps", "bps_rd", "bps_wr", "iops", "iops_rd", "iops_wr")}
    limits["bps"] = bps_total or 0
    # virtio-blk-pci is a PCI proxy; the block backend hangs off its virtio-backend child
    return {"id": f"/machine/peripheral/{device_id}/virtio-backend", **limits}
