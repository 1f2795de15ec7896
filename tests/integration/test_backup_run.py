"""The backups deploy with its controller secrets made for real (ssh-keygen for the SFTP key)."""

from __future__ import annotations

import hashlib

import pytest

from provision import engine
from provision.deploys import backups
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
    assert run.ran(s, r"useradd .*provision-backup")
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
    password = backup_layout.password_file(cluster, _node("node1", ("storage",)))
    server, run = _deploy_with_host_password(tmp_path, monkeypatch, hashlib.sha1(password.read_bytes()).hexdigest())
    assert run.results[server.name].ok, run.results[server.name].failures
    assert run.ran(server.name, r"systemctl enable provision-backup\.timer")
