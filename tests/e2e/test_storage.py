"""Storage end to end on the shared testbed, after `provision up` (the `provisioned`
fixture): the RAID0 data volume and NFS between real VMs. The idempotent re-run that keeps
the volume's data is test_up.py's second `up` (the storage steps, through the CLI)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from provision import inventory
from provision.inventory import Cluster
from tests.e2e.storage_helpers import sh


@pytest.fixture(scope="module")
def cluster(testbed, provisioned) -> Cluster:
    return inventory.load(Path(testbed.inventory_path))


def test_data_volume_is_raid0_xfs_of_two_disks_mounted_by_uuid(cluster):
    node = cluster.node("node1")
    source, fstype, uuid = sh(node, "findmnt -n -o SOURCE,FSTYPE,UUID /data").split()
    assert source.startswith("/dev/md")
    assert fstype == "xfs"
    md = sh(node, f"basename $(readlink -f {source})").strip()
    assert sh(node, f"cat /sys/block/{md}/md/level").strip() == "raid0"
    assert sh(node, f"cat /sys/block/{md}/md/raid_disks").strip() == "2"
    members = sh(node, f"ls /sys/block/{md}/slaves").split()
    by_id = sh(node, "ls -l /dev/disk/by-id/ | grep virtio-NVME-node1-")
    assert sorted(members) == sorted(line.rsplit("/", 1)[-1] for line in by_id.splitlines())
    fstab = [line.split() for line in sh(node, "cat /etc/fstab").splitlines() if " /data " in line]
    options = "defaults,noatime,nofail,x-systemd.device-timeout=300s"
    assert fstab == [[f"UUID={uuid}", "/data", "xfs", options, "0", "0"]]
    assert "name=provision:data" in sh(node, "cat /etc/mdadm/mdadm.conf")


def test_a_file_written_on_a_client_is_seen_on_the_server(cluster, provisioned):
    client, server = cluster.node("node2"), cluster.node("node1")
    user = client.settings.training_user
    name, token = f"e2e-{secrets.token_hex(4)}", secrets.token_hex(16)
    sh(client, f"su -s /bin/sh {user} -c 'echo {token} > /shared/scratch/{name}' && sync")
    assert sh(server, f"cat /data/shared/scratch/{name}").strip() == token
    assert sh(server, f"stat -c %U /data/shared/scratch/{name}").strip() == user


def test_a_file_written_by_one_client_is_read_by_another_with_the_same_checksum(cluster, provisioned):
    # The testbed has one client (node2); the second client is the server mounting its own
    # export over the cluster network, a real NFS 4.2 client like any other node's.
    client, server = cluster.node("node2"), cluster.node("node1")
    user = client.settings.training_user
    name = f"e2e-{secrets.token_hex(4)}"
    sh(client, f"su -s /bin/sh {user} -c 'head -c 8M /dev/urandom > /shared/scratch/{name}' && sync")
    written = sh(client, f"sha256sum /shared/scratch/{name}").split()[0]
    mnt = f"/mnt/e2e-nfs-{secrets.token_hex(4)}"
    sh(server, f"mkdir -p {mnt} && mount -t nfs4 -o vers=4.2,hard {server.cluster_address}:/data/shared/scratch {mnt}")
    try:
        assert "nfs4" in sh(server, f"findmnt -n -o FSTYPE {mnt}")
        assert sh(server, f"sha256sum {mnt}/{name}").split()[0] == written
    finally:
        sh(server, f"umount {mnt} && rmdir {mnt}")


def test_root_on_a_client_is_squashed(cluster, provisioned):
    client = cluster.node("node2")
    result = sh(client, "touch /shared/scratch/e2e-root 2>&1; echo rc=$?")
    assert "rc=0" not in result
    assert "Permission denied" in result


def test_client_mounts_are_nfs_4_2_over_the_cluster_network(cluster, provisioned):
    client, server = cluster.node("node2"), cluster.node("node1")
    sh(client, "ls /shared/checkpoints >/dev/null")  # the automount mounts on first access
    mounts = sh(client, "findmnt -n -t nfs4 -o SOURCE,OPTIONS /shared/checkpoints")
    source, options = mounts.split()
    assert source == f"{server.cluster_address}:/data/shared/checkpoints"
    assert "vers=4.2" in options
    assert "hard" in options
    assert "nosuid" in options.split(",")
    assert "nodev" in options.split(",")
