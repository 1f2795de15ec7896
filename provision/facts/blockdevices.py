"""Block devices with their stable ids, and whether each already holds data.

pyinfra's own ``hardware.BlockDevices`` reports mounted filesystems (df), not disks, so
this fact reads ``lsblk -J -O -b`` plus the ``/dev/disk/by-id`` symlinks. The volumes
step decides what it may format from this, so "holds data" errs on the side of yes:
a filesystem signature, a partition table, partitions, a RAID superblock or a mount.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api import FactBase

SEPARATOR = "--- by-id ---"


@dataclass(frozen=True)
class BlockDevice:
    """One whole disk (or an md array) as lsblk sees it."""

    name: str  # kernel name, e.g. vdb, nvme0n1; changes between boots, never stored
    path: str  # /dev/<name>
    type: str  # disk, raid0, raid1, ... (lsblk TYPE)
    size_bytes: int  # capacity
    serial: str | None  # the drive's serial, when it reports one
    model: str | None  # the drive's model string
    fstype: str | None  # filesystem or signature on the whole device (xfs, linux_raid_member)
    pttype: str | None  # partition table type (gpt, dos) when there is one
    uuid: str | None  # filesystem UUID, used for fstab entries
    label: str | None  # filesystem label
    mountpoints: tuple[str, ...]  # where the device or any child is mounted
    children: tuple[str, ...]  # names of partitions / arrays built on this device
    by_id: tuple[str, ...] = field(default_factory=tuple)  # /dev/disk/by-id links to it
    rotational: bool = False  # spinning disk

    @property
    def is_root(self) -> bool:
        """Holds the running system: / or /boot is on it or on one of its children."""
        return any(m in ("/", "/boot", "/boot/efi") for m in self.mountpoints)

    @property
    def holds(self) -> str | None:
        """What data this device already holds, in words, or None when it is blank."""
        if self.fstype == "linux_raid_member":
            return "a RAID superblock (linux_raid_member)"
        if self.fstype:
            return f"a {self.fstype} filesystem"
        if self.pttype:
            return f"a {self.pttype} partition table"
        if self.children:
            return f"partitions or arrays ({', '.join(self.children)})"
        if self.mountpoints:
            return f"mounted filesystems ({', '.join(self.mountpoints)})"
        return None

    def matches(self, wanted: str) -> bool:
        """Does a data_disks or force_format entry (a by-id path, or a bare serial) name
        this device? Never by kernel name (/dev/sdb): that can name another disk after a
        reboot, and a forced format would then erase the wrong one."""
        if wanted.startswith("/dev/"):
            return wanted in self.by_id
        return wanted == self.serial or any(link.endswith(f"-{wanted}") for link in self.by_id)


def _mountpoints(entry: dict[str, Any]) -> list[str]:
    points = entry.get("mountpoints") or [entry.get("mountpoint")]
    found = [p for p in points if p]
    for child in entry.get("children") or []:
        found += _mountpoints(child)
    return found


def _size(value: Any) -> int:
    # lsblk -b prints bytes as a number; older versions print a string.
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def parse_by_id(lines: list[str]) -> dict[str, list[str]]:
    """Parse `ls -l /dev/disk/by-id` lines into kernel name -> by-id paths."""
    out: dict[str, list[str]] = {}
    for line in lines:
        if " -> " not in line:
            continue
        left, target = line.rsplit(" -> ", 1)
        link = left.split()[-1]
        out.setdefault(target.rsplit("/", 1)[-1], []).append(f"/dev/disk/by-id/{link}")
    return out


def parse_lsblk(text: str, by_id: dict[str, list[str]] | None = None) -> list[BlockDevice]:
    """Parse `lsblk -J -O -b` (or plain `lsblk -J`) output into whole-device records."""
    by_id = by_id or {}
    devices = []
    for entry in json.loads(text).get("blockdevices", []):
        if entry.get("type") in ("loop", "rom") or str(entry.get("name", "")).startswith("zram"):
            continue
        name = entry["name"]
        devices.append(
            BlockDevice(
                name=name,
                path=entry.get("path") or f"/dev/{name}",
                type=entry.get("type", "disk"),
                size_bytes=_size(entry.get("size")),
                serial=entry.get("serial"),
                model=(entry.get("model") or None) and entry["model"].strip(),
                fstype=entry.get("fstype"),
                pttype=entry.get("pttype"),
                uuid=entry.get("uuid"),
                label=entry.get("label"),
                mountpoints=tuple(_mountpoints(entry)),
                children=tuple(c["name"] for c in entry.get("children") or []),
                by_id=tuple(sorted(by_id.get(name, []))),
                rotational=bool(entry.get("rota")),
            )
        )
    return devices


class BlockDevices(FactBase[list[BlockDevice]]):
    """Whole disks with stable ids and what they hold. Example:

    .. code:: python

        disks = host.get_fact(BlockDevices)
        blank = [d for d in disks if d.holds is None]
    """

    def requires_command(self) -> str:
        return "lsblk"

    def command(self) -> str:
        return f"lsblk -J -O -b && echo '{SEPARATOR}' && (ls -l /dev/disk/by-id/ 2>/dev/null || true)"

    def process(self, output: list[str]) -> list[BlockDevice]:
        split = output.index(SEPARATOR) if SEPARATOR in output else len(output)
        return parse_lsblk("\n".join(output[:split]), parse_by_id(output[split + 1 :]))
