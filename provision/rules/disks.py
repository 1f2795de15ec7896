"""Which disks make a host's data volume, and which are refused: pure decisions on BlockDevice facts.

Never destroy data: a disk holding a filesystem, partition table or RAID superblock that
provision did not make is refused unless the host's force_format names it. Our own volume is
recognised by its filesystem label (LABEL) or md array name (ARRAY_NAME).

- choose_disks(settings, devices, hostname) -> (disks, problems): which disks the volume is
  built from; describe_choice gives the lines the plan and the summary show.
- check_disks(settings, devices, hostname) -> problems: what preflight refuses before anything
  changes (missing disks, root disks, disks holding someone else's data).
"""

from __future__ import annotations

from provision.facts.blockdevices import BlockDevice
from provision.inventory import Node
from provision.settings import RAID_MIN_DISKS, Settings

LABEL = "PVDATA"  # filesystem label that marks our data volume (xfs allows 12 characters)


ARRAY_NAME = "provision:data"  # md array name written into each member's superblock


OURS_FILESYSTEMS = ("xfs", "ext4")


def is_ours(device: BlockDevice) -> bool:
    """Did provision make what this disk holds (our filesystem, or a member of our array)?"""
    if device.fstype in OURS_FILESYSTEMS:
        return device.label == LABEL
    return device.fstype == "linux_raid_member" and device.label == ARRAY_NAME


def is_forced(settings: Settings, device: BlockDevice) -> bool:
    """Has the user allowed formatting this disk although it holds data?"""
    return any(device.matches(entry) for entry in settings.force_format)


def disk_name(device: BlockDevice) -> str:
    """How messages name a disk: its stable id first, the kernel name for orientation."""
    stable = device.by_id[0] if device.by_id else device.path
    return f"{stable} ({device.name})"


def _listed(settings: Settings, devices: list[BlockDevice], hostname: str) -> tuple[list[BlockDevice], list[str]]:
    disks: list[BlockDevice] = []
    problems: list[str] = []
    for entry in settings.data_disks:
        found = [d for d in devices if d.matches(entry)]
        if not found:
            known = ", ".join(disk_name(d) for d in devices if d.type == "disk") or "none"
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
        d
        for d in sorted(devices, key=lambda d: d.name)
        if d.type == "disk" and not d.is_root and d.by_id and (d.holds is None or is_ours(d) or is_forced(settings, d))
    ]


def _refusals(settings: Settings, disks: list[BlockDevice], hostname: str) -> list[str]:
    """Disks holding data that is not ours and that the user did not allow us to erase."""
    return [
        f"{hostname}: refusing to format {disk_name(d)}: it holds {d.holds} not made by provision "
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
        new = ", ".join(disk_name(d) for d in disks if not is_ours(d))
        return [
            f"{hostname}: the data volume already exists on {', '.join(disk_name(d) for d in ours)}; "
            f"adding {new} to it is not supported (remove it from data_disks)"
        ]
    kind = "linux_raid_member" if len(disks) > 1 else "filesystem"
    wrong = [d for d in disks if (d.fstype == "linux_raid_member") != (kind == "linux_raid_member")]
    if wrong:
        return [
            f"{hostname}: data_disks lists {len(disks)} disk(s) but the existing data volume on "
            f"{', '.join(disk_name(d) for d in wrong)} was built from a different number; "
            "list the disks it was built from"
        ]
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
    return [
        f"{hostname}: raid_level {level} needs at least {need} disks but {how} {len(disks)} "
        f"({', '.join(disk_name(d) for d in disks)}); add disks or choose another raid_level"
    ]


def check_disks(settings: Settings, devices: list[BlockDevice], hostname: str = "host") -> list[str]:
    """Preflight's check: every reason the volumes step would refuse this host."""
    return choose_disks(settings, devices, hostname)[1]


def describe_choice(settings: Settings, devices: list[BlockDevice], hostname: str = "host") -> list[str]:
    """Lines for `provision plan`: each disk picked (and why), each disk left out."""
    disks, problems = choose_disks(settings, devices, hostname)
    lines = [f"problem: {p.removeprefix(hostname + ': ')}" for p in problems]
    return [f"{hostname}: {line}" for line in lines + _choice_lines(settings, devices, disks, problems)]


def _choice_lines(
    settings: Settings, devices: list[BlockDevice], disks: list[BlockDevice], problems: list[str]
) -> list[str]:
    lines = []
    for d in disks:
        state = (
            "our data volume, kept"
            if is_ours(d)
            else (
                "blank, will be formatted"
                if d.holds is None
                else f"FORCED: {d.holds} will be erased"
                if is_forced(settings, d)
                else f"holds {d.holds}: refused"
            )
        )
        lines.append(f"data disk {disk_name(d)} {d.size_bytes / 2**30:.0f} GiB: {state}")
    if settings.data_disks == "auto":
        for d in devices:
            if d.type == "disk" and d not in disks:
                why = "root disk" if d.is_root else (f"holds {d.holds}" if d.holds else "no stable id")
                lines.append(f"not picked {disk_name(d)}: {why}")
        if not disks:
            lines.append("no disk picked: no data volume is built")
    if disks and not problems:
        lines.append(f"volume: {layout(settings, disks)} at {settings.data_mount}")
    return lines


def layout(settings: Settings, disks: list[BlockDevice]) -> str:
    if len(disks) == 1:
        return f"{settings.filesystem} on one disk"
    return f"{settings.filesystem} on RAID{settings.raid_level} of {len(disks)} disks"


def applies(node: Node) -> str | None:
    """Skip hosts that list no data disks."""
    return None if node.settings.data_disks else "no data_disks set"
