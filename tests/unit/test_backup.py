"""Backups: secrets stay in files, command lines and templates never hold the password,
the deploy's commands on pyinfra's @fake connector, and the pure restore helpers."""

from __future__ import annotations

import stat
from dataclasses import replace
from pathlib import Path

import pytest

from provision import backup, runner
from provision.deploys import backups
from provision.errors import InputError
from provision.inventory import Cluster, Node, SshTarget
from provision.settings import Settings
from tests.helpers.pyinfra_fake import fake_node, run_fake


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _node(name: str, groups: tuple[str, ...] = (), **kw: object) -> Node:
    settings = Settings(cluster_address=f"10.77.0.{name[-1]}", cluster_cidr="10.77.0.0/24", **kw)  # type: ignore[arg-type]
    return Node(name, SshTarget(name, 22, "root", None, None, "yes"), groups, settings)


def _cluster(tmp_path: Path, *nodes: Node) -> Cluster:
    return Cluster(tmp_path / "inv.py", nodes)


def test_generated_password_file_has_mode_0600_under_the_state_dir(tmp_path, state_dir):
    cluster = _cluster(tmp_path, _node("node1", ("storage",)))
    path = backup.password_file(cluster, cluster.nodes[0])
    assert path.parent.parent == state_dir
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(path.read_text().strip()) >= 32
    assert backup.password_file(cluster, cluster.nodes[0]).read_text() == path.read_text()  # generated once


def test_a_configured_password_file_that_is_missing_is_bad_input(tmp_path):
    node = _node("node1", ("storage",), backup_password_file=str(tmp_path / "nope"))
    with pytest.raises(InputError, match="does not exist"):
        backup.password_file(_cluster(tmp_path, node), node)


def test_default_repository_is_per_host_sftp_on_the_storage_hosts_cluster_address(tmp_path):
    storage, other = _node("node1", ("storage",)), _node("node2", backup_paths=["/home"])
    cluster = _cluster(tmp_path, storage, other)
    assert backup.repository(other, cluster) == "sftp:provision-backup@10.77.0.1:/data/backups/restic/node2"
    custom = _node("node3", backup_repository="s3:s3.example/bucket/{host}")
    assert backup.repository(custom, cluster) == "s3:s3.example/bucket/node3"


def test_storage_host_backs_up_the_checkpoints_share_and_others_only_when_asked(tmp_path):
    storage, plain, asked = _node("node1", ("storage",)), _node("node2"), _node("node3", backup_paths=["/x"])
    cluster = _cluster(tmp_path, storage, plain, asked)
    assert backup.skip_reason(storage, cluster) is None
    assert backup.backup_paths(storage) == ["/shared/checkpoints"]
    assert "storage host" in str(backup.skip_reason(plain, cluster))
    assert backup.skip_reason(asked, cluster) is None and backup.backup_paths(asked) == ["/x"]


def test_restic_command_lines_never_hold_the_password(tmp_path):
    node = _node("node1", ("storage",))
    cluster = _cluster(tmp_path, node)
    password = backup.password_file(cluster, node).read_text().strip()
    commands = [backup.run_command(), backup.journal_command(), backup.snapshots_command("node1"),
                backup.restore_command("latest", "/data/restores/x", "node1"),
                backup.checksum_command("/shared/checkpoints"), backup.as_root(replace(
                    node, ssh=replace(node.ssh, user="ops")), backup.snapshots_command("node1"))]
    files = backups.unit_files(node, cluster)
    assert all(password not in c for c in commands)
    assert all(password not in text for text in files.values())
    assert f"RESTIC_PASSWORD_FILE={backup.PASSWORD_FILE}" in files[backup.ENV_FILE]


def test_backup_script_backs_up_then_forgets_with_the_retention_settings(tmp_path):
    node = _node("node1", ("storage",), backup_keep_daily=3, backup_keep_weekly=2, backup_keep_monthly=1)
    script = backups.unit_files(node, _cluster(tmp_path, node))[backup.SCRIPT]
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("$restic")]
    assert lines == [
        "$restic init",
        "$restic backup --tag provision --host node1 /shared/checkpoints",
        "$restic forget --prune --tag provision --host node1 --keep-daily 3 --keep-weekly 2 --keep-monthly 1",
    ]


def test_service_and_timer_render_with_schedule_and_paths(tmp_path):
    node = _node("node1", ("storage",), backup_schedule="*-*-* 02:30:00")
    files = backups.unit_files(node, _cluster(tmp_path, node))
    service = files[f"/etc/systemd/system/{backup.UNIT}"]
    timer = files[f"/etc/systemd/system/{backup.TIMER}"]
    assert "Type=oneshot" in service and f"ExecStart={backup.SCRIPT}" in service
    assert "RequiresMountsFor=/shared/checkpoints" in service
    assert "OnCalendar=*-*-* 02:30:00" in timer and "Persistent=true" in timer
    wrapper = files[backup.WRAPPER]
    assert f'-o sftp.command="ssh -F {backup.SSH_CONFIG} 10.77.0.1 -s sftp"' in wrapper


def test_ssh_config_pins_the_storage_host_key_when_known():
    text = backups.ssh_config_text("10.77.0.1", "yes")
    assert "User provision-backup" in text and "StrictHostKeyChecking yes" in text
    assert f"IdentityFile {backup.KEY_FILE}" in text and "BatchMode yes" in text
    assert backups.known_hosts_text("10.77.0.1", ["ssh-ed25519 AAAA"]) == "10.77.0.1 ssh-ed25519 AAAA\n"


def test_plan_never_shows_the_contents_of_a_secret_upload(tmp_path):
    from pyinfra.api.command import FileUploadCommand

    secret = tmp_path / "pw"
    secret.write_text("hunter2-not-shown\n")
    dest = runner.secret_upload("/etc/provision/backup/password")
    diff = runner._upload_diff(None, FileUploadCommand(str(secret), dest))
    assert "hunter2" not in diff and "secret" in diff


def test_deploy_sets_up_account_secrets_and_timer_without_the_password_in_any_command(tmp_path, monkeypatch):
    server = fake_node("node1", Settings(cluster_address="10.77.0.1", cluster_cidr="10.77.0.0/24"), {},
                       groups=("storage",))
    client = fake_node("node2", Settings(cluster_address="10.77.0.2"), {})
    cluster = Cluster(tmp_path / "inv.py", (server, client))
    password = backup.password_file(cluster, server).read_text().strip()
    monkeypatch.setattr(runner, "run_steps", _run_steps_with_path(runner.run_steps, tmp_path / "inv.py"))
    run = run_fake(backups.step, [server, client], monkeypatch)
    s, c = server.name, client.name
    assert run.results[s].ok, run.results[s].failures
    assert run.ran(s, r"useradd .*provision-backup")
    assert run.ran(s, r"mkdir -p /data/backups/restic")
    assert run.ran(s, r"chmod 600 /etc/provision/backup/password")
    assert run.ran(s, r"systemctl start provision-backup\.timer")
    assert run.ran(s, r"systemctl enable provision-backup\.timer")
    assert not run.ran(c, r"restic|provision-backup")  # node2 has no backup_paths
    assert any("checkpoints share is backed up on the storage host" in n for n in run.results[c].notes)
    everything = [cmd for cmds in run.commands.values() for cmd in cmds]
    assert everything and all(password not in cmd for cmd in everything)


def _run_steps_with_path(original, path):
    """run_fake builds a Cluster without a path; the backups step keys secrets on it."""
    def wrapped(cluster, steps, *args, **kwargs):
        return original(replace(cluster, path=path), steps, *args, **kwargs)
    return wrapped


def test_checksums_are_parsed_and_compared():
    restored = backup.parse_checksums("aa  ./a.pt\nbb  ./sub/b.pt\ncc  ./c.pt\n")
    live = backup.parse_checksums("aa  ./a.pt\nbX  ./sub/b.pt\n")
    assert backup.compare(restored, live) == {"identical": 1, "different": ["sub/b.pt"], "missing_live": ["c.pt"]}


def test_snapshots_json_is_parsed():
    text = ('[{"time":"2026-11-29T23:00:00.1+00:00","paths":["/shared/checkpoints"],"hostname":"node1",'
            '"tags":["provision"],"id":"4f1b2c3d4e5f","short_id":"4f1b2c3d"}]')
    (snap,) = backup.parse_snapshots(text)
    assert (snap.short_id, snap.hostname, snap.paths) == ("4f1b2c3d", "node1", ["/shared/checkpoints"])
    assert backup.parse_snapshots("null") == []


def test_restore_check_passes_only_when_files_were_compared_and_matched():
    assert backup.check_verdict({"identical": 3, "different": [], "missing_live": []}) == (
        True, "3 file(s) restored identical to live")
    assert backup.check_verdict({"identical": 0, "different": [], "missing_live": []}) == (
        False, "the snapshot holds no files: nothing was checked")
    assert backup.check_verdict({"identical": 2, "different": ["a.pt"], "missing_live": []})[0] is False
