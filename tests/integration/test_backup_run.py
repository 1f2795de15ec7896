"""The backups deploy with its controller secrets made for real (ssh-keygen for the SFTP key)."""

from __future__ import annotations

import hashlib
import subprocess

import pytest

from provision import engine
from provision.deploys import backups
from provision.facts.probes import UnconfinedRepositories, parse_unconfined
from provision.inventory import Cluster
from provision.rules import backups as backup_layout
from provision.settings import Settings
from tests.helpers.pyinfra_fake import fake_node, run_fake
from tests.unit.test_backup import (
    _deploy_with_host_password,
    _node,
    _run_steps_with_path,
)

# The controller's state directory is the test's own (tests/integration/conftest.py).
pytestmark = pytest.mark.usefixtures("state_dir")


def test_deploy_sets_up_account_secrets_and_timer_without_the_password_in_any_command(tmp_path, monkeypatch):
    server = fake_node(
        "node1", Settings(cluster_address="10.77.0.1", cluster_cidr="10.77.0.0/24"), {}, groups=("storage",)
    )
    client = fake_node("node2", Settings(cluster_address="10.77.0.2"), {})
    cluster = Cluster(tmp_path / "inv.py", (server, client))
    password = backup_layout.password_file(cluster, server).read_text().strip()
    monkeypatch.setattr(engine, "run_steps", _run_steps_with_path(engine.run_steps, tmp_path / "inv.py"))
    run = run_fake(backups.step, [server, client], monkeypatch)
    s, c = server.name, client.name
    assert run.results[s].ok, run.results[s].failures
    assert run.ran(s, r"useradd .*provision-backup-")
    assert run.ran(s, r"mkdir -p /data/backups/restic")
    assert run.ran(s, r"chmod 600 /etc/provision/backup/password")
    assert run.ran(s, r"systemctl start provision-backup\.timer")
    assert run.ran(s, r"systemctl enable provision-backup\.timer")
    assert not run.ran(c, r"restic|provision-backup")  # node2 has no backup_paths
    assert any("checkpoints share is backed up on the storage host" in n for n in run.results[c].notes)
    everything = [cmd for cmds in run.commands.values() for cmd in cmds]
    assert everything
    assert all(password not in cmd for cmd in everything)


def test_deploy_goes_on_when_the_host_holds_the_same_password(tmp_path, monkeypatch):
    cluster = Cluster(tmp_path / "inv.py", ())
    # Passwords are per host: the fake host's name is @fake/node1.
    password = backup_layout.password_file(cluster, _node("@fake/node1", ("storage",)))
    server, run = _deploy_with_host_password(tmp_path, monkeypatch, hashlib.sha1(password.read_bytes()).hexdigest())
    assert run.results[server.name].ok, run.results[server.name].failures
    assert run.ran(server.name, r"systemctl enable provision-backup\.timer")


def _repository_files(root) -> None:
    for name in ("config", "data/00/aa", "keys/k1", "snapshots/s1"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)


def _sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=False)


def test_a_repository_of_the_shared_layout_moves_into_its_chroot_and_a_cut_move_finishes(tmp_path):
    root = tmp_path / "restic"
    _repository_files(root / "node2")  # the layout before per-host accounts
    (root / "node3").mkdir()  # already confined: not listed
    fact = UnconfinedRepositories()
    assert parse_unconfined(_sh(fact.command(root=str(root))).stdout.splitlines()) == ["node2"]

    move = backups.move_command(str(root / "node2"), "root")
    first = _sh(move)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (root / "node2").iterdir()) == ["repo"]
    assert (root / "node2" / "repo" / "keys" / "k1").read_text() == "keys/k1"
    assert _sh(fact.command(root=str(root))).stdout == ""  # nothing left to move
    assert _sh(move).returncode == 0  # a second run changes nothing
    assert sorted(p.name for p in (root / "node2").iterdir()) == ["repo"]

    # Killed between the two renames: only node4.moving is left, and the fact names it.
    _repository_files(root / "node4.moving")
    assert parse_unconfined(_sh(fact.command(root=str(root))).stdout.splitlines()) == ["node4"]
    done = _sh(backups.move_command(str(root / "node4"), "root"))
    assert done.returncode == 0, done.stderr
    assert (root / "node4" / "repo" / "config").read_text() == "config"
    assert not (root / "node4.moving").exists()


def test_a_move_that_would_mix_two_repositories_stops_and_changes_nothing(tmp_path):
    root = tmp_path / "restic"
    _repository_files(root / "node2")
    _repository_files(root / "node2.moving")
    run = _sh(backups.move_command(str(root / "node2"), "root"))
    assert run.returncode == 1
    assert "both hold one" in run.stderr
    assert (root / "node2" / "config").exists()
    assert (root / "node2.moving" / "config").exists()
