"""Step selection, bad input for up/plan, and the verify suite's ssh_config."""

from __future__ import annotations

import pytest

from provision import pipeline
from provision.errors import InputError
from provision.remote import ssh_config
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
        "error: --skip nvidai: unknown step (steps are: " + ", ".join(pipeline.step_names()) + ")"]


def test_empty_wheelhouse_is_bad_input_before_any_host(cli, tmp_path) -> None:
    inventory = tmp_path / "inv.py"
    inventory.write_text(f"nodes = [('n1', {{'ssh_hostname': '127.0.0.1', 'ssh_port': 1, "
                         f"'wheelhouse': '{tmp_path}'}})]\n")
    result = cli("up", str(inventory), "--only", "frameworks")
    assert result.code == 2
    assert "holds no .whl files" in result.err


def test_ssh_config_pins_host_keys_and_key_file() -> None:
    text = ssh_config([node("node1")])
    assert "Host node1\n  HostName 10.0.0.1\n  Port 22\n" in text
    assert "StrictHostKeyChecking yes" in text and "User root" in text
