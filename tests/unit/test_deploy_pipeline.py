"""Step selection, bad input for up/plan, and the verify suite's ssh_config."""

from __future__ import annotations

import pytest

from provision.errors import InputError
from provision.remote import ssh_config
from provision.up import pipeline
from tests.helpers.deploy_facts import node


def names(steps: list) -> list[str]:
    return [s.name for s in steps]


def test_all_steps_in_order_by_default() -> None:
    assert names(pipeline.select())[:4] == ["preflight", "base", "nvidia", "frameworks"]


def test_only_keeps_preflight_and_skip_removes_it_by_name() -> None:
    assert names(pipeline.select(only="nvidia")) == ["preflight", "nvidia"]
    assert names(pipeline.select(only="base", skip="preflight")) == ["base"]
    assert "nvidia" not in names(pipeline.select(skip="nvidia"))


def test_unknown_step_is_bad_input_naming_the_known_ones() -> None:
    with pytest.raises(InputError) as e:
        pipeline.select(only="bsae")
    assert str(e.value.problems[0]).startswith("--only bsae: unknown step (steps are: preflight, base, nvidia")


def test_cli_unknown_step_exits_2_with_one_line(cli, tmp_path) -> None:
    inventory = tmp_path / "inv.py"
    inventory.write_text("nodes = [('n1', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1})]\n")
    result = cli("up", str(inventory), "--skip", "nvidai")
    assert result.code == 2
    assert result.err.strip().splitlines() == [
        "error: --skip nvidai: unknown step (steps are: " + ", ".join(pipeline.step_names()) + ")"
    ]


def test_empty_wheelhouse_is_bad_input_before_any_host(cli, tmp_path) -> None:
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        f"nodes = [('n1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': 1, 'wheelhouse': '{tmp_path}'}})]\n"
    )
    result = cli("up", str(inventory), "--only", "frameworks")
    assert result.code == 2
    assert "holds no .whl files" in result.err


def test_ssh_config_pins_host_keys_and_key_file() -> None:
    text = ssh_config([node("node1")])
    assert "Host node1\n  HostName 10.0.0.1\n  Port 22\n" in text
    assert "StrictHostKeyChecking yes" in text
    assert "User root" in text


def test_missing_backup_password_file_is_bad_input_before_any_host(cli, tmp_path, monkeypatch) -> None:
    contacted = []
    monkeypatch.setattr(
        pipeline.engine, "run_steps", lambda *args, **kwargs: contacted.append("run_steps_stand_in")
    )  # test stand-in
    inventory = tmp_path / "inv.py"
    inventory.write_text(
        f"nodes = [('n1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': 1, "
        f"'backup_password_file': '{tmp_path}/nope'}})]\nstorage = ['n1']\n"
    )
    result = cli("up", str(inventory), "--only", "backups")
    assert result.code == 2
    assert [line for line in result.err.splitlines() if line.startswith("error:")] == [
        f"error: {inventory}: host n1: key backup_password_file: {tmp_path}/nope does not exist "
        "(create it, or unset the key to generate one)"
    ]
    assert contacted == []


def test_backup_inputs_are_checked_on_hosts_that_back_up_when_the_step_runs(tmp_path) -> None:
    from provision import inventory as inventory_lib

    empty = tmp_path / "empty"
    empty.write_text("\n")
    inventory = tmp_path / "inv.py"
    inventory.write_text(  # n1 backs up with no repository; n2 has no backup, so its file is unused
        f"nodes = [('n1', {{'ssh_hostname': '192.0.2.1', 'backup_paths': ['/home'], "
        f"'backup_password_file': '{empty}'}}), ('n2', {{'ssh_hostname': '192.0.2.2', "
        f"'backup_password_file': '{tmp_path}/nope'}})]\n"
    )
    cluster = inventory_lib.load(inventory)
    with pytest.raises(InputError) as e:
        pipeline.check_inputs(cluster, pipeline.select(only="backups"))
    assert [str(p) for p in e.value.problems] == [
        f"{inventory}: host n1: key backup_password_file: {empty} is empty (restic refuses an empty password)",
        f"{inventory}: host n1: key backup_repository: no repository: not set, "
        "and no storage host to hold the default one (put a host in the 'storage' group, or set backup_repository)",
    ]
    pipeline.check_inputs(cluster, pipeline.select(skip="backups"))  # not this run's concern
