"""`provision train` refuses bad input with one line per problem and exit 2, before any
host is contacted (the inventory's hosts here do not exist)."""

from __future__ import annotations

import pytest


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inv.py"
    path.write_text("nodes = [('a', {'ssh_hostname': '192.0.2.250'}), ('b', {'ssh_hostname': '192.0.2.251'})]\n")
    return path


def test_bad_nproc_and_model_are_refused_together(cli, inventory):
    result = cli("train", str(inventory), "--nproc-per-node", "0", "--model", "huge")
    assert result.code == 2
    lines = [line for line in result.err.splitlines() if line.startswith("error:")]
    assert len(lines) == 2
    assert "--nproc-per-node" in lines[0]
    assert "--model: unknown size 'huge'" in lines[1]


def test_unknown_limit_host_is_refused(cli, inventory):
    result = cli("train", str(inventory), "--limit", "a,zzz")
    assert result.code == 2
    assert "--limit zzz: matches no host or group of the inventory (hosts: a, b;" in result.err


def test_relative_python_is_refused(cli, inventory):
    result = cli("train", str(inventory), "--python", "venv/bin/python")
    assert result.code == 2
    assert "--python" in result.err


def test_missing_inventory_is_refused(cli, tmp_path):
    result = cli("train", str(tmp_path / "nope.py"))
    assert result.code == 2
    assert "inventory file does not exist" in result.err


def test_help_has_an_example(cli):
    result = cli("train", "--help")
    assert result.code == 0
    assert "Example: provision train" in result.out


def test_unwritable_runs_dir_is_refused_before_any_host_is_contacted(cli, inventory, tmp_path, monkeypatch):
    from provision import remote

    def no_ssh(*args, **kwargs):
        raise AssertionError("a host was contacted")

    monkeypatch.setattr(remote, "connection", no_ssh)
    (tmp_path / "a-file").write_text("")
    result = cli("train", str(inventory), "--runs-dir", str(tmp_path / "a-file" / "runs"))
    assert result.code == 2
    lines = [line for line in result.err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    assert "--runs-dir" in lines[0]
    assert "cannot write there" in lines[0]
