"""The volumes deploy, run through the real runner on pyinfra's @fake connector: the
facts are canned host outputs, and the assertions are on the exact commands sent."""

from __future__ import annotations

import json
import re

from provision.deploys import volumes
from provision.facts.probes import lock_wait_command
from provision.operations import stamps
from provision.operations import volumes as vol_ops
from provision.settings import Settings
from tests.helpers.pyinfra_fake import fake_node, run_fake

HOST = "@fake/node1"
ROOT = {
    "name": "vda",
    "path": "/dev/vda",
    "type": "disk",
    "size": 3221225472,
    "serial": None,
    "fstype": "ext4",
    "label": "root",
    "uuid": "0f0e",
    "pttype": None,
    "rota": False,
    "mountpoints": ["/"],
}


def _disk(name: str, **kw: object) -> dict:
    entry = {
        "name": name,
        "path": f"/dev/{name}",
        "type": "disk",
        "size": 1073741824,
        "serial": f"NVME-node1-{name[-1]}",
        "fstype": None,
        "label": None,
        "uuid": None,
        "pttype": None,
        "rota": False,
        "mountpoints": [None],
    }
    entry.update(kw)
    return entry


def _lsblk(*disks: dict) -> list[str]:
    """stdout of the BlockDevices fact: lsblk JSON, the separator, then `ls -l` of by-id."""
    links = [
        f"lrwxrwxrwx 1 root root 9 Nov 29 22:00 virtio-{d['serial']} -> ../../{d['name']}"
        for d in disks
        if d.get("serial")
    ]
    return [*json.dumps({"blockdevices": [ROOT, *disks]}, indent=1).splitlines(), "--- by-id ---", "total 0", *links]


def _settings(**kw: object) -> Settings:
    return Settings(**kw)  # type: ignore[arg-type]


ID = "/dev/disk/by-id/virtio-NVME-node1-{}"
DESTRUCTIVE = r"mdadm --create|mkfs|wipefs|^mount "


def _guarded(*devices: str) -> str:
    """Regex for the blank checks (vol_ops.blank_guard) that open an unforced command."""
    return "".join(re.escape(vol_ops.blank_guard(d) + "; ") for d in devices)


def test_two_blank_disks_become_raid0_xfs_mounted_by_uuid(monkeypatch):
    node = fake_node(
        "node1",
        _settings(data_disks=[ID.format("b"), ID.format("c")]),
        {"lsblk -J -O -b": _lsblk(_disk("vdb"), _disk("vdc"))},
    )
    run = run_fake(volumes.step, [node], monkeypatch)
    assert run.results[HOST].ok, run.results[HOST].failures
    (create,) = run.ran(HOST, "mdadm --create")
    assert re.fullmatch(
        _guarded(ID.format("b"), ID.format("c"))
        + r"mdadm --create /dev/md/data --run --metadata=1\.2 --name=provision:data --uuid=[0-9a-f:]{35} "
        rf"--level=0 --raid-devices=2 {ID.format('b')} {ID.format('c')}",
        create,
    )
    (mkfs,) = run.ran(HOST, "mkfs")
    fs_uuid = re.fullmatch(
        _guarded("/dev/md/data") + r"mkfs\.xfs -q -L PVDATA -m uuid=([0-9a-f-]{36}) /dev/md/data", mkfs
    ).group(1)
    md_uuid = create.split("--uuid=")[1].split()[0]
    assert run.ran(HOST, re.escape(f"ARRAY /dev/md/data metadata=1.2 UUID={md_uuid} name=provision:data"))
    assert run.ran(HOST, "update-initramfs -u")
    fstab = f"UUID={fs_uuid} /data xfs defaults,noatime,nofail,x-systemd.device-timeout=300s 0 0"
    assert [c for c in run.ran(HOST, re.escape(fstab)) if "/etc/fstab" in c]
    assert run.ran(HOST, "^mount /data$")
    assert not run.ran(HOST, "wipefs")  # blank disks need no erasing
    order = [c for c in run.commands[HOST] if re.search(r"mdadm --create|mkfs|^mount |update-initramfs", c)]
    assert order == [create, mkfs, "mount /data", "update-initramfs -u"]  # the slow rebuild last


def test_one_blank_disk_gets_a_filesystem_directly(monkeypatch):
    node = fake_node(
        "node1", _settings(data_disks=["NVME-node1-b"], filesystem="ext4"), {"lsblk -J -O -b": _lsblk(_disk("vdb"))}
    )
    run = run_fake(volumes.step, [node], monkeypatch)
    assert run.results[HOST].ok
    assert not run.ran(HOST, "mdadm")
    (mkfs,) = run.ran(HOST, "mkfs")
    assert re.fullmatch(
        _guarded(ID.format("b")) + rf"mkfs\.ext4 -q -L PVDATA -U [0-9a-f-]{{36}} {ID.format('b')}", mkfs
    )


def test_disk_holding_a_filesystem_is_refused_and_nothing_is_written(monkeypatch):
    used = _disk("vdc", fstype="ext4", uuid="6d1f", label="mine")
    node = fake_node(
        "node1", _settings(data_disks=[ID.format("b"), ID.format("c")]), {"lsblk -J -O -b": _lsblk(_disk("vdb"), used)}
    )
    run = run_fake(volumes.step, [node], monkeypatch)
    (failure,) = map(str, run.results[HOST].failures)
    assert failure.startswith("volumes: Data volume | volumes checks")
    (refusal,) = run.ran(HOST, "exit 1$")
    assert f"@fake/node1: refusing to format {ID.format('c')} (vdc): it holds a ext4 filesystem" in refusal
    assert not run.ran(HOST, DESTRUCTIVE + "|apt-get|/etc/fstab|mdadm.conf")


def test_forced_disk_is_erased_then_formatted_with_force(monkeypatch):
    used = _disk("vdb", fstype="ext4", uuid="6d1f", label="mine")
    node = fake_node(
        "node1", _settings(data_disks=[ID.format("b")], force_format=[ID.format("b")]), {"lsblk -J -O -b": _lsblk(used)}
    )
    run = run_fake(volumes.step, [node], monkeypatch)
    assert run.results[HOST].ok
    assert run.ran(HOST, "wipefs|mkfs") == [
        f"wipefs -a {ID.format('b')}",
        run.ran(HOST, "mkfs")[0],
    ]
    assert run.ran(HOST, "mkfs")[0].startswith("mkfs.xfs -q -f -L PVDATA")


MD_UUID = "00112233-4455-6677-8899-aabbccddeeff"
MDADM_STAMP = stamps.digest([vol_ops.mdadm_conf_line(MD_UUID)])  # the initramfs has this array


def _assembled_array_node(initramfs_stamp: str | None):
    """A host an earlier run finished the volumes step on: our array assembled and mounted,
    fstab and mdadm.conf written; its initramfs stamp as given."""
    fs_uuid, md_uuid = "1b4e28ba-2fa1-11d2-883f-0016d3cca427", MD_UUID
    members = [
        _disk(
            n,
            fstype="linux_raid_member",
            label="provision:data",
            uuid=md_uuid,
            children=[{"name": "md127", "type": "raid0", "mountpoints": ["/data"]}],
        )
        for n in ("vdb", "vdc")
    ]
    s = _settings(data_disks=[ID.format("b"), ID.format("c")], force_format=[ID.format("b")])
    return fake_node(
        "node1",
        s,
        {
            "lsblk -J -O -b": _lsblk(*members),
            "blkid -p -o export /dev/md127": [
                "DEVNAME=/dev/md127",
                f"UUID={fs_uuid}",
                "TYPE=xfs",
                "LABEL=PVDATA",
                "provision-blkid-exit=0",
            ],
            re.compile(r"grep .*/etc/fstab"): [vol_ops.fstab_line(fs_uuid, s)],
            re.compile(r"grep .*mdadm\.conf"): [vol_ops.mdadm_conf_line(md_uuid)],
            "/proc/self/mountinfo": ["40 25 9:127 / /data rw,noatime shared:30 - xfs /dev/md127 rw,attr2"],
            "dpkg -l": [
                "ii  mdadm  4.2-5  amd64  Tool to administer Linux MD arrays",
                "ii  xfsprogs  6.1.0-1  amd64  Utilities for managing the XFS filesystem",
            ],
            re.compile(r"cat /var/lib/provision/stamps/initramfs-mdadm"): [initramfs_stamp] if initramfs_stamp else [],
        },
    )


def test_rerun_on_our_assembled_array_changes_nothing_on_disk(monkeypatch):
    node = _assembled_array_node(MDADM_STAMP)
    run = run_fake(volumes.step, [node], monkeypatch)
    assert run.results[HOST].ok, run.results[HOST].failures
    # force_format names a member, yet our own volume is never reformatted
    assert not run.ran(HOST, DESTRUCTIVE + "|update-initramfs|>> /etc/fstab|sed .*/etc/fstab")
    assert not run.ran(HOST, "apt-get")  # packages present: not even an apt cache refresh


def test_initramfs_is_updated_when_mdadm_conf_is_right_but_its_stamp_is_missing(monkeypatch):
    # An `up` killed after writing mdadm.conf and before update-initramfs: the file is
    # right, so only the stamp says the initramfs does not know the array yet.
    run = run_fake(volumes.step, [_assembled_array_node(None)], monkeypatch)
    assert run.results[HOST].ok, run.results[HOST].failures
    assert run.ran(HOST, "^update-initramfs -u$")
    assert run.ran(HOST, re.escape(stamps.stamp_command("initramfs-mdadm", MDADM_STAMP)))
    assert not run.ran(HOST, r"(>>|sed -i).*mdadm\.conf")  # the file itself is left alone


def test_forced_member_is_erased_and_only_the_blank_member_is_checked_before_the_array(monkeypatch):
    used = _disk("vdb", fstype="ext4", uuid="6d1f", label="mine")
    node = fake_node(
        "node1",
        _settings(data_disks=[ID.format("b"), ID.format("c")], force_format=["NVME-node1-b"]),
        {"lsblk -J -O -b": _lsblk(used, _disk("vdc"))},
    )
    run = run_fake(volumes.step, [node], monkeypatch)
    assert run.results[HOST].ok, run.results[HOST].failures
    wipe, create, mkfs = run.ran(HOST, DESTRUCTIVE)[:3]
    assert wipe == f"wipefs -a {ID.format('b')}"
    assert re.match(_guarded(ID.format("c")) + "mdadm --create ", create)
    assert vol_ops.blank_guard(ID.format("b")) not in create
    # stale signatures of an earlier array on the erased member may show through the new one
    assert mkfs.startswith("mkfs.xfs -q -f -L PVDATA")


def test_raid_level_the_disks_cannot_make_is_refused_before_a_forced_disk_is_erased(monkeypatch):
    used = _disk("vdb", fstype="ext4", uuid="6d1f", label="mine")
    s = _settings(data_disks=[ID.format("b"), ID.format("c")], force_format=[ID.format("b")], raid_level=5)
    node = fake_node("node1", s, {"lsblk -J -O -b": _lsblk(used, _disk("vdc"))})
    run = run_fake(volumes.step, [node], monkeypatch)
    (refusal,) = run.ran(HOST, "exit 1$")
    assert "@fake/node1: raid_level 5 needs at least 3 disks but data_disks gives 2" in refusal
    assert not run.ran(HOST, DESTRUCTIVE + "|apt-get|/etc/fstab|mdadm.conf")


def _our_running_array(blkid: list[str]) -> dict:
    md_uuid = "00112233-4455-6677-8899-aabbccddeeff"
    members = [
        _disk(
            n,
            fstype="linux_raid_member",
            label="provision:data",
            uuid=md_uuid,
            children=[{"name": "md127", "type": "raid0", "mountpoints": [None]}],
        )
        for n in ("vdb", "vdc")
    ]
    return {"lsblk -J -O -b": _lsblk(*members), "blkid -p -o export /dev/md127": blkid}


def test_blkid_failing_on_our_array_is_a_refusal_not_a_blank_device(monkeypatch):
    node = fake_node(
        "node1", _settings(data_disks=[ID.format("b"), ID.format("c")]), _our_running_array(["provision-blkid-exit=4"])
    )
    run = run_fake(volumes.step, [node], monkeypatch)
    (refusal,) = run.ran(HOST, "exit 1$")
    assert "cannot tell what our array /dev/md127 holds (blkid -p failed (exit 4)); refusing to format it" in refusal
    assert not run.ran(HOST, DESTRUCTIVE + "|/etc/fstab")


def test_our_array_without_a_filesystem_gets_one_after_the_blank_check(monkeypatch):
    node = fake_node(
        "node1", _settings(data_disks=[ID.format("b"), ID.format("c")]), _our_running_array(["provision-blkid-exit=2"])
    )
    run = run_fake(volumes.step, [node], monkeypatch)
    assert run.results[HOST].ok, run.results[HOST].failures
    (mkfs,) = run.ran(HOST, "mkfs")
    assert re.fullmatch(_guarded("/dev/md127") + r"mkfs\.xfs -q -L PVDATA -m uuid=[0-9a-f-]{36} /dev/md127", mkfs)
    assert not run.ran(HOST, "mdadm --create|wipefs")


def test_plan_shows_exactly_which_disks_auto_picked_and_which_it_left_out():
    from provision import engine
    from provision.cli import up
    from provision.cli.console import out
    from provision.inventory import Cluster

    used = _disk("vdc", fstype="xfs", uuid="u2", label="backup")
    node = fake_node(
        "node1", _settings(data_disks="auto"), {"lsblk -J -O -b": _lsblk(_disk("vdb"), used, _disk("vdd"))}
    )
    plans = engine.plan_steps(Cluster(path=None, nodes=(node,)), [volumes.step])  # type: ignore[arg-type]
    notes = plans[HOST].notes
    assert f"volumes: data disk {ID.format('b')} (vdb) 1 GiB: blank, will be formatted" in notes
    assert f"volumes: data disk {ID.format('d')} (vdd) 1 GiB: blank, will be formatted" in notes
    assert f"volumes: not picked {ID.format('c')} (vdc): holds a xfs filesystem" in notes
    assert "volumes: not picked /dev/vda (vda): root disk" in notes
    assert "volumes: volume: xfs on RAID0 of 2 disks at /data" in notes
    with out.capture() as shown:
        up.print_plan(plans[HOST])
    assert f"volumes: data disk {ID.format('b')} (vdb) 1 GiB: blank, will be formatted" in shown.get()
    assert f"volumes: not picked {ID.format('c')} (vdc): holds a xfs filesystem" in shown.get()


def test_up_summary_names_the_disks_the_volume_was_built_from(monkeypatch):
    node = fake_node("node1", _settings(data_disks="auto"), {"lsblk -J -O -b": _lsblk(_disk("vdb"))})
    run = run_fake(volumes.step, [node], monkeypatch)
    assert run.results[HOST].ok, run.results[HOST].failures
    assert f"volumes: data disk {ID.format('b')} (vdb) 1 GiB: blank, will be formatted" in run.results[HOST].notes


def test_a_missing_package_is_installed_only_after_the_apt_locks_are_free(monkeypatch):
    node = fake_node(
        "node1",
        _settings(data_disks=[ID.format("b"), ID.format("c")]),
        {"lsblk -J -O -b": _lsblk(_disk("vdb"), _disk("vdc"))},
    )
    run = run_fake(volumes.step, [node], monkeypatch)
    wait = lock_wait_command(Settings().apt_lock_wait_s)
    commands = run.commands[HOST]
    installs = [i for i, c in enumerate(commands) if re.search(r"apt-get .*install", c)]
    assert installs
    assert wait in commands
    assert commands.index(wait) < installs[0]
