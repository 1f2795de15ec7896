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
import uuid
from dataclasses import dataclass, replace
from io import StringIO

from pyinfra import host
from pyinfra.api import FactBase, deploy
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.server import Mounts
from pyinfra.operations import apt, files, server

from provision.engine import Step, current_node, note, refuse
from provision.errors import InputError, Problem
from provision.facts.blockdevices import BlockDevice, BlockDevices
from provision.facts.probes import lock_wait_command
from provision.inventory import Cluster, Node
from provision.settings import Settings, disk_id_problem

LABEL = "PVDATA"  # filesystem label that marks our data volume (xfs allows 12 characters)
ARRAY_NAME = "provision:data"  # md array name written into each member's superblock
ARRAY_DEVICE = "/dev/md/data"  # where mdadm.conf names our array
MARKER = ".provision-volume"  # file at the volume's root saying who made it
DEVICE_TIMEOUT = "30s"  # how long boot waits for a missing data disk before going on
MDADM_CONF = "/etc/mdadm/mdadm.conf"
OURS_FILESYSTEMS = ("xfs", "ext4")
# Fewest members per raid_level (settings allow these). RAID10 takes 2: mdadm builds the
# "near 2" layout, a mirror, on two disks.
RAID_MIN_DISKS = {0: 2, 1: 2, 5: 3, 6: 4, 10: 2}


def is_ours(device: BlockDevice) -> bool:
    """Did provision make what this disk holds (our filesystem, or a member of our array)?"""
    if device.fstype in OURS_FILESYSTEMS:
        return device.label == LABEL
    return device.fstype == "linux_raid_member" and device.label == ARRAY_NAME


def is_forced(settings: Settings, device: BlockDevice) -> bool:
    """Has the user allowed formatting this disk although it holds data?"""
    return any(device.matches(entry) for entry in settings.force_format)


def _name(device: BlockDevice) -> str:
    """How messages name a disk: its stable id first, the kernel name for orientation."""
    stable = device.by_id[0] if device.by_id else device.path
    return f"{stable} ({device.name})"


def _listed(settings: Settings, devices: list[BlockDevice], hostname: str) -> tuple[list[BlockDevice], list[str]]:
    disks: list[BlockDevice] = []
    problems: list[str] = []
    for entry in settings.data_disks:
        found = [d for d in devices if d.matches(entry)]
        if not found:
            known = ", ".join(_name(d) for d in devices if d.type == "disk") or "none"
            problems.append(f"{hostname}: data disk {entry} does not exist (disks on the host: {known})")
        elif found[0].is_root:
            problems.append(
                f"{hostname}: data disk {entry} ({found[0].name}) holds the running system "
                f"({', '.join(found[0].mountpoints)}); remove it from data_disks"
            )
        elif found[0] in disks:
            problems.append(f"{hostname}: data disk {entry} ({found[0].name}) is listed twice")
        else:
            disks.append(found[0])
    return disks, problems


def _auto(settings: Settings, devices: list[BlockDevice]) -> list[BlockDevice]:
    """Every whole, non-root disk with a stable id that is blank, ours, or forced."""
    return [
        d for d in sorted(devices, key=lambda d: d.name)
        if d.type == "disk" and not d.is_root and d.by_id
        and (d.holds is None or is_ours(d) or is_forced(settings, d))
    ]


def _refusals(settings: Settings, disks: list[BlockDevice], hostname: str) -> list[str]:
    """Disks holding data that is not ours and that the user did not allow us to erase."""
    return [
        f"{hostname}: refusing to format {_name(d)}: it holds {d.holds} not made by provision "
        f"(to erase it: provision up --force-format {hostname}:{d.by_id[0] if d.by_id else d.path})"
        for d in disks
        if d.holds is not None and not is_ours(d) and not is_forced(settings, d)
    ]


def _layout_problems(disks: list[BlockDevice], hostname: str) -> list[str]:
    """Our volume exists on some disks: the list must be exactly its members."""
    ours = [d for d in disks if is_ours(d)]
    if not ours:
        return []
    if len(ours) != len(disks):
        new = ", ".join(_name(d) for d in disks if not is_ours(d))
        return [f"{hostname}: the data volume already exists on {', '.join(_name(d) for d in ours)}; "
                f"adding {new} to it is not supported (remove it from data_disks)"]
    kind = "linux_raid_member" if len(disks) > 1 else "filesystem"
    wrong = [d for d in disks if (d.fstype == "linux_raid_member") != (kind == "linux_raid_member")]
    if wrong:
        return [f"{hostname}: data_disks lists {len(disks)} disk(s) but the existing data volume on "
                f"{', '.join(_name(d) for d in wrong)} was built from a different number; "
                "list the disks it was built from"]
    return []


def choose_disks(
    settings: Settings, devices: list[BlockDevice], hostname: str = "host"
) -> tuple[list[BlockDevice], list[str]]:
    """The disks the data volume is built from, and every reason it cannot be built.

    ``data_disks: "auto"`` takes every unused non-root disk (plus our own volume's disks
    and forced ones); disks holding other data are left out, never refused. A listed
    disk that is missing, is the root disk, or holds someone else's data is a problem.
    """
    problems: list[str] = []
    if settings.data_disks == "auto":
        disks = _auto(settings, devices)
    else:
        disks, problems = _listed(settings, devices, hostname)
    problems += _refusals(settings, disks, hostname)
    if not problems:
        problems += _raid_problems(settings, disks, hostname) or _layout_problems(disks, hostname)
    return disks, problems


def _raid_problems(settings: Settings, disks: list[BlockDevice], hostname: str) -> list[str]:
    """A raid_level the disks cannot make, refused here so that mdadm --create never fails
    after forced disks were already wiped. RAID0 of one disk is a plain filesystem."""
    level, need = settings.raid_level, RAID_MIN_DISKS[settings.raid_level]
    if not disks or level == 0 or len(disks) >= need:
        return []
    how = "data_disks: auto picked" if settings.data_disks == "auto" else "data_disks gives"
    return [f"{hostname}: raid_level {level} needs at least {need} disks but {how} {len(disks)} "
            f"({', '.join(_name(d) for d in disks)}); add disks or choose another raid_level"]


def check_disks(settings: Settings, devices: list[BlockDevice], hostname: str = "host") -> list[str]:
    """Preflight's check: every reason the volumes step would refuse this host."""
    return choose_disks(settings, devices, hostname)[1]


def describe_choice(settings: Settings, devices: list[BlockDevice], hostname: str = "host") -> list[str]:
    """Lines for `provision plan`: each disk picked (and why), each disk left out."""
    disks, problems = choose_disks(settings, devices, hostname)
    lines = [f"problem: {p.removeprefix(hostname + ': ')}" for p in problems]
    return [f"{hostname}: {line}" for line in lines + _choice_lines(settings, devices, disks, problems)]


def _choice_lines(settings: Settings, devices: list[BlockDevice], disks: list[BlockDevice],
                  problems: list[str]) -> list[str]:
    lines = []
    for d in disks:
        state = "our data volume, kept" if is_ours(d) else (
            "blank, will be formatted" if d.holds is None else
            f"FORCED: {d.holds} will be erased" if is_forced(settings, d) else f"holds {d.holds}: refused")
        lines.append(f"data disk {_name(d)} {d.size_bytes / 2**30:.0f} GiB: {state}")
    if settings.data_disks == "auto":
        for d in devices:
            if d.type == "disk" and d not in disks:
                why = "root disk" if d.is_root else (f"holds {d.holds}" if d.holds else "no stable id")
                lines.append(f"not picked {_name(d)}: {why}")
        if not disks:
            lines.append("no disk picked: no data volume is built")
    if disks and not problems:
        lines.append(f"volume: {layout(settings, disks)} at {settings.data_mount}")
    return lines


def layout(settings: Settings, disks: list[BlockDevice]) -> str:
    if len(disks) == 1:
        return f"{settings.filesystem} on one disk"
    return f"{settings.filesystem} on RAID{settings.raid_level} of {len(disks)} disks"


def apply_force_format(cluster: Cluster, specs: list[str]) -> Cluster:
    """Extend each named host's force_format with `--force-format HOST:DISK` values."""
    extra: dict[str, list[str]] = {}
    problems = []
    names = {n.name for n in cluster.nodes}
    for spec in specs:
        name, _, disk = spec.partition(":")
        bad_disk = disk_id_problem(disk) if disk else None
        if not disk or name not in names or bad_disk:
            what = "no disk given" if not disk else (
                f"{name!r} is not a host of this inventory" if name not in names else str(bad_disk))
            problems.append(Problem(f"--force-format {spec}", what,
                                    "write HOST:DISK, e.g. node1:/dev/disk/by-id/nvme-XYZ"))
        else:
            extra.setdefault(name, []).append(disk)
    if problems:
        raise InputError(problems)
    return replace(cluster, nodes=tuple(_forced(n, extra.get(n.name, [])) for n in cluster.nodes))


def _forced(node: Node, disks: list[str]) -> Node:
    if not disks:
        return node
    settings = replace(node.settings, force_format=[*node.settings.force_format, *disks])
    return replace(node, settings=settings)


# --- what the deploy writes (pure, tested directly) ---


def fstab_line(fs_uuid: str, settings: Settings) -> str:
    """The fstab entry: by UUID, noatime, nofail and a bounded wait for the device."""
    options = f"defaults,noatime,nofail,x-systemd.device-timeout={DEVICE_TIMEOUT}"
    passno = 2 if settings.filesystem == "ext4" else 0  # xfs is checked by the kernel on mount
    return f"UUID={fs_uuid} {settings.data_mount} {settings.filesystem} {options} 0 {passno}"


def mdadm_uuid(value: str) -> str:
    """A UUID as mdadm writes it (four groups of 8 hex digits joined by ':')."""
    digits = value.replace("-", "").replace(":", "").lower()
    return ":".join(digits[i:i + 8] for i in range(0, 32, 8))


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
    return (f"if [ ! -b {dev} ]; then echo {say}': not a block device' >&2; exit 1; fi; "
            f"blkid -p {dev} >/dev/null; rc=$?; "
            f"if [ $rc -eq 0 ]; then echo {say}': blkid -p finds a signature on it' >&2; exit 1; fi; "
            f"if [ $rc -ne 2 ]; then echo {say}\": blkid -p failed (exit $rc)\" >&2; exit 1; fi")


def mkfs_command(settings: Settings, device: str, fs_uuid: str, force: bool) -> str:
    """mkfs with our label and a UUID chosen up front, so fstab is known before it runs.
    Without ``force`` the command first refuses a device holding any signature (blank_guard)."""
    if settings.filesystem == "xfs":
        mkfs = f"mkfs.xfs -q {'-f ' if force else ''}-L {LABEL} -m uuid={fs_uuid} {shlex.quote(device)}"
    else:
        mkfs = f"mkfs.ext4 -q {'-F ' if force else ''}-L {LABEL} -U {fs_uuid} {shlex.quote(device)}"
    return mkfs if force else f"{blank_guard(device)}; {mkfs}"


def mdadm_create_command(settings: Settings, disks: list[BlockDevice], md_uuid: str,
                         wiped: list[BlockDevice] | None = None) -> str:
    """mdadm --create of our array, guarded by blank_guard on each member not in ``wiped``
    (the forced disks whose signatures wipefs erased just before)."""
    members = " ".join(shlex.quote(_stable(d)) for d in disks)
    guards = "".join(f"{blank_guard(_stable(d))}; " for d in disks if d not in (wiped or []))
    return (f"{guards}mdadm --create {ARRAY_DEVICE} --run --metadata=1.2 --name={ARRAY_NAME} "
            f"--uuid={mdadm_uuid(md_uuid)} --level={settings.raid_level} "
            f"--raid-devices={len(disks)} {members}")


def new_uuid() -> str:
    return str(uuid.uuid4())


def fstab_match(mount: str) -> str:
    """Extended regex for any fstab entry mounting something at ``mount``."""
    return rf"^[^#[:space:]]+[[:space:]]+{mount}[[:space:]]"


@dataclass(frozen=True)
class Filesystem:
    """What blkid finds on a device (uuid, type and label all None when it holds nothing)."""

    uuid: str | None  # filesystem UUID
    type: str | None  # xfs, ext4, ...
    label: str | None  # filesystem label
    error: str | None = None  # why blkid could not tell; the device is then never formatted


BLKID_STATUS = "provision-blkid-exit="  # the line after blkid's output giving its exit status


def parse_blkid_export(lines: list[str]) -> Filesystem:
    """Parse `blkid -p -o export DEV` (KEY=value lines)."""
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    return Filesystem(values.get("UUID"), values.get("TYPE"), values.get("LABEL"))


def parse_blkid_probe(lines: list[str]) -> Filesystem:
    """Parse DeviceFilesystem's output: blkid's, then its exit status (0 found, 2 nothing
    found). Any other status, or none, is an error rather than a blank device."""
    status = [line.removeprefix(BLKID_STATUS) for line in lines if line.startswith(BLKID_STATUS)]
    if status == ["0"]:
        return parse_blkid_export([line for line in lines if not line.startswith(BLKID_STATUS)])
    if status == ["2"]:
        return Filesystem(None, None, None)
    why = f"blkid -p failed (exit {status[-1]})" if status else "blkid -p gave no exit status"
    return Filesystem(None, None, None, error=why)


class DeviceFilesystem(FactBase):
    """The filesystem on one device, probed directly (no blkid cache)."""

    def command(self, device: str) -> str:
        # The status is printed rather than returned: blkid exits 2 on a blank device,
        # which pyinfra would take for a failed fact.
        return f"blkid -p -o export {shlex.quote(device)}; echo {BLKID_STATUS}$?"

    def process(self, output: list[str]) -> Filesystem:
        return parse_blkid_probe(output)


def install(name: str, packages: list[str]) -> None:
    """Install what is missing. The apt cache is refreshed only then, so a re-run with
    everything in place changes nothing (apt.packages(update=True) would refresh it hourly).
    The nfs and backups steps use this too."""
    installed = host.get_fact(DebPackages) or {}
    missing = [p for p in packages if p not in installed]
    if missing:
        # These steps run after provision's reboot, when apt-daily often refreshes the lists:
        # apt waits for the dpkg lock by itself (base's DPkg::Lock::Timeout) but fails at
        # once on the lists lock that its update takes.
        server.shell(name=f"{name}: wait for apt locks",
                     commands=[lock_wait_command(current_node().settings.apt_lock_wait_s)])
        apt.packages(name=name, packages=missing, update=True, cache_time=3600)


def _stable(device: BlockDevice) -> str:
    return device.by_id[0] if device.by_id else device.path


def _refuse(problems: list[str]) -> None:
    refuse("volumes", "; ".join(problems))


def _wipe_forced(settings: Settings, disks: list[BlockDevice]) -> list[BlockDevice]:
    """Erase signatures on forced disks (only those; blank ones need nothing). choose_disks
    let a disk holding data through only when it is forced, so these are the forced ones."""
    forced = [d for d in disks if d.holds is not None and not is_ours(d)]
    for d in forced:
        server.shell(name=f"Erase {_name(d)} (force_format)", commands=[f"wipefs -a {shlex.quote(_stable(d))}"])
    return forced


def _make_filesystem(settings: Settings, device: str, force: bool) -> str:
    fs_uuid = new_uuid()
    server.shell(name=f"Make {settings.filesystem} on {device}",
                 commands=["udevadm settle", mkfs_command(settings, device, fs_uuid, force), "udevadm settle"])
    return fs_uuid


def _single_disk(settings: Settings, disk: BlockDevice) -> str:
    if is_ours(disk) and disk.uuid:
        return disk.uuid
    return _make_filesystem(settings, _stable(disk), bool(_wipe_forced(settings, [disk])))


def _array(settings: Settings, disks: list[BlockDevice], where: str) -> str | None:
    """Create or adopt the md array; return the filesystem UUID, or None after a refusal."""
    if all(is_ours(d) for d in disks):
        running = {c for d in disks for c in d.children}
        if len(running) != 1 or not disks[0].uuid:
            _refuse([f"{where}: our array {ARRAY_NAME} on {', '.join(_name(d) for d in disks)} is "
                     "not running; run `mdadm --assemble --scan` on the host, then `provision up` again"])
            return None
        md_device = f"/dev/{running.pop()}"
        _record_array(disks[0].uuid)
        fs = host.get_fact(DeviceFilesystem, device=md_device) or Filesystem(None, None, None, "no answer")
        if fs.error:
            _refuse([f"{where}: cannot tell what our array {md_device} holds ({fs.error}); "
                     "refusing to format it"])
            return None
        if fs.type is None:
            return _make_filesystem(settings, md_device, force=False)
        if fs.label == LABEL and fs.type in OURS_FILESYSTEMS and fs.uuid:
            return fs.uuid
        _refuse([f"{where}: our array {md_device} holds a {fs.type} filesystem not made by provision"])
        return None
    wiped = _wipe_forced(settings, disks)
    md_uuid = new_uuid()
    server.shell(name=f"Create RAID{settings.raid_level} {ARRAY_DEVICE}",
                 commands=[mdadm_create_command(settings, disks, md_uuid, wiped), "udevadm settle"])
    _record_array(md_uuid)
    # Stale signatures from an earlier array on wiped members can show through the new one.
    return _make_filesystem(settings, ARRAY_DEVICE, force=bool(wiped))


_conf_changes: list = []  # this pass's mdadm.conf operations, for the initramfs update at the end


def _record_array(md_uuid: str) -> None:
    """mdadm.conf names the array (the initramfs gets it at the end of the step)."""
    _conf_changes.append(files.line(name="Record the array in mdadm.conf", path=MDADM_CONF,
                                    line=f"^ARRAY .*name={ARRAY_NAME}", replace=mdadm_conf_line(md_uuid)))


def _update_initramfs() -> None:
    """Last, so a slow initramfs rebuild never keeps the volume from being mounted."""
    if _conf_changes:
        conf = _conf_changes.pop()
        server.shell(name="Update initramfs (mdadm.conf changed)", commands=["update-initramfs -u"],
                     _if=conf.did_change)


def _mount(settings: Settings, fs_uuid: str) -> None:
    mount = settings.data_mount
    files.directory(name=f"Mount point {mount}", path=mount, present=True)
    fstab = files.line(name=f"fstab entry for {mount}", path="/etc/fstab", line=fstab_match(mount),
                       replace=fstab_line(fs_uuid, settings), extended_regex=True)
    mounted = mount in (host.get_fact(Mounts) or {})
    server.shell(name="Reload systemd (fstab changed)", commands=["systemctl daemon-reload"],
                 _if=fstab.did_change)
    if not mounted:
        server.shell(name=f"Mount {mount}", commands=[f"mount {shlex.quote(mount)}"])
    files.put(name="Mark the volume as made by provision", dest=f"{mount}/{MARKER}", mode="644",
              src=StringIO(f"made by provision (volumes step); label {LABEL}, array {ARRAY_NAME}\n"))


def _mount_conflict(settings: Settings, disks: list[BlockDevice], where: str) -> list[str]:
    """data_mount already mounted from a device that is not our volume."""
    mounted = (host.get_fact(Mounts) or {}).get(settings.data_mount)
    if not mounted:
        return []
    ours = {d.path for d in disks} | {f"/dev/{c}" for d in disks for c in d.children}
    if mounted["device"] in ours or all(is_ours(d) for d in disks):
        return []
    return [f"{where}: {settings.data_mount} is already mounted from {mounted['device']}; "
            "unmount it or choose another data_mount"]


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
    install("Install volume tools", packages + (["mdadm"] if len(disks) > 1 else []))
    _conf_changes.clear()
    fs_uuid = _single_disk(settings, disks[0]) if len(disks) == 1 else _array(settings, disks, node.name)
    if fs_uuid:
        _mount(settings, fs_uuid)
    _update_initramfs()


def applies(node: Node) -> str | None:
    """Skip hosts that list no data disks."""
    return None if node.settings.data_disks else "no data_disks set"


step = Step("volumes", data_volume, "SSD data volume: mdadm RAID, xfs/ext4, fstab by UUID", applies)
