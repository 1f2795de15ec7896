"""Command builders for the data volume: mkfs, mdadm and fstab text, each value quoted.

Pure and tested directly; the volumes deploy runs what they build. Every mkfs and mdadm
--create of a disk that was not force-erased first checks with blkid -p that it is still
blank (blank_guard), the second guard behind the facts the step decided on.
"""

from __future__ import annotations

import shlex
import uuid

from provision.facts.blockdevices import BlockDevice
from provision.rules.disks import ARRAY_NAME, LABEL
from provision.settings import Settings

ARRAY_DEVICE = "/dev/md/data"  # where mdadm.conf names our array


MARKER = ".provision-volume"  # file at the volume's root saying who made it


# How long the data mount (and the NFS server and backups, which require it) waits at boot
# for the volume's device. nofail keeps boot itself from waiting, so this bound only decides
# when a missing disk is given up on: an md array appears only once udev's coldplug has
# run mdadm --incremental on every member, which took 37 s on a testbed node (past the
# 30 s this was) and can take long on a server with many NVMe drives; a mount given up on
# is never retried when the device appears later.
DEVICE_TIMEOUT = "300s"


MDADM_CONF = "/etc/mdadm/mdadm.conf"


def fstab_line(fs_uuid: str, settings: Settings) -> str:
    """The fstab entry: by UUID, noatime, nofail and a bounded wait for the device."""
    options = f"defaults,noatime,nofail,x-systemd.device-timeout={DEVICE_TIMEOUT}"
    passno = 2 if settings.filesystem == "ext4" else 0  # xfs is checked by the kernel on mount
    return f"UUID={fs_uuid} {fstab_field(settings.data_mount)} {settings.filesystem} {options} 0 {passno}"


def fstab_field(value: str) -> str:
    """A value as one fstab (and exports) field: space, tab, newline and backslash as the
    octal escapes fstab(5) reads. Paths are validated to hold none of these (values.py);
    escaping here keeps a field one field whatever reaches it."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\#" else c for c in value)


def mdadm_uuid(value: str) -> str:
    """A UUID as mdadm writes it (four groups of 8 hex digits joined by ':')."""
    digits = value.replace("-", "").replace(":", "").lower()
    return ":".join(digits[i : i + 8] for i in range(0, 32, 8))


def mdadm_conf_line(md_uuid: str) -> str:
    return f"ARRAY {ARRAY_DEVICE} metadata=1.2 UUID={mdadm_uuid(md_uuid)} name={ARRAY_NAME}"


def blank_guard(device: str) -> str:
    """Shell that exits 1 unless ``device`` is a block device on which ``blkid -p`` finds
    nothing (its exit status 2). Found (0), ambivalent (8) or any blkid error refuses too.

    This is the second guard, on the host at the moment of formatting, behind the facts
    the step decided on: mke2fs asks before overwriting a signature only on a terminal,
    and over SSH without one it goes ahead; mdadm --create --run never asks. A missing
    path is refused as well, since mke2fs would create a regular file there."""
    dev = shlex.quote(device)
    say = shlex.quote(f"refusing to format {device}")
    return (
        f"if [ ! -b {dev} ]; then echo {say}': not a block device' >&2; exit 1; fi; "
        f"blkid -p {dev} >/dev/null; rc=$?; "
        f"if [ $rc -eq 0 ]; then echo {say}': blkid -p finds a signature on it' >&2; exit 1; fi; "
        f'if [ $rc -ne 2 ]; then echo {say}": blkid -p failed (exit $rc)" >&2; exit 1; fi'
    )


def mkfs_command(settings: Settings, device: str, fs_uuid: str, force: bool) -> str:
    """mkfs with our label and a UUID chosen up front, so fstab is known before it runs.
    Without ``force`` the command first refuses a device holding any signature (blank_guard)."""
    if settings.filesystem == "xfs":
        mkfs = f"mkfs.xfs -q {'-f ' if force else ''}-L {LABEL} -m uuid={fs_uuid} {shlex.quote(device)}"
    else:
        mkfs = f"mkfs.ext4 -q {'-F ' if force else ''}-L {LABEL} -U {fs_uuid} {shlex.quote(device)}"
    return mkfs if force else f"{blank_guard(device)}; {mkfs}"


def mdadm_create_command(
    settings: Settings, disks: list[BlockDevice], md_uuid: str, wiped: list[BlockDevice] | None = None
) -> str:
    """mdadm --create of our array, guarded by blank_guard on each member not in ``wiped``
    (the forced disks whose signatures wipefs erased just before)."""
    members = " ".join(shlex.quote(stable_path(d)) for d in disks)
    guards = "".join(f"{blank_guard(stable_path(d))}; " for d in disks if d not in (wiped or []))
    return (
        f"{guards}mdadm --create {ARRAY_DEVICE} --run --metadata=1.2 --name={ARRAY_NAME} "
        f"--uuid={mdadm_uuid(md_uuid)} --level={settings.raid_level} "
        f"--raid-devices={len(disks)} {members}"
    )


def new_uuid() -> str:
    return str(uuid.uuid4())


def fstab_match(mount: str) -> str:
    """Extended regex for any fstab entry mounting something at ``mount``."""
    escaped = "".join(f"\\{c}" if c in ".[]()*+?{}|^$\\" else c for c in fstab_field(mount))
    return rf"^[^#[:space:]]+[[:space:]]+{escaped}[[:space:]]"


def stable_path(device: BlockDevice) -> str:
    return device.by_id[0] if device.by_id else device.path
