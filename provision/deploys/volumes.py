"""The `volumes` step: one data volume per host, from its SSD data disks.

One disk gets a filesystem directly; several are assembled with mdadm (RAID0 unless
``raid_level`` says otherwise) and recorded in /etc/mdadm/mdadm.conf. The filesystem
(xfs, or ext4) is mounted at ``data_mount`` by UUID with ``noatime,nofail`` and a device
timeout, so a missing disk never hangs boot.

Never destroy data. A disk holding a filesystem, partition table or RAID superblock that
provision did not make is refused, naming the host, the disk and what it holds, unless
that disk is listed in the host's ``force_format`` (``provision up --force-format
HOST:DISK`` adds it for one run; see ``apply_force_format``). Disks are named only by
/dev/disk/by-id path or serial, never by kernel name (/dev/sdb), which can point at
another disk after a reboot. Our own volume is recognised by its filesystem label
``PVDATA`` or its md array name ``provision:data``, so a re-run changes nothing and never
reformats, even when the disk is in force_format. A raid_level the disks cannot make is
refused before anything is erased. On the host, every mkfs and mdadm --create of a disk
that was not force-erased first checks with ``blkid -p`` that it is still blank, and
refuses otherwise (or when blkid fails): see ``blank_guard``.

For the other steps and commands (pure functions, no host contacted):

- ``choose_disks(settings, devices, hostname)`` -> (disks, problems): which disks the volume
  is built from. The step leaves notes saying which disks it took and which it left out,
  so ``provision plan`` and ``provision up`` show them; ``describe_choice`` gives the lines.
- ``check_disks(settings, devices, hostname)`` -> problems: what preflight refuses before
  anything changes (missing disks, root disks, disks holding someone else's data).
- ``apply_force_format(cluster, ["node1:/dev/disk/by-id/..."])`` -> cluster with each
  host's force_format extended (the `--force-format` flag of `provision up`).
"""

from __future__ import annotations

import shlex
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Mounts
from pyinfra.operations import files, server

from provision.engine import Step, current_node, note, refuse
from provision.facts.blockdevices import BlockDevice, BlockDevices
from provision.facts.filesystems import DeviceFilesystem, Filesystem
from provision.operations.apt import install
from provision.operations.stamps import follow_up
from provision.operations.volumes import (
    ARRAY_DEVICE,
    MARKER,
    MDADM_CONF,
    fstab_line,
    fstab_match,
    mdadm_conf_line,
    mdadm_create_command,
    mkfs_command,
    new_uuid,
    stable_path,
)
from provision.rules.disks import (
    ARRAY_NAME,
    LABEL,
    OURS_FILESYSTEMS,
    _choice_lines,
    applies,
    choose_disks,
    disk_name,
    is_ours,
)
from provision.settings import Settings

# --- what the deploy writes (pure, tested directly) ---


def _refuse(problems: list[str]) -> None:
    refuse("volumes", "; ".join(problems))


def _wipe_forced(settings: Settings, disks: list[BlockDevice]) -> list[BlockDevice]:
    """Erase signatures on forced disks (only those; blank ones need nothing). choose_disks
    let a disk holding data through only when it is forced, so these are the forced ones."""
    forced = [d for d in disks if d.holds is not None and not is_ours(d)]
    for d in forced:
        server.shell(name=f"Erase {disk_name(d)} (force_format)", commands=[f"wipefs -a {shlex.quote(stable_path(d))}"])
    return forced


def _make_filesystem(settings: Settings, device: str, force: bool) -> str:
    fs_uuid = new_uuid()
    server.shell(
        name=f"Make {settings.filesystem} on {device}",
        commands=["udevadm settle", mkfs_command(settings, device, fs_uuid, force), "udevadm settle"],
    )
    return fs_uuid


def _single_disk(settings: Settings, disk: BlockDevice) -> str:
    if is_ours(disk) and disk.uuid:
        return disk.uuid
    return _make_filesystem(settings, stable_path(disk), bool(_wipe_forced(settings, [disk])))


def _array(settings: Settings, disks: list[BlockDevice], where: str, conf_ops: list[Any]) -> str | None:
    """Create or adopt the md array; return the filesystem UUID, or None after a refusal.
    The mdadm.conf operation goes into ``conf_ops`` (the initramfs follows it)."""
    if all(is_ours(d) for d in disks):
        running = {c for d in disks for c in d.children}
        if len(running) != 1 or not disks[0].uuid:
            _refuse(
                [
                    f"{where}: our array {ARRAY_NAME} on {', '.join(disk_name(d) for d in disks)} is "
                    "not running; run `mdadm --assemble --scan` on the host, then `provision up` again"
                ]
            )
            return None
        md_device = f"/dev/{running.pop()}"
        conf_ops.append((_record_array(disks[0].uuid), mdadm_conf_line(disks[0].uuid)))
        fs = host.get_fact(DeviceFilesystem, device=md_device) or Filesystem(None, None, None, "no answer")
        if fs.error:
            _refuse([f"{where}: cannot tell what our array {md_device} holds ({fs.error}); refusing to format it"])
            return None
        if fs.type is None:
            return _make_filesystem(settings, md_device, force=False)
        if fs.label == LABEL and fs.type in OURS_FILESYSTEMS and fs.uuid:
            return fs.uuid
        _refuse([f"{where}: our array {md_device} holds a {fs.type} filesystem not made by provision"])
        return None
    wiped = _wipe_forced(settings, disks)
    md_uuid = new_uuid()
    server.shell(
        name=f"Create RAID{settings.raid_level} {ARRAY_DEVICE}",
        commands=[mdadm_create_command(settings, disks, md_uuid, wiped), "udevadm settle"],
    )
    conf_ops.append((_record_array(md_uuid), mdadm_conf_line(md_uuid)))
    # Stale signatures from an earlier array on wiped members can show through the new one.
    return _make_filesystem(settings, ARRAY_DEVICE, force=bool(wiped))


def _record_array(md_uuid: str) -> Any:
    """mdadm.conf names the array (the initramfs gets it at the end of the step)."""
    return files.line(
        name="Record the array in mdadm.conf",
        path=MDADM_CONF,
        line=f"^ARRAY .*name={ARRAY_NAME}",
        replace=mdadm_conf_line(md_uuid),
    )


def _update_initramfs(conf_ops: list[Any]) -> None:
    """Last, so a slow initramfs rebuild never keeps the volume from being mounted."""
    if conf_ops:
        conf, line = conf_ops[-1]
        follow_up(
            "Update initramfs (mdadm.conf changed)", "initramfs-mdadm", [line], ["update-initramfs -u"], conf.did_change
        )


def _mount(settings: Settings, fs_uuid: str) -> None:
    mount = settings.data_mount
    files.directory(name=f"Mount point {mount}", path=mount, present=True)
    fstab = files.line(
        name=f"fstab entry for {mount}",
        path="/etc/fstab",
        line=fstab_match(mount),
        replace=fstab_line(fs_uuid, settings),
        extended_regex=True,
    )
    mounted = mount in (host.get_fact(Mounts) or {})
    follow_up(
        "Reload systemd (fstab changed)",
        "volumes-fstab",
        [fstab_line(fs_uuid, settings)],
        ["systemctl daemon-reload"],
        fstab.did_change,
    )
    if not mounted:
        server.shell(name=f"Mount {mount}", commands=[f"mount {shlex.quote(mount)}"])
    files.put(
        name="Mark the volume as made by provision",
        dest=f"{mount}/{MARKER}",
        mode="644",
        src=StringIO(f"made by provision (volumes step); label {LABEL}, array {ARRAY_NAME}\n"),
    )


def _mount_conflict(settings: Settings, disks: list[BlockDevice], where: str) -> list[str]:
    """data_mount already mounted from a device that is not our volume."""
    mounted = (host.get_fact(Mounts) or {}).get(settings.data_mount)
    if not mounted:
        return []
    ours = {d.path for d in disks} | {f"/dev/{c}" for d in disks for c in d.children}
    if mounted["device"] in ours or all(is_ours(d) for d in disks):
        return []
    return [
        f"{where}: {settings.data_mount} is already mounted from {mounted['device']}; "
        "unmount it or choose another data_mount"
    ]


@deploy("Data volume")
def data_volume() -> None:
    """Build (or adopt) the data volume and mount it; refuse anything that risks data."""
    node = current_node()
    settings = node.settings
    devices = host.get_fact(BlockDevices) or []
    disks, problems = choose_disks(settings, devices, node.name)
    for line in _choice_lines(settings, devices, disks, problems):
        note(f"volumes: {line}")  # plan and the up summary show exactly which disks were taken
    problems = problems or _mount_conflict(settings, disks, node.name)
    if problems:
        _refuse(problems)
        return
    if not disks:
        return
    packages = ["xfsprogs" if settings.filesystem == "xfs" else "e2fsprogs"]
    install("Install volume tools", packages + (["mdadm"] if len(disks) > 1 else []), settings.apt_lock_wait_s)
    conf_ops: list[Any] = []  # this pass's (mdadm.conf operation, its line), for the initramfs update at the end
    fs_uuid = _single_disk(settings, disks[0]) if len(disks) == 1 else _array(settings, disks, node.name, conf_ops)
    if fs_uuid:
        _mount(settings, fs_uuid)
    _update_initramfs(conf_ops)


step = Step("volumes", data_volume, "SSD data volume: mdadm RAID, xfs/ext4, fstab by UUID", applies)
