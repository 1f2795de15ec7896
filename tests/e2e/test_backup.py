"""Backups end to end on the shared testbed: write, back up, delete, restore, compare;
check the repository; the password stays in 0600 files and out of every log the run produced."""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path

import pytest

from provision import inventory, remote
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
    # The demo's own flags: no --host, so every host that backs up checks its latest snapshot.
    checks = {h["host"]: h["data"]["check"] for h in run.json()["hosts"]}
    assert sorted(checks) == [n.name for n in cluster.nodes if backup_layout.skip_reason(n, cluster) is None]
    assert all(c["identical"] > 0 and not c["different"] and not c["missing_live"] for c in checks.values()), checks


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


def _sftp(node, address: str, batch: str, *options: str):
    """sftp from a node as root to ``address`` with the node's backup SSH settings (its own
    key and account)."""
    argv = " ".join(["sftp", "-F", backup_layout.SSH_CONFIG, *options, "-b", "-", address])
    return remote.run(node, f"printf {shlex.quote(batch)} | {argv}", timeout=120)


def test_root_on_one_node_reaches_its_own_backups_and_no_other_nodes(cluster, testbed):
    """The privilege drill for backups: node2 backs up /home to an account of its own on
    node1, confined to its own directory. As root on node2, with everything node2 holds,
    try node1's repository every way SFTP and SSH allow: each attempt fails."""
    client, storage = cluster.node("node2"), cluster.storage_node()
    assert storage is not None
    assert backup_layout.skip_reason(client, cluster) is None
    run = cli("backup", "run", str(testbed.inventory_path), "--host", "node2", "--json")
    assert run.exit_code == 0, run.stdout + run.stderr  # its own repository works
    address = storage.cluster_address

    # Its own account sees one directory, its repository, and cannot leave it.
    tries = "cd /\nls -1a\ncd ..\nls -1a\n-ls -1a /data/backups/restic\n-put /etc/passwd /escape\n"
    own = _sftp(client, address, tries)
    assert own.ok, own.stderr
    listed = [line.strip() for line in own.stdout.splitlines() if line.strip() and not line.startswith("sftp>")]
    assert sorted(set(listed)) == [".", "..", "repo"], own.stdout  # / and /.. are the same
    assert listed.count("repo") == 2, own.stdout
    assert '"/data/backups/restic" not found' in own.stderr, own.stderr  # the host's paths are not there
    assert "Permission denied" in own.stderr, own.stderr  # no write outside its repository
    # node2's key does not open node1's account, nor the shared account of earlier versions.
    for account in (backup_layout.account_name("node1"), backup_layout.LEGACY_ACCOUNT):
        other = _sftp(client, address, "ls /\n", "-o", f"User={account}")
        assert not other.ok, account
        assert "Permission denied" in other.stderr, (account, other.stderr)
    # No shell, no command, no port forward through its own account.
    shell = remote.run(client, f"ssh -F {backup_layout.SSH_CONFIG} {address} id", timeout=60)
    assert not shell.ok
    assert "uid=" not in shell.stdout, shell.stdout
    effective = sh(
        storage,
        f"/usr/sbin/sshd -T -C user={backup_layout.account_name('node2')},host=node2,addr={client.cluster_address}",
    )
    for setting in ("forcecommand internal-sftp", "allowtcpforwarding no", "permittty no", "x11forwarding no"):
        assert setting in effective.splitlines(), setting
    # On the storage host: root owns every directory above each repository (sshd checks
    # that too), and each repository belongs to its own account alone.
    root = backup_layout.repository_root(storage)
    assert sh(storage, f"stat -c '%a %U' {root}").strip() == "711 root"
    for name in ("node1", "node2"):
        chroot = backup_layout.chroot_dir(storage, name)
        assert sh(storage, f"stat -c '%a %U' {chroot}").strip() == "755 root"
        owner = sh(storage, f"stat -c '%a %U' {chroot}/repo").strip()
        assert owner == f"700 {backup_layout.account_name(name)}"
    # Each host's password is its own.
    passwords = {backup_layout.password_file(cluster, n).read_text() for n in (client, storage)}
    assert len(passwords) == 2

    # The training user on node2 holds none of it: not the password, not the key, not the
    # ssh settings, and no way into its own node's repository either.
    user = client.settings.training_user
    for path in (backup_layout.PASSWORD_FILE, backup_layout.KEY_FILE, backup_layout.SSH_CONFIG):
        read = remote.run(client, f"runuser -u {user} -- cat {shlex.quote(path)}", timeout=60)
        assert not read.ok, (path, read.stdout)
        assert "Permission denied" in read.stderr, (path, read.stderr)
    wrapper = remote.run(client, f"runuser -u {user} -- {backup_layout.WRAPPER} snapshots", timeout=120)
    assert not wrapper.ok, wrapper.stdout  # it cannot read the env file that names the repository


def test_unknown_host_is_bad_input(testbed):
    run = cli("backup", "run", str(testbed.inventory_path), "--host", "nosuch")
    assert run.exit_code == 2
    assert "not a host of this inventory" in run.stderr
