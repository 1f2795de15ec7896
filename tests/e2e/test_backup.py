"""Backups end to end on the shared testbed: write, back up, delete, restore, compare;
check the repository; the password stays in 0600 files and out of every log the run produced."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from provision import inventory
from provision.backup import runs as backup
from provision.inventory import Cluster
from provision.rules import backups as backup_layout
from tests.e2e.storage_helpers import cli, sh

FILES = 3  # checkpoint-like files written for the round trip
SIZE_KIB = 512  # each


@pytest.fixture(scope="module")
def cluster(testbed, provisioned) -> Cluster:
    return inventory.load(Path(testbed.inventory_path))


def _checksums(node, root: str) -> dict[str, str]:
    return backup.parse_checksums(sh(node, backup.checksum_command(root)))


def test_backup_round_trip_restores_identical_files_and_never_logs_the_password(cluster, testbed):
    node = cluster.node("node1")
    inv = str(testbed.inventory_path)
    run_dir = f"/shared/checkpoints/e2e-{secrets.token_hex(4)}"
    sh(
        node,
        f"mkdir -p {run_dir} && for i in $(seq 1 {FILES}); do "
        f"head -c {SIZE_KIB}K /dev/urandom > {run_dir}/step-$i.pt; done && sync",
    )
    before = _checksums(node, run_dir)
    assert len(before) == FILES

    outputs = [cli("backup", "run", inv, "--host", "node1", "--json")]
    assert outputs[-1].exit_code == 0, outputs[-1].stdout + outputs[-1].stderr
    snapshot = outputs[-1].json()["hosts"][0]["data"]["snapshot"]
    assert run_dir.rsplit("/", 1)[0] in snapshot["paths"][0]

    sh(node, f"rm -rf {run_dir}")
    outputs.append(cli("backup", "restore", inv, "--host", "node1", "--snapshot", snapshot["id"], "--json"))
    assert outputs[-1].exit_code == 0, outputs[-1].stdout + outputs[-1].stderr
    target = outputs[-1].json()["hosts"][0]["data"]["target"]
    assert target.startswith("/data/restores/")
    assert _checksums(node, f"{target}{run_dir}") == before
    assert sh(node, f"test -e {run_dir} || echo absent").strip() == "absent"  # live data untouched

    outputs.append(cli("backup", "list", inv, "--json"))
    assert outputs[-1].exit_code == 0
    listed = [s["id"] for h in outputs[-1].json()["hosts"] for s in h["data"]["snapshots"]]
    assert snapshot["id"] in listed

    password = backup_layout.password_file(cluster, node).read_text().strip()
    journal = sh(node, f"journalctl -u {backup_layout.UNIT} --no-pager -o cat")
    assert "snapshot" in journal  # restic's own output is there ...
    logs = [o.stdout + o.stderr for o in outputs] + [journal]
    assert all(password not in log for log in logs)  # ... and the password is not


def test_restore_refuses_a_non_empty_target(cluster, testbed):
    node = cluster.node("node1")
    sh(node, "mkdir -p /data/e2e-busy && echo live > /data/e2e-busy/keep")
    run = cli("backup", "restore", str(testbed.inventory_path), "--host", "node1", "--target", "/data/e2e-busy")
    assert run.exit_code == 1
    assert "not empty" in run.stdout + run.stderr
    assert sh(node, "cat /data/e2e-busy/keep").strip() == "live"


def test_restore_check_compares_against_live_data(cluster, testbed):
    # Earlier tests may have emptied or changed the share since the last snapshot: put a
    # file there and back up, so the check has something real to compare.
    server = cluster.storage_node()
    sh(server, f"echo check-me > {server.settings.nfs_mount_root}/checkpoints/check-me.txt")
    assert cli("backup", "run", str(testbed.inventory_path)).exit_code == 0
    run = cli("backup", "restore", str(testbed.inventory_path), "--check", "--json")
    assert run.exit_code == 0, run.stdout + run.stderr
    assert run.json()["hosts"][0]["data"]["check"]["identical"] > 0


def test_check_passes_on_every_backing_up_host_after_a_backup(cluster, testbed):
    inv = str(testbed.inventory_path)
    assert cli("backup", "run", inv).exit_code == 0  # a snapshot to check, whatever ran before
    expected = [n.name for n in cluster.nodes if backup_layout.skip_reason(n, cluster) is None]
    outputs = [cli("backup", "check", inv, "--json")]
    assert outputs[-1].exit_code == 0, outputs[-1].stdout + outputs[-1].stderr
    hosts = outputs[-1].json()["hosts"]
    assert [(h["host"], h["ok"], h["detail"]) for h in hosts] == [(n, True, "no errors found") for n in expected]

    # Reading every pack back, as a person sees it: one "passed" row per host.
    outputs.append(cli("backup", "check", inv, "--read-data-subset", "100%"))
    assert outputs[-1].exit_code == 0, outputs[-1].stdout + outputs[-1].stderr
    for name in expected:
        row = next(line for line in outputs[-1].stdout.splitlines() if name in line)
        assert "passed" in row
        assert "FAILED" not in row
    password = backup_layout.password_file(cluster, cluster.node(expected[0])).read_text().strip()
    assert all(password not in o.stdout + o.stderr for o in outputs)


def test_secrets_on_the_host_are_root_only(cluster):
    node = cluster.node("node1")
    assert sh(node, f"stat -c '%a %U %G' {backup_layout.PASSWORD_FILE}").strip() == "600 root root"
    assert sh(node, f"stat -c '%a %U' {backup_layout.KEY_FILE}").strip() == "600 root"
    assert sh(node, f"stat -c '%a' {backup_layout.CONFIG_DIR}").strip() == "700"
    controller = backup_layout.password_file(cluster, node)
    assert oct(controller.stat().st_mode & 0o777) == "0o600"


def test_unknown_host_is_bad_input(testbed):
    run = cli("backup", "run", str(testbed.inventory_path), "--host", "nosuch")
    assert run.exit_code == 2
    assert "not a host of this inventory" in run.stderr
