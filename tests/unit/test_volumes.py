"""The volumes step's pure decisions: which disks, what is refused, what gets written."""

from __future__ import annotations

import contextlib
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from provision.deploys import volumes
from provision.errors import InputError
from provision.facts import filesystems
from provision.facts.blockdevices import BlockDevice
from provision.inventory import Cluster, Node, SshTarget
from provision.operations import volumes as vol_ops
from provision.rules import disks as disk_rules
from provision.settings import Settings
from provision.up import force_format

GIB = 2**30


def disk(name: str, serial: str | None = None, **kw: object) -> BlockDevice:
    """A whole virtio disk as the BlockDevices fact reports it (blank unless told)."""
    serial = serial or f"NVME-node1-{name[-1]}"
    fields: dict[str, object] = dict(
        name=name,
        path=f"/dev/{name}",
        type="disk",
        size_bytes=10 * GIB,
        serial=serial,
        model=None,
        fstype=None,
        pttype=None,
        uuid=None,
        label=None,
        mountpoints=(),
        children=(),
        by_id=(f"/dev/disk/by-id/virtio-{serial}",),
    )
    fields.update(kw)
    return BlockDevice(**fields)  # type: ignore[arg-type]


ROOT = disk("vda", "ROOT", fstype="ext4", uuid="r00t", label="root", mountpoints=("/",))
B, C, D = disk("vdb"), disk("vdc"), disk("vdd")
ID_B, ID_C = B.by_id[0], C.by_id[0]


def settings(**kw: object) -> Settings:
    return Settings(**kw)  # type: ignore[arg-type]


def test_blank_listed_disks_are_chosen_in_listed_order():
    disks, problems = disk_rules.choose_disks(settings(data_disks=[ID_C, ID_B]), [ROOT, B, C], "node1")
    assert problems == []
    assert [d.name for d in disks] == ["vdc", "vdb"]


def test_a_serial_names_the_disk_as_well_as_its_by_id_path():
    disks, problems = disk_rules.choose_disks(settings(data_disks=["NVME-node1-b"]), [ROOT, B], "node1")
    assert problems == []
    assert disks == [B]


def test_refuses_to_format_disk_with_filesystem_naming_host_device_and_content():
    used = disk("vdb", fstype="ext4", uuid="u1", label="scratch")
    _, problems = disk_rules.choose_disks(settings(data_disks=[ID_B]), [ROOT, used], "node1")
    assert len(problems) == 1
    assert "node1" in problems[0]
    assert ID_B in problems[0]
    assert "ext4 filesystem" in problems[0]
    assert f"--force-format node1:{ID_B}" in problems[0]


def test_refuses_disk_with_partition_table():
    used = disk("vdb", pttype="gpt", children=("vdb1",))
    _, problems = disk_rules.choose_disks(settings(data_disks=[ID_B]), [ROOT, used], "node1")
    assert len(problems) == 1
    assert "a gpt partition table" in problems[0]
    assert ID_B in problems[0]


def test_refuses_disk_with_raid_superblock_of_another_array():
    member = disk("vdb", fstype="linux_raid_member", label="otherhost:0", uuid="a-b")
    _, problems = disk_rules.choose_disks(settings(data_disks=[ID_B]), [ROOT, member], "node1")
    assert len(problems) == 1
    assert "RAID superblock" in problems[0]
    assert "node1" in problems[0]


def test_force_format_allows_disk_holding_data():
    used = disk("vdb", fstype="ext4", uuid="u1")
    disks, problems = disk_rules.choose_disks(settings(data_disks=[ID_B], force_format=[ID_B]), [ROOT, used], "node1")
    assert problems == []
    assert disks == [used]


def test_force_format_on_another_disk_does_not_allow_this_one():
    used = disk("vdb", fstype="ext4", uuid="u1")
    _, problems = disk_rules.choose_disks(settings(data_disks=[ID_B], force_format=[ID_C]), [ROOT, used, C], "node1")
    assert len(problems) == 1
    assert "refusing to format" in problems[0]


def test_missing_disk_is_an_error_naming_the_disks_that_exist():
    _, problems = disk_rules.choose_disks(settings(data_disks=["/dev/disk/by-id/virtio-GONE"]), [ROOT, B], "n1")
    assert problems == [
        f"n1: data disk /dev/disk/by-id/virtio-GONE does not exist "
        f"(disks on the host: /dev/disk/by-id/virtio-ROOT (vda), {ID_B} (vdb))"
    ]


def test_root_disk_listed_as_data_disk_is_an_error():
    _, problems = disk_rules.choose_disks(settings(data_disks=["ROOT"]), [ROOT, B], "node1")
    assert len(problems) == 1
    assert "holds the running system (/)" in problems[0]


def test_check_disks_reports_the_same_problems_as_the_choice():
    s = settings(data_disks=["ROOT", "/dev/disk/by-id/virtio-GONE"])
    assert disk_rules.check_disks(s, [ROOT, B], "node1") == disk_rules.choose_disks(s, [ROOT, B], "node1")[1]
    assert len(disk_rules.check_disks(s, [ROOT, B], "node1")) == 2


def test_auto_leaves_out_a_blank_disk_without_a_stable_id():
    anonymous = disk("vde", by_id=())
    disks, _ = disk_rules.choose_disks(settings(data_disks="auto"), [ROOT, B, anonymous], "node1")
    assert disks == [B]


def test_auto_picks_blank_disks_and_excludes_root_and_used_disks():
    used = disk("vdc", fstype="xfs", uuid="u2", label="backup")
    disks, problems = disk_rules.choose_disks(settings(data_disks="auto"), [ROOT, B, used, D], "node1")
    assert problems == []
    assert [d.name for d in disks] == ["vdb", "vdd"]


def test_auto_picks_a_forced_used_disk():
    used = disk("vdc", fstype="xfs", uuid="u2")
    disks, _ = disk_rules.choose_disks(
        settings(data_disks="auto", force_format=["NVME-node1-c"]), [ROOT, B, used], "node1"
    )
    assert [d.name for d in disks] == ["vdb", "vdc"]


def test_our_own_filesystem_is_kept_and_not_refused():
    ours = disk("vdb", fstype="xfs", uuid="f5", label=disk_rules.LABEL, mountpoints=("/data",))
    disks, problems = disk_rules.choose_disks(settings(data_disks=[ID_B]), [ROOT, ours], "node1")
    assert problems == []
    assert disks == [ours]
    assert disk_rules.is_ours(ours)


def test_members_of_our_array_are_kept_and_auto_picks_them_again():
    members = [
        disk(n, fstype="linux_raid_member", label=disk_rules.ARRAY_NAME, uuid="m1", children=("md127",))
        for n in ("vdb", "vdc")
    ]
    disks, problems = disk_rules.choose_disks(settings(data_disks="auto"), [ROOT, *members], "node1")
    assert problems == []
    assert disks == members


def test_adding_a_blank_disk_to_our_existing_volume_is_refused():
    ours = disk("vdb", fstype="xfs", uuid="f5", label=disk_rules.LABEL)
    _, problems = disk_rules.choose_disks(settings(data_disks=[ID_B, ID_C]), [ROOT, ours, C], "node1")
    assert len(problems) == 1
    assert "already exists" in problems[0]
    assert "not supported" in problems[0]


def test_describe_choice_lists_picked_and_left_out_disks():
    used = disk("vdc", fstype="xfs", uuid="u2", label="backup")
    lines = disk_rules.describe_choice(settings(data_disks="auto"), [ROOT, B, used, D], "node1")
    assert f"node1: data disk {ID_B} (vdb) 10 GiB: blank, will be formatted" in lines
    assert "node1: not picked /dev/disk/by-id/virtio-ROOT (vda): root disk" in lines
    assert any("not picked" in line and "vdc" in line and "xfs filesystem" in line for line in lines)
    assert "node1: volume: xfs on RAID0 of 2 disks at /data" in lines


def test_describe_choice_says_a_listed_disk_holding_data_is_refused_and_a_forced_one_erased():
    used, other = disk("vdb", fstype="ext4", uuid="u1"), disk("vdc", pttype="gpt")
    lines = disk_rules.describe_choice(
        settings(data_disks=[ID_B, ID_C], force_format=[ID_C]), [ROOT, used, other], "node1"
    )
    assert f"node1: data disk {ID_B} (vdb) 10 GiB: holds a ext4 filesystem: refused" in lines
    assert f"node1: data disk {ID_C} (vdc) 10 GiB: FORCED: a gpt partition table will be erased" in lines


def _cluster() -> Cluster:
    nodes = tuple(
        Node(n, SshTarget(n, 22, None, None, None, "yes"), (), Settings(force_format=["X"])) for n in ("node1", "node2")
    )
    return Cluster(Path("inv.py"), nodes)


def test_force_format_flag_extends_only_the_named_hosts_settings():
    cluster = force_format.apply_force_format(_cluster(), [f"node2:{ID_B}"])
    assert cluster.node("node2").settings.force_format == ["X", ID_B]
    assert cluster.node("node1").settings.force_format == ["X"]


def test_force_format_flag_for_an_unknown_host_is_bad_input():
    with pytest.raises(InputError) as e:
        force_format.apply_force_format(_cluster(), [f"node9:{ID_B}", "node1"])
    assert len(e.value.problems) == 2
    assert "'node9' is not a host" in str(e.value)


def test_force_format_flag_refuses_kernel_names_and_other_by_paths():
    with pytest.raises(InputError) as e:
        force_format.apply_force_format(_cluster(), ["node1:/dev/sdb", "node2:/dev/disk/by-uuid/u1", f"node2:{ID_B}"])
    assert [str(p) for p in e.value.problems] == [
        "--force-format node1:/dev/sdb: '/dev/sdb' is a kernel name that can change between boots; "
        "use /dev/disk/by-id/... or the disk's serial (write HOST:DISK, e.g. node1:/dev/disk/by-id/nvme-XYZ)",
        "--force-format node2:/dev/disk/by-uuid/u1: '/dev/disk/by-uuid/u1' is not a /dev/disk/by-id path; "
        "use /dev/disk/by-id/... or the disk's serial (write HOST:DISK, e.g. node1:/dev/disk/by-id/nvme-XYZ)",
    ]


def test_up_with_force_format_of_a_kernel_name_is_bad_input_before_any_host_is_contacted(cli, monkeypatch):
    from provision.resources import inventories_dir
    from provision.up import pipeline

    def test_stand_in_for_pipeline_up(*args: object, **kwargs: object) -> None:
        raise AssertionError("provision up went on to contact hosts")

    monkeypatch.setattr(pipeline, "up", test_stand_in_for_pipeline_up)
    result = cli("up", str(inventories_dir() / "example.py"), "--force-format", "gpu01:/dev/sdb")
    assert result.code == 2
    assert "--force-format gpu01:/dev/sdb: '/dev/sdb' is a kernel name" in " ".join(result.err.split())


def test_a_kernel_path_never_names_a_disk_so_forcing_it_erases_nothing():
    used = disk("vdb", fstype="ext4", uuid="u1")
    assert not used.matches("/dev/vdb")
    # Settings() skips parse_settings' validation: this is the second line of defence
    _disks, problems = disk_rules.choose_disks(
        settings(data_disks=[ID_B], force_format=["/dev/vdb"]), [ROOT, used], "node1"
    )
    assert len(problems) == 1
    assert "refusing to format" in problems[0]
    assert disk_rules.choose_disks(settings(data_disks=["/dev/vdb"]), [ROOT, used], "node1")[1] == [
        f"node1: data disk /dev/vdb does not exist (disks on the host: /dev/disk/by-id/virtio-ROOT (vda), {ID_B} (vdb))"
    ]


def test_every_raid_level_the_settings_allow_has_a_minimum_disk_count():
    import typing

    levels = typing.get_args(typing.get_type_hints(Settings)["raid_level"])
    assert set(levels) == set(disk_rules.RAID_MIN_DISKS)


@pytest.mark.parametrize(("level", "count"), [(1, 1), (5, 2), (6, 3), (10, 1)])
def test_a_raid_level_the_listed_disks_cannot_make_is_refused_naming_host_level_and_count(level, count):
    listed = [B, C, D][:count]
    used = replace(listed[0], fstype="ext4", uuid="u1")  # forced: it must not be erased for nothing
    s = settings(data_disks=[d.by_id[0] for d in listed], raid_level=level, force_format=[ID_B])
    _, problems = disk_rules.choose_disks(s, [ROOT, used, *listed[1:]], "node1")
    need = disk_rules.RAID_MIN_DISKS[level]
    (problem,) = problems
    assert problem.startswith(f"node1: raid_level {level} needs at least {need} disks but data_disks gives {count} (")


def test_auto_picking_too_few_disks_for_the_raid_level_is_refused():
    used = disk("vdc", fstype="xfs", uuid="u2")
    _, problems = disk_rules.choose_disks(settings(data_disks="auto", raid_level=5), [ROOT, B, used, D], "node1")
    assert problems == [
        f"node1: raid_level 5 needs at least 3 disks but data_disks: auto picked 2 "
        f"({ID_B} (vdb), /dev/disk/by-id/virtio-NVME-node1-d (vdd)); "
        "add disks or choose another raid_level"
    ]


@pytest.mark.parametrize(("level", "count"), [(0, 1), (0, 2), (1, 2), (5, 3), (6, 4), (10, 2), (10, 4)])
def test_a_raid_level_the_disks_can_make_is_accepted(level, count):
    listed = [B, C, D, disk("vde")][:count]
    s = settings(data_disks=[d.by_id[0] for d in listed], raid_level=level)
    assert disk_rules.choose_disks(s, [ROOT, *listed], "node1") == (listed, [])


def test_fstab_line_mounts_by_uuid_with_noatime_nofail_and_a_device_timeout():
    line = vol_ops.fstab_line("1b4e28ba-2fa1-11d2-883f-0016d3cca427", settings())
    assert line == (
        "UUID=1b4e28ba-2fa1-11d2-883f-0016d3cca427 /data xfs defaults,noatime,nofail,x-systemd.device-timeout=300s 0 0"
    )


def test_fstab_line_for_ext4_is_checked_at_boot():
    line = vol_ops.fstab_line("u", settings(filesystem="ext4", data_mount="/mnt/d"))
    assert line.split() == [
        "UUID=u",
        "/mnt/d",
        "ext4",
        "defaults,noatime,nofail,x-systemd.device-timeout=300s",
        "0",
        "2",
    ]


def test_mdadm_conf_line_names_our_array_by_uuid():
    line = vol_ops.mdadm_conf_line("1b4e28ba-2fa1-11d2-883f-0016d3cca427")
    assert line == ("ARRAY /dev/md/data metadata=1.2 UUID=1b4e28ba:2fa111d2:883f0016:d3cca427 name=provision:data")


def test_mdadm_create_uses_stable_ids_level_and_our_name_after_checking_each_member_is_blank():
    command = vol_ops.mdadm_create_command(settings(raid_level=1), [B, C], "1b4e28ba-2fa1-11d2-883f-0016d3cca427")
    assert command == (
        f"{vol_ops.blank_guard(ID_B)}; {vol_ops.blank_guard(ID_C)}; "
        f"mdadm --create /dev/md/data --run --metadata=1.2 --name=provision:data "
        f"--uuid=1b4e28ba:2fa111d2:883f0016:d3cca427 --level=1 --raid-devices=2 {ID_B} {ID_C}"
    )


def test_mdadm_create_does_not_check_members_that_were_force_erased():
    command = vol_ops.mdadm_create_command(settings(), [B, C], "1b4e28ba-2fa1-11d2-883f-0016d3cca427", wiped=[B])
    assert command.startswith(f"{vol_ops.blank_guard(ID_C)}; mdadm --create ")
    assert vol_ops.blank_guard(ID_B) not in command


@pytest.mark.parametrize(
    ("filesystem", "mkfs"),
    [("xfs", "mkfs.xfs -q -L PVDATA -m uuid=u1 /dev/md/data"), ("ext4", "mkfs.ext4 -q -L PVDATA -U u1 /dev/md/data")],
)
def test_mkfs_without_force_first_refuses_any_signature_itself(filesystem, mkfs):
    # mke2fs without a terminal overwrites a signature without asking: the guard is ours
    assert (
        vol_ops.mkfs_command(settings(filesystem=filesystem), "/dev/md/data", "u1", force=False)
        == f"{vol_ops.blank_guard('/dev/md/data')}; {mkfs}"
    )


def test_forced_mkfs_has_no_guard_and_overwrites():
    assert (
        vol_ops.mkfs_command(settings(filesystem="ext4"), "/dev/x", "u1", force=True)
        == "mkfs.ext4 -q -F -L PVDATA -U u1 /dev/x"
    )
    assert vol_ops.mkfs_command(settings(), "/dev/x", "u1", force=True) == "mkfs.xfs -q -f -L PVDATA -m uuid=u1 /dev/x"


def _a_block_device() -> str:
    import glob
    import os
    import stat

    for path in sorted(glob.glob("/dev/loop*") + glob.glob("/dev/[svx]d?") + glob.glob("/dev/nvme*n1")):
        with contextlib.suppress(OSError):
            if stat.S_ISBLK(os.stat(path).st_mode):
                return path
    pytest.skip("no block device in /dev to point the guard at")


def _run_guard(tmp_path: Path, device: str, blkid_exit: int) -> subprocess.CompletedProcess:
    """Run blank_guard in sh with a test stand-in blkid that exits as told (it reads no
    device); nothing after the guard but an echo, so no disk is ever written."""
    bin_dir = tmp_path / "stand_in_bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "blkid"
    stand_in.write_text(f"#!/bin/sh\n# test stand-in for blkid -p\nexit {blkid_exit}\n")
    stand_in.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(
        ["sh", "-c", f"{vol_ops.blank_guard(device)}; echo guard-passed"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


def test_blkid_export_is_parsed():
    fs = filesystems.parse_blkid_export(
        ["DEVNAME=/dev/md127", "UUID=abc", "BLOCK_SIZE=512", "TYPE=xfs", "LABEL=PVDATA", "USAGE=filesystem"]
    )
    assert fs == filesystems.Filesystem("abc", "xfs", "PVDATA")
    assert filesystems.parse_blkid_export([]) == filesystems.Filesystem(None, None, None)


def test_device_filesystem_fact_tells_blank_from_found():
    fact = filesystems.DeviceFilesystem()
    assert fact.process(
        ["DEVNAME=/dev/md127", "UUID=abc", "TYPE=xfs", "LABEL=PVDATA", "provision-blkid-exit=0"]
    ) == filesystems.Filesystem("abc", "xfs", "PVDATA")
    assert fact.process(["provision-blkid-exit=2"]) == filesystems.Filesystem(None, None, None)


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (["provision-blkid-exit=4"], "blkid -p failed (exit 4)"),
        (["provision-blkid-exit=8"], "blkid -p failed (exit 8)"),  # ambivalent: more than one signature
        (["TYPE=xfs"], "blkid -p gave no exit status"),
    ],
)
def test_device_filesystem_fact_reports_a_blkid_error_instead_of_a_blank_device(lines, error):
    assert filesystems.DeviceFilesystem().process(lines) == filesystems.Filesystem(None, None, None, error=error)


def test_device_filesystem_fact_keeps_blkids_exit_status():
    command = filesystems.DeviceFilesystem().command("/dev/md127")
    assert command == "blkid -p -o export /dev/md127; echo provision-blkid-exit=$?"


def test_step_skips_hosts_without_data_disks():
    node = Node("n", SshTarget("n", 22, None, None, None, "yes"), (), Settings())
    assert volumes.step.applies(node) == "no data_disks set"


def _captured(name: str) -> list[BlockDevice]:
    from provision.facts.blockdevices import BlockDevices

    lines = (Path(__file__).parent.parent / "fixtures" / name).read_text().splitlines()
    return BlockDevices().process(lines)


def test_auto_on_a_captured_testbed_node_picks_both_blank_data_disks_not_root_or_seed():
    devices = _captured("blockdevices_debian12-testbed_2-blank-virtio-disks.txt")
    disks, problems = disk_rules.choose_disks(settings(data_disks="auto"), devices, "node1")
    assert problems == []
    # vda holds / and vdb the testbed's ext4 seed filesystem
    assert [d.by_id for d in disks] == [
        ("/dev/disk/by-id/virtio-NVME-node1-1",),
        ("/dev/disk/by-id/virtio-NVME-node1-2",),
    ]


def test_captured_members_of_our_raid0_are_recognised_so_a_rerun_keeps_them():
    devices = _captured("blockdevices_debian12-testbed_raid0-provision-data.txt")
    members = [d for d in devices if d.fstype == "linux_raid_member"]
    assert len(members) == 2
    assert all(disk_rules.is_ours(d) for d in members)
    assert {c for d in members for c in d.children} == {"md127"}
    disks, problems = disk_rules.choose_disks(
        settings(data_disks=[f"/dev/disk/by-id/virtio-NVME-node1-{k}" for k in (1, 2)]), devices, "node1"
    )
    assert problems == []
    assert disks == members
