"""What the volumes, nfs and backups steps promise, checked from outside over SSH."""

from __future__ import annotations

from typing import Any, cast

import pytest

LABEL = "PVDATA"  # provision.rules.disks.LABEL; the suite runs without the package's deps
ARRAY_NAME = "provision:data"
BACKUP_DIR = "/etc/provision/backup"


def _name(host: Any) -> str:
    return str(host.backend.get_hostname())


def _is_server(host: Any, expected: dict[str, Any]) -> bool:
    return expected.get("storage_node") == _name(host)


def _fstab(host: Any, mount: str) -> list[str]:
    """The fields of the fstab entry that mounts at ``mount`` (empty when there is none)."""
    for line in host.file("/etc/fstab").content_string.splitlines():
        fields = line.split()
        if len(fields) >= 4 and not fields[0].startswith("#") and fields[1] == mount:
            return cast("list[str]", fields)
    return []


def _volume(settings: dict[str, Any]) -> None:
    if not settings["data_disks"]:
        pytest.skip("no data_disks on this host")


def test_data_volume_is_mounted_with_our_label_and_filesystem(host: Any, settings: dict[str, Any]) -> None:
    _volume(settings)
    mount = host.mount_point(settings["data_mount"])
    assert mount.exists
    assert mount.filesystem == settings["filesystem"]
    label = host.run(f"findmnt -n -o LABEL {settings['data_mount']}").stdout.strip()
    assert label == LABEL
    assert host.file(f"{settings['data_mount']}/.provision-volume").is_file


def test_data_volume_fstab_entry_is_by_uuid_nofail_with_device_timeout(host: Any, settings: dict[str, Any]) -> None:
    _volume(settings)
    fields = _fstab(host, settings["data_mount"])
    assert fields
    assert fields[0].startswith("UUID=")
    mounted_uuid = host.run(f"findmnt -n -o UUID {settings['data_mount']}").stdout.strip()
    assert fields[0] == f"UUID={mounted_uuid}"
    options = fields[3].split(",")
    assert "noatime" in options
    assert "nofail" in options
    assert any(o.startswith("x-systemd.device-timeout=") for o in options)


def test_raid_array_is_recorded_in_mdadm_conf(host: Any, settings: dict[str, Any]) -> None:
    _volume(settings)
    source = host.run(f"findmnt -n -o SOURCE {settings['data_mount']}").stdout.strip()
    if not source.startswith("/dev/md"):
        pytest.skip("single-disk volume")
    assert f"name={ARRAY_NAME}" in host.file("/etc/mdadm/mdadm.conf").content_string
    level = host.run(f"cat /sys/block/{host.run(f'readlink -f {source}').stdout.strip().split('/')[-1]}/md/level")
    assert level.stdout.strip() == f"raid{settings['raid_level']}"


def test_nfs_server_exports_to_the_cluster_network_only(
    host: Any, settings: dict[str, Any], expected: dict[str, Any]
) -> None:
    if not _is_server(host, expected):
        pytest.skip("not the storage host")
    assert host.service("nfs-server").is_running
    assert host.service("nfs-server").is_enabled
    exports = parse_exportfs(host.run("exportfs -v").stdout)
    for share in settings["nfs_exports"]:
        clients = exports.get(f"{settings['nfs_export_root']}/{share}")
        assert clients, f"{share} is not exported: {exports}"
        # Exactly the cluster network, never a wider one or everyone.
        assert [c for c, _ in clients] == [settings["cluster_cidr"]]
        options = clients[0][1]
        assert {"rw", "sync", "root_squash"} <= options
        assert not {"async", "no_root_squash"} & options


def parse_exportfs(text: str) -> dict[str, list[tuple[str, set[str]]]]:
    """`exportfs -v` as path -> [(client, options)]. It prints a long path alone on its
    line and the client under it, a short one on the same line."""
    import re

    out: dict[str, list[tuple[str, set[str]]]] = {}
    for path, client, options in re.findall(r"(/\S*)\s+([^\s(]+)\(([^)]*)\)", text):
        out.setdefault(path, []).append((client, set(options.split(","))))
    return out


def test_shares_belong_to_the_training_user(host: Any, settings: dict[str, Any], expected: dict[str, Any]) -> None:
    if not _is_server(host, expected):
        pytest.skip("not the storage host")
    for share in settings["nfs_exports"]:
        assert host.file(f"{settings['nfs_export_root']}/{share}").user == settings["training_user"]


def test_shares_are_at_the_same_path_on_every_node(host: Any, settings: dict[str, Any]) -> None:
    for share in settings["nfs_exports"]:
        path = f"{settings['nfs_mount_root']}/{share}"
        assert host.run(f"timeout 30 stat {path}").rc == 0  # an automount mounts on this access
        assert host.file(path).is_directory


def test_nfs_client_mounts_are_v4_2_hard_nosuid_nodev_automount_nofail(
    host: Any, settings: dict[str, Any], expected: dict[str, Any]
) -> None:
    if _is_server(host, expected) or not expected.get("storage_node"):
        pytest.skip("not an NFS client")
    server = expected["all_nodes"][expected["storage_node"]]
    for share in settings["nfs_exports"]:
        fields = _fstab(host, f"{settings['nfs_mount_root']}/{share}")
        assert fields[0] == f"{server}:{expected['storage_export_root']}/{share}"  # the server's own tree
        options = fields[3].split(",")
        for wanted in (
            "vers=4.2",
            "hard",
            "nosuid",
            "nodev",
            "lookupcache=positive",
            "_netdev",
            "nofail",
            "x-systemd.automount",
        ):
            assert wanted in options


def _backs_up(host: Any, settings: dict[str, Any], expected: dict[str, Any]) -> bool:
    return bool(settings["backup_paths"]) or _is_server(host, expected)


def test_backup_timer_is_enabled_and_waiting(host: Any, settings: dict[str, Any], expected: dict[str, Any]) -> None:
    if not _backs_up(host, settings, expected):
        pytest.skip("this host has no backups")
    timer = host.service("provision-backup.timer")
    assert timer.is_enabled
    assert timer.is_running
    assert host.package("restic").is_installed


def test_backup_secrets_are_root_only(host: Any, settings: dict[str, Any], expected: dict[str, Any]) -> None:
    if not _backs_up(host, settings, expected):
        pytest.skip("this host has no backups")
    password = host.file(f"{BACKUP_DIR}/password")
    assert password.mode == 0o600
    assert password.user == "root"
    assert password.group == "root"
    assert host.file(BACKUP_DIR).mode == 0o700
    if settings["backup_repository"] is None:
        assert host.file(f"{BACKUP_DIR}/id_ed25519").mode == 0o600
