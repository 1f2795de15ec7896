"""Backups: secrets stay in files, command lines and templates never hold the password,
the deploy's commands on pyinfra's @fake connector, and the pure restore helpers."""

from __future__ import annotations

import hashlib
import json
import re
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from provision import engine
from provision.backup import runs as backup
from provision.deploys import backups
from provision.errors import InputError
from provision.facts.stack import BACKUP_STAMP
from provision.inventory import Cluster, Node, SshTarget
from provision.rules import backups as backup_layout
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
    path = backup_layout.password_file(cluster, cluster.nodes[0])
    assert path == backup_layout.generated_password_file(cluster, cluster.nodes[0])
    assert path.parent.parent.parent == state_dir
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(path.read_text().strip()) >= 32
    assert backup_layout.password_file(cluster, cluster.nodes[0]).read_text() == path.read_text()  # generated once


def test_a_configured_password_file_that_is_missing_is_bad_input(tmp_path):
    node = _node("node1", ("storage",), backup_password_file=str(tmp_path / "nope"))
    with pytest.raises(InputError, match="does not exist"):
        backup_layout.password_file(_cluster(tmp_path, node), node)


def test_default_repository_is_per_host_sftp_on_the_storage_hosts_cluster_address(tmp_path):
    storage, other = _node("node1", ("storage",)), _node("node2", backup_paths=["/home"])
    cluster = _cluster(tmp_path, storage, other)
    # The account's chroot is <data_mount>/backups/restic/node2; the repository is /repo in it.
    assert backup_layout.repository(other, cluster) == "sftp:provision-backup-node2@10.77.0.1:/repo"
    assert backup_layout.chroot_dir(storage, "node2") == "/data/backups/restic/node2"
    custom = _node("node3", backup_repository="s3:s3.example/bucket/{host}")
    assert backup_layout.repository(custom, cluster) == "s3:s3.example/bucket/node3"


def test_storage_host_backs_up_the_checkpoints_share_and_others_only_when_asked(tmp_path):
    storage, plain, asked = _node("node1", ("storage",)), _node("node2"), _node("node3", backup_paths=["/x"])
    cluster = _cluster(tmp_path, storage, plain, asked)
    assert backup_layout.skip_reason(storage, cluster) is None
    assert backup_layout.backup_paths(storage) == ["/shared/checkpoints"]
    assert "storage host" in str(backup_layout.skip_reason(plain, cluster))
    assert backup_layout.skip_reason(asked, cluster) is None
    assert backup_layout.backup_paths(asked) == ["/x"]


def test_restic_command_lines_never_hold_the_password(tmp_path):
    node = _node("node1", ("storage",))
    cluster = _cluster(tmp_path, node)
    password = backup_layout.password_file(cluster, node).read_text().strip()
    commands = [
        backup.run_command(),
        backup.journal_command(),
        backup.snapshots_command("node1"),
        backup.restore_command("latest", "/data/restores/x", "node1"),
        backup.checksum_command("/shared/checkpoints"),
        backup.as_root(replace(node, ssh=replace(node.ssh, user="ops")), backup.snapshots_command("node1")),
    ]
    files = backups.unit_files(node, cluster)
    assert all(password not in c for c in commands)
    assert all(password not in text for text in files.values())
    assert f"RESTIC_PASSWORD_FILE={backup_layout.PASSWORD_FILE}" in files[backup_layout.ENV_FILE]


def test_backup_script_backs_up_then_forgets_with_the_retention_settings(tmp_path):
    node = _node("node1", ("storage",), backup_keep_daily=3, backup_keep_weekly=2, backup_keep_monthly=1)
    script = backups.unit_files(node, _cluster(tmp_path, node))[backup_layout.SCRIPT]
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("$restic")]
    assert lines == [
        "$restic init",
        "$restic backup --tag provision --host node1 /shared/checkpoints",
        "$restic forget --prune --tag provision --host node1 --keep-daily 3 --keep-weekly 2 --keep-monthly 1",
    ]
    # Only a run that got through both (set -e) stamps the time `status` reports.
    assert "set -eu" in script
    last = script.rstrip().splitlines()[-1]
    assert last == (f"date +%s > {BACKUP_STAMP}.tmp && mv {BACKUP_STAMP}.tmp {BACKUP_STAMP}")
    assert script.index("forget --prune") < script.index(BACKUP_STAMP)


def test_service_and_timer_render_with_schedule_and_paths(tmp_path):
    node = _node("node1", ("storage",), backup_schedule="*-*-* 02:30:00")
    files = backups.unit_files(node, _cluster(tmp_path, node))
    service = files[f"/etc/systemd/system/{backup_layout.UNIT}"]
    timer = files[f"/etc/systemd/system/{backup_layout.TIMER}"]
    assert "Type=oneshot" in service
    assert f"ExecStart={backup_layout.SCRIPT}" in service
    assert "RequiresMountsFor=/shared/checkpoints" in service
    assert "OnCalendar=*-*-* 02:30:00" in timer
    assert "Persistent=true" in timer
    wrapper = files[backup_layout.WRAPPER]
    assert f"-o 'sftp.command=ssh -F {backup_layout.SSH_CONFIG} 10.77.0.1 -s sftp'" in wrapper


def test_ssh_config_pins_the_storage_host_key_when_known():
    text = backups.ssh_config_text("10.77.0.1", "provision-backup-node2", "yes")
    assert "User provision-backup-node2\n" in text
    assert "StrictHostKeyChecking yes" in text
    assert f"IdentityFile {backup_layout.KEY_FILE}" in text
    assert "BatchMode yes" in text
    assert backups.known_hosts_text("10.77.0.1", ["ssh-ed25519 AAAA"]) == "10.77.0.1 ssh-ed25519 AAAA\n"


def test_plan_never_shows_the_contents_of_a_secret_upload(tmp_path):
    from pyinfra.api.command import FileUploadCommand

    secret = tmp_path / "pw"
    secret.write_text("hunter2-not-shown\n")
    from provision.engine.plan import upload_diff

    dest = "/etc/provision/backup/password"  # as the deploy marks it with engine.secret_upload
    diff = upload_diff(None, FileUploadCommand(str(secret), dest), {dest})
    assert "hunter2" not in diff
    assert "secret" in diff


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
    text = (
        '[{"time":"2026-11-29T23:00:00.1+00:00","paths":["/shared/checkpoints"],"hostname":"node1",'
        '"tags":["provision"],"id":"4f1b2c3d4e5f","short_id":"4f1b2c3d"}]'
    )
    (snap,) = backup.parse_snapshots(text)
    assert (snap.short_id, snap.hostname, snap.paths) == ("4f1b2c3d", "node1", ["/shared/checkpoints"])
    assert backup.parse_snapshots("null") == []


def test_restore_check_passes_only_when_files_were_compared_and_matched():
    assert backup.check_verdict({"identical": 3, "different": [], "missing_live": []}) == (
        True,
        "3 file(s) restored identical to live",
    )
    assert backup.check_verdict({"identical": 0, "different": [], "missing_live": []}) == (
        False,
        "the snapshot holds no files: nothing was checked",
    )
    assert backup.check_verdict({"identical": 2, "different": ["a.pt"], "missing_live": []})[0] is False


# --- provision backup check -------------------------------------------------------------


def test_check_command_runs_restic_check_through_the_wrapper_with_an_optional_subset(tmp_path):
    assert backup.check_command() == f"{backup_layout.WRAPPER} check"
    assert backup.check_command("10%") == f"{backup_layout.WRAPPER} check --read-data-subset 10%"
    ops = replace(_node("node1"), ssh=replace(_node("node1").ssh, user="ops"))
    assert backup.as_root(ops, backup.check_command("1/5")) == (
        f"sudo -n sh -c '{backup_layout.WRAPPER} check --read-data-subset 1/5'"
    )


@pytest.mark.parametrize("value", ["10%", "2.5%", "100%", "1/5", "5/5", "256/256"])
def test_read_data_subset_accepts_what_every_supported_restic_accepts(value):
    assert backup.read_data_subset(f" {value} ") == value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0%", "above 0%"),
        ("101%", "at most 100%"),
        ("0/5", "1 <= n <= t"),
        ("6/5", "1 <= n <= t"),
        ("1/257", "t <= 256"),
        ("10", "not a subset"),
        ("5G", "not a subset"),
        ("", "not a subset"),
    ],
)
def test_read_data_subset_refuses_what_restic_would_refuse(value, why):
    with pytest.raises(InputError, match=re.escape(why)):
        backup.read_data_subset(value)


def _inventory(tmp_path: Path, text: str) -> Path:
    inv = tmp_path / "inv.py"
    inv.write_text(text)
    return inv


TWO_BACKING_UP = (
    "nodes = [('node1', {'ssh_hostname': '192.0.2.1', 'ssh_user': 'root'}), "
    "('node2', {'ssh_hostname': '192.0.2.2', 'ssh_user': 'root', 'backup_paths': ['/home']})]\n"
    "storage = ['node1']\n"
)


def _remote_run_stand_in(monkeypatch, answers: dict[str, tuple[int, str, str]]) -> dict[str, list[str]]:
    """A test stand-in for remote.run: answers per host, records each command sent."""
    from provision import remote

    sent: dict[str, list[str]] = {}

    def remote_run_stand_in(node, command, timeout=None, conn=None):
        sent.setdefault(node.name, []).append(command)
        return remote.CommandResult(node.name, *answers[node.name])

    monkeypatch.setattr(remote, "run", remote_run_stand_in)
    return sent


def test_cli_check_bad_subset_exits_2_with_one_line_and_contacts_no_host(cli, tmp_path, monkeypatch):
    sent = _remote_run_stand_in(monkeypatch, {})
    result = cli("backup", "check", str(_inventory(tmp_path, TWO_BACKING_UP)), "--read-data-subset", "5G")
    assert result.code == 2
    assert result.err.strip().splitlines() == [
        "error: --read-data-subset 5G: not a subset restic understands "
        "(give a percentage such as 10% or a part n/t such as 1/5)"
    ]
    assert sent == {}


def test_cli_check_reports_pass_and_fail_per_host_and_exits_1_when_one_fails(cli, tmp_path, monkeypatch):
    sent = _remote_run_stand_in(
        monkeypatch,
        {"node1": (0, "no errors were found\n", ""), "node2": (1, "", "Fatal: wrong password or no key found\n")},
    )
    result = cli("backup", "check", str(_inventory(tmp_path, TWO_BACKING_UP)), "--read-data-subset", "1/5", "--json")
    assert result.code == 1
    hosts = {h["host"]: (h["ok"], h["detail"]) for h in json.loads(result.out)["hosts"]}
    assert hosts == {
        "node1": (True, "no errors found, 1/5 of the data read back"),
        "node2": (False, "check failed: Fatal: wrong password or no key found"),
    }
    assert sent == {n: [f"{backup_layout.WRAPPER} check --read-data-subset 1/5"] for n in ("node1", "node2")}


def test_cli_check_exits_0_and_says_passed_for_every_host_when_all_pass(cli, tmp_path, monkeypatch):
    _remote_run_stand_in(monkeypatch, {n: (0, "no errors were found\n", "") for n in ("node1", "node2")})
    result = cli("backup", "check", str(_inventory(tmp_path, TWO_BACKING_UP)))
    assert result.code == 0, result.err
    rows = [line for line in result.out.splitlines() if "node" in line]
    assert len(rows) == 2
    assert all("passed" in row and "no errors found" in row for row in rows)


def test_a_repository_that_hosts_share_is_checked_once(cli, tmp_path, monkeypatch):
    # restic check locks the repository exclusively: a second check at once would fail.
    shared = TWO_BACKING_UP.replace("'ssh_user': 'root'", "'ssh_user': 'root', 'backup_repository': 's3:x/all'")
    sent = _remote_run_stand_in(monkeypatch, {"node1": (0, "no errors were found\n", "")})
    result = cli("backup", "check", str(_inventory(tmp_path, shared)), "--json")
    assert result.code == 0, result.err
    assert list(sent) == ["node1"]
    hosts = {h["host"]: (h["ok"], h["detail"]) for h in json.loads(result.out)["hosts"]}
    assert hosts == {"node1": (True, "no errors found"), "node2": (True, "same repository as node1: no errors found")}


# restic's words for a repository with no config yet: 0.14's SFTP backend, then 0.17's.
NOT_CREATED = (
    "Fatal: unable to open config file: Lstat: file does not exist\n"
    "Is there a repository at the following location?\nsftp:provision-backup-node2@10.77.0.11:/repo\n",
    "Fatal: repository does not exist: unable to open config file: stat /x/config: no such file or directory\n"
    "Is there a repository at the following location?\n/x\n",
)


@pytest.mark.parametrize("stderr", NOT_CREATED)
def test_listing_before_the_first_backup_run_is_no_snapshots_not_a_failure(cli, tmp_path, monkeypatch, stderr):
    _remote_run_stand_in(monkeypatch, {"node1": (0, "[]\n", ""), "node2": (1, "", stderr)})
    result = cli("backup", "list", str(_inventory(tmp_path, TWO_BACKING_UP)), "--json")
    assert result.code == 0, result.out
    hosts = {h["host"]: (h["ok"], h["detail"], h["data"]) for h in json.loads(result.out)["hosts"]}
    assert hosts["node2"] == (
        True,
        "no repository yet: the first backup run creates it",
        {"snapshots": [], "repository": "not created yet"},
    )


@pytest.mark.parametrize(
    "stderr",
    [
        "Fatal: unable to open config file: Lstat: permission denied\n"
        "Is there a repository at the following location?\nsftp:x@h:/repo\n",
        "Fatal: wrong password or no key found\n",
        "ssh: connect to host 10.77.0.11 port 22: No route to host\nFatal: unable to open repository\n",
    ],
)
def test_any_other_reason_a_repository_cannot_be_read_fails_the_listing(cli, tmp_path, monkeypatch, stderr):
    _remote_run_stand_in(monkeypatch, {"node1": (0, "[]\n", ""), "node2": (1, "", stderr)})
    result = cli("backup", "list", str(_inventory(tmp_path, TWO_BACKING_UP)), "--json")
    assert result.code == 1
    hosts = {h["host"]: h["ok"] for h in json.loads(result.out)["hosts"]}
    assert hosts == {"node1": True, "node2": False}


def test_restore_check_without_host_checks_every_host_that_backs_up(cli, tmp_path, monkeypatch):
    from provision.backup import runs

    checked = []

    def check_stand_in(node, snapshot, stamp):
        checked.append((node.name, snapshot))
        return runs.Outcome(node.name, True, "1 file(s) restored identical to live", 0.0, {})

    monkeypatch.setattr(runs, "check", check_stand_in)
    result = cli("backup", "restore", str(_inventory(tmp_path, TWO_BACKING_UP)), "--check", "--json")
    assert result.code == 0, result.err
    assert sorted(checked) == [("node1", "latest"), ("node2", "latest")]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ([], "error: restore: 2 hosts back up (name one with --host)"),
        (
            ["--check", "--snapshot", "1a2b3c4d"],
            "error: --snapshot: 2 hosts back up and a snapshot is one host's (name it with --host)",
        ),
    ],
)
def test_a_restore_that_could_mean_several_hosts_is_refused_before_any_host_is_touched(
    cli, tmp_path, monkeypatch, args, why
):
    sent = _remote_run_stand_in(monkeypatch, {})
    result = cli("backup", "restore", str(_inventory(tmp_path, TWO_BACKING_UP)), *args)
    assert result.code == 2
    assert result.err.strip().startswith(why), result.err
    assert sent == {}


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--snapshot", "-t"], "error: --snapshot: '-t' is not a snapshot id"),  # an option to root's restic
        (["--snapshot", "--no-lock"], "error: --snapshot: '--no-lock' is not a snapshot id"),
        (["--snapshot", ""], "error: --snapshot: '' is not a snapshot id"),
        (["--target", "relative/dir"], "error: --target: 'relative/dir' is not an absolute path"),
        (["--target", "/data/../etc"], "error: --target: '/data/../etc' is not a normalised absolute path"),
        (["--target", "/"], "error: --target: is / (restore over the live files with --in-place)"),
    ],
)
def test_a_restore_flag_that_root_would_misread_is_refused_before_any_host(cli, tmp_path, monkeypatch, args, why):
    sent = _remote_run_stand_in(monkeypatch, {})
    result = cli("backup", "restore", str(_inventory(tmp_path, TWO_BACKING_UP)), "--host", "node1", *args)
    assert result.code == 2
    assert result.err.strip().startswith(why), result.err
    assert sent == {}


# --- the password already on a host is never replaced by a different one ----------------

HOST_PASSWORD = "/etc/provision/backup/password"


def test_a_moved_inventory_is_refused_and_pointed_at_its_original_password(tmp_path):
    node = _node("node1", ("storage",))
    original = backup_layout.password_file(Cluster(tmp_path / "old" / "inv.py", (node,)), node)
    on_host = hashlib.sha1(original.read_bytes()).hexdigest()
    moved = Cluster(tmp_path / "new" / "inv.py", (node,))
    conflict = backup_layout.password_conflict(node, moved, on_host)
    assert conflict is not None
    assert conflict.startswith(f"node1:{HOST_PASSWORD} holds a different restic password")
    assert f'set backup_password_file = "{original}"' in conflict
    assert not backup_layout.generated_password_file(moved, node).exists()  # nothing new generated
    assert backup_layout.password_conflict(node, moved, None) is None  # a host with no password yet
    at_original = replace(node, settings=replace(node.settings, backup_password_file=str(original)))
    assert backup_layout.password_conflict(at_original, moved, on_host.upper()) is None


def test_a_configured_password_file_that_differs_from_the_hosts_is_named(tmp_path):
    mine = tmp_path / "pw"
    mine.write_text("not-the-hosts\n")
    node = _node("node1", ("storage",), backup_password_file=str(mine))
    conflict = backup_layout.password_conflict(node, _cluster(tmp_path, node), "0" * 40)
    assert conflict is not None
    assert f"than backup_password_file {mine};" in conflict
    assert "set backup_password_file to the original password file" in conflict


def _deploy_with_host_password(tmp_path, monkeypatch, sha1: str):
    server = fake_node(
        "node1",
        Settings(cluster_address="10.77.0.1", cluster_cidr="10.77.0.0/24"),
        {f"sha1sum {HOST_PASSWORD}": [f"{sha1}  {HOST_PASSWORD}"]},
        groups=("storage",),
    )
    monkeypatch.setattr(engine, "run_steps", _run_steps_with_path(engine.run_steps, tmp_path / "inv.py"))
    return server, run_fake(backups.step, [server], monkeypatch)


def test_deploy_refuses_to_replace_a_different_password_on_the_host(tmp_path, monkeypatch):
    server, run = _deploy_with_host_password(tmp_path, monkeypatch, "0" * 40)
    s = server.name
    assert not run.results[s].ok
    (failure,) = map(str, run.results[s].failures)
    assert "backups checks" in failure
    (refusal,) = run.ran(s, "exit 1$")  # the reason the summary shows, as the host prints it
    assert f"{s}:{HOST_PASSWORD} holds a different restic password" in refusal
    assert not run.ran(s, r"apt-get|useradd|mkdir|chmod")  # refused before any change


def _secret_events(tmp_path, monkeypatch, sudo: bool) -> list[tuple[str, str, str]]:
    """The backups step on a fake storage host: every command and upload in order, as
    (kind, text, temporary file of an upload)."""
    from pyinfra.connectors.fake import FakeConnector

    events: list[tuple[str, str, str]] = []
    run_command, put_file = FakeConnector.run_shell_command, FakeConnector.put_file

    def command(self, cmd, *args, **kwargs):
        events.append(("run", cmd if isinstance(cmd, str) else cmd.get_masked_value(), ""))
        return run_command(self, cmd, *args, **kwargs)

    def put(self, src, remote, remote_temp_filename=None, *args, **kwargs):
        events.append(("put", remote, remote_temp_filename or ""))
        return put_file(self, src, remote, remote_temp_filename, *args, **kwargs)

    monkeypatch.setattr(FakeConnector, "run_shell_command", command)
    monkeypatch.setattr(FakeConnector, "put_file", put)
    server = fake_node(
        "node1", Settings(cluster_address="10.77.0.1", cluster_cidr="10.77.0.0/24"), {}, groups=("storage",)
    )
    server = replace(server, data={**server.data, "_sudo": sudo})
    # The SFTP key pair as the controller keeps it (generating one would run ssh-keygen).
    key = backup_layout.key_path(Cluster(tmp_path / "inv.py", (server,)), server)
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("not a real key\n")
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIStandIn provision-backup@provision\n")
    monkeypatch.setattr(engine, "run_steps", _run_steps_with_path(engine.run_steps, tmp_path / "inv.py"))
    assert run_fake(backups.step, [server], monkeypatch).results[server.name].ok
    return events


@pytest.mark.parametrize("sudo", [True, False])
def test_secrets_exist_only_as_0600_files_and_pass_only_through_the_ssh_users_0700_directory(
    tmp_path, monkeypatch, sudo
):
    events = _secret_events(tmp_path, monkeypatch, sudo)
    texts = [text for _, text, _ in events]
    for secret in (HOST_PASSWORD, backup_layout.KEY_FILE):
        (upload,) = [i for i, (kind, text, _) in enumerate(events) if kind == "put" and text == secret]
        before = texts[:upload]
        # The file exists, empty, with mode 0600 before its content is sent: the upload
        # (SFTP, or cp from the temporary file) then keeps that mode.
        assert before.index(f"touch {secret}") < before.index(f"chmod 600 {secret}")
        # The temporary file (used with _sudo) is in the SSH user's private directory,
        # made with mode 0700 before; never /tmp/pyinfra-<sha1>.
        temp = events[upload][2]
        assert temp.startswith(f"{engine.context.UPLOAD_DIR}/pyinfra-")
        assert f"chmod 700 {engine.context.UPLOAD_DIR}" in before


def test_every_host_gets_its_own_password_key_and_account(tmp_path):
    storage, other = _node("node1", ("storage",)), _node("node2", backup_paths=["/home"])
    cluster = _cluster(tmp_path, storage, other)
    passwords = [backup_layout.password_file(cluster, n).read_text() for n in (storage, other)]
    assert passwords[0] != passwords[1]
    assert backup_layout.key_path(cluster, storage) != backup_layout.key_path(cluster, other)
    assert backup_layout.account_name("node1") == "provision-backup-node1"
    assert backup_layout.account_name("node1") != backup_layout.account_name("node2")


@pytest.mark.parametrize("host", ["GPU01", "gpu01.rack3.example", "n" * 40, "a-b"])
def test_an_account_name_is_a_portable_user_name_of_at_most_32_characters(host):
    name = backup_layout.account_name(host)
    assert re.fullmatch(r"[a-z][a-z0-9-]{0,31}", name), name
    assert name != backup_layout.account_name(host + "x")  # a digest, not a truncation


def test_sshd_confines_each_account_to_its_own_directory_with_sftp_only():
    storage = _node("node1", ("storage",), data_mount="/srv/data")
    text = backup_layout.sshd_drop_in(storage, ["node2", "node1"])
    blocks = text.split("Match User ")[1:]
    assert [b.splitlines()[0] for b in blocks] == ["provision-backup-node1", "provision-backup-node2"]
    for host, block in zip(("node1", "node2"), blocks, strict=True):
        settings = [line.strip() for line in block.splitlines()[1:]]
        assert f'ChrootDirectory "/srv/data/backups/restic/{host}"' in settings
        assert "ForceCommand internal-sftp" in settings
        assert {"AllowTcpForwarding no", "PermitTTY no", "X11Forwarding no", "AllowAgentForwarding no"} <= set(settings)


def test_a_host_holding_the_password_all_hosts_once_shared_keeps_it(tmp_path):
    node, fresh = _node("node1", ("storage",)), _node("node2", backup_paths=["/home"])
    cluster = _cluster(tmp_path, node, fresh)
    legacy = backup_layout.legacy_password_file(cluster)
    legacy.write_text("shared-before\n")
    shared = hashlib.sha1(legacy.read_bytes()).hexdigest()
    assert backup_layout.adopt_legacy_password(node, cluster, shared)
    assert backup_layout.password_file(cluster, node).read_text() == "shared-before\n"
    assert stat.S_IMODE(backup_layout.generated_password_file(cluster, node).stat().st_mode) == 0o600
    assert backup_layout.password_conflict(node, cluster, shared) is None
    # A host with no password yet, or another one, gets a password of its own.
    assert not backup_layout.adopt_legacy_password(fresh, cluster, None)
    assert not backup_layout.adopt_legacy_password(fresh, cluster, "0" * 40)
    assert backup_layout.password_file(cluster, fresh).read_text() != "shared-before\n"


def _storage_deploy(tmp_path, monkeypatch, unconfined: list[str]):
    """The backups step on a fake storage host with one more backing-up host."""
    settings = Settings(cluster_address="10.77.0.1", cluster_cidr="10.77.0.0/24")
    server = fake_node("node1", settings, {"backups/restic 2>/dev/null": unconfined}, groups=("storage",))
    client = fake_node(
        "node2", replace(settings, cluster_address="10.77.0.2", backup_paths=["/home"]), {}, address="node2"
    )
    cluster = Cluster(tmp_path / "inv.py", (server, client))
    for node in (server, client):  # the key pairs as the controller keeps them (no ssh-keygen here)
        key = backup_layout.key_path(cluster, node)
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text("not a real key\n")
        key.with_suffix(".pub").write_text(f"ssh-ed25519 AAAAStandIn{node.name[-1]} x@provision\n")
    monkeypatch.setattr(engine, "run_steps", _run_steps_with_path(engine.run_steps, tmp_path / "inv.py"))
    return server, client, run_fake(backups.step, [server, client], monkeypatch)


def test_the_storage_host_makes_a_confined_account_per_backing_up_host(tmp_path, monkeypatch):
    server, client, run = _storage_deploy(tmp_path, monkeypatch, [])
    assert run.results[server.name].ok
    assert run.results[client.name].ok
    s = server.name
    accounts = [backup_layout.account_name(n.name) for n in (server, client)]
    for account in accounts:
        (useradd,) = run.ran(s, f"useradd .*{account}$")
        assert "-s /usr/sbin/nologin" in useradd
        # Its home (holding the authorized_keys) stays root's: pyinfra's user operation would
        # give it to the account, and the next directory operation back to root, every run.
        assert not run.ran(s, f"chown .*{account}.* {backup_layout.ACCOUNTS_HOME}/"), account
    assert run.ran(s, r"/usr/sbin/sshd -t \|\|")  # checked before the reload
    assert run.ran(s, "try-reload-or-restart ssh.service")
    assert len(run.ran(s, "sshd -T -C user=")) == 2  # the chroot applies to each account
    # The shared account's key (on every host before) is looked for, to be removed.
    assert run.ran(s, f"{backup_layout.LEGACY_HOME}/.ssh/authorized_keys")
    assert not run.ran(s, r"mv .*\.moving")  # nothing to move
    assert not run.ran(client.name, "useradd|sshd")  # the accounts live on the storage host only


def test_a_repository_of_the_shared_account_layout_is_moved_into_its_hosts_chroot(tmp_path, monkeypatch):
    server, client, run = _storage_deploy(tmp_path, monkeypatch, ["@fake/node2"])
    (move,) = run.ran(server.name, r"mv .*\.moving")
    chroot = backup_layout.chroot_dir(server, client.name)
    assert f"mv {chroot} {chroot}.moving" in move
    assert f"chown -R {backup_layout.account_name(client.name)}" in move
    assert f"{chroot}/repo" in move
