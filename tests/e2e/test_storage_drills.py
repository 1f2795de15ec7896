"""Destructive storage drills on the shared testbed (run last): a disk that holds data is
refused and kept intact, force_format rebuilds (an `up` killed mid-rebuild converges on the
next run); an NFS client reboots while the server is down, and its shares work again once
the server is back."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import pytest

from provision import inventory
from tests.e2e.storage_helpers import cli, derived_inventory, sh
from tests.e2e.up_killed_at import killed_up

pytestmark = pytest.mark.destructive

DISK = "/dev/disk/by-id/virtio-NVME-node2-{}"


def _load(testbed):
    return inventory.load(Path(testbed.inventory_path))


def _hand_made_filesystem(node, token: str) -> None:
    """Take node2's volume apart and put someone else's ext4, with a file, on its 2nd disk."""
    sh(
        node,
        "umount /data; mdadm --stop /dev/md/data 2>/dev/null || mdadm --stop --scan; "
        f"wipefs -a {DISK.format(1)} {DISK.format(2)} >/dev/null",
    )
    sh(
        node,
        f"mkfs.ext4 -q -L mine {DISK.format(2)} && mkdir -p /mnt/mine && mount {DISK.format(2)} /mnt/mine "
        f"&& echo {token} > /mnt/mine/precious && umount /mnt/mine",
        timeout_s=600,
    )


def test_disk_holding_data_is_refused_and_stays_intact_until_force_format(testbed, provisioned, tmp_path):
    node = _load(testbed).node("node2")
    token = secrets.token_hex(16)
    _hand_made_filesystem(node, token)
    source = Path(testbed.inventory_path)
    plain = derived_inventory(source, source.with_name(f"e2e-node2-{token[:6]}.py"), ["node2"], {})
    forced = derived_inventory(
        source,
        source.with_name(f"e2e-node2-forced-{token[:6]}.py"),
        ["node2"],
        {"node2": {"force_format": [DISK.format(2)]}},
    )
    try:
        # base and volumes: the refusal comes from preflight, before base changes anything.
        refused = cli("up", str(plain), "--only", "base,volumes", "--json")
        said = refused.stdout + refused.stderr
        assert refused.exit_code == 1
        assert "node2" in said
        assert DISK.format(2) in said
        assert "ext4 filesystem" in said
        (row,) = refused.json()["hosts"]
        assert row["steps"] == [], row
        assert row["changed"] == 0, row
        assert row["failures"][0].startswith("preflight:"), row
        assert sh(node, f"blkid -o value -s LABEL {DISK.format(2)}").strip() == "mine"
        assert (
            sh(node, f"mount -o ro {DISK.format(2)} /mnt/mine && cat /mnt/mine/precious; umount /mnt/mine").strip()
            == token
        )

        # The rebuild, killed mid-volumes (issue 14's drill): the array and its xfs are made
        # and fstab names them, but systemd has not re-read fstab and /data is not mounted.
        assert killed_up(forced, "volumes", "Reload systemd (fstab changed)", "node2") == "node2"
        uuid = sh(node, "blkid -o value -s UUID /dev/md/data").strip()
        assert f"UUID={uuid} /data xfs" in sh(node, "cat /etc/fstab")
        assert sh(node, "findmnt -n /data || true").strip() == ""

        # The same command again adopts the array it made (never wipes it a second time),
        # runs the follow-ups the killed run owed, and mounts; the run after that changes nothing.
        rebuilt = cli("up", str(forced), "--only", "volumes", "--json")
        assert rebuilt.exit_code == 0, rebuilt.stdout + rebuilt.stderr
        source_dev, fstype, mounted_uuid = sh(node, "findmnt -n -o SOURCE,FSTYPE,UUID /data").split()
        assert source_dev.startswith("/dev/md")
        assert (fstype, mounted_uuid) == ("xfs", uuid)
        assert sh(node, "systemctl show -p NeedDaemonReload --value data.mount").strip() == "no"
        again = cli("up", str(forced), "--only", "volumes", "--json")
        assert again.exit_code == 0, again.stdout + again.stderr
        assert [h["changed"] for h in again.json()["hosts"]] == [0]
    finally:
        plain.unlink(missing_ok=True)
        forced.unlink(missing_ok=True)


def _wait_for(node, command: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        from provision import remote

        result = remote.run(node, command, timeout=60)
        if result.ok:
            return result.stdout
        last = result.stderr or result.stdout
        time.sleep(5)
    raise AssertionError(f"{node.name}: {command} did not succeed in {timeout_s:.0f}s: {last}")


def test_client_boots_while_the_server_is_down_and_mounts_when_it_is_back(testbed, provisioned):
    testbed.testbed.stop_node("node1", hard=True)
    try:
        testbed.testbed.stop_node("node2", hard=False)
        testbed.testbed.start_node("node2")  # returns once SSH answers: the boot did not hang on NFS
        client = _load(testbed).node("node2")
        assert sh(client, "systemctl is-active multi-user.target").strip() == "active"
        assert "autofs" in sh(client, "findmnt -n -o FSTYPE /shared/scratch")
        assert sh(client, "touch /var/tmp/still-works && echo ok").strip() == "ok"
    finally:
        testbed.testbed.start_node("node1")
    cluster = _load(testbed)
    server, client = cluster.node("node1"), cluster.node("node2")
    assert _wait_for(server, "findmnt -n -o FSTYPE /data", 300).strip() == "xfs"  # array assembled at boot
    _wait_for(server, "systemctl is-active nfs-server", 300)
    token = secrets.token_hex(8)
    user = client.settings.training_user
    _wait_for(client, f"timeout 50 su -s /bin/sh {user} -c 'echo {token} > /shared/scratch/after-reboot'", 600)
    assert sh(server, "cat /data/shared/scratch/after-reboot").strip() == token
