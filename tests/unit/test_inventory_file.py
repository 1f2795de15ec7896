"""Running an inventory file: once per load, within a deadline, its prints kept off stdout,
sys.exit() an error, and a group pyinfra would skip (a string, a dict) named."""

from __future__ import annotations

import pytest

from provision import inventory
from provision.inventory_file import TIMEOUT_ENV
from tests.unit.test_inventory import problems_of, write  # the same helpers as the loader's tests


def test_the_inventory_file_runs_once_per_load(tmp_path):
    counter = tmp_path / "runs"
    inv = write(
        tmp_path / "inv.py",
        f"""
        with open({str(counter)!r}, "a") as _f:
            _f.write("x")
        nodes = [("n1", {{"ssh_hostname": "10.0.0.1"}})]
        """,
    )
    inventory.load(inv)
    assert counter.read_text() == "x"


def test_an_inventory_that_never_finishes_is_stopped_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    inv = write(tmp_path / "inv.py", "while True:\n    pass\n")
    (line,) = problems_of(inv)
    assert line.startswith(f"{inv}: loading the inventory took longer than 0.3 s")
    assert TIMEOUT_ENV in line


def test_a_deadline_survives_the_inventory_catching_exception(tmp_path, monkeypatch):
    monkeypatch.setenv(TIMEOUT_ENV, "0.3")
    inv = write(tmp_path / "inv.py", "while True:\n    try:\n        pass\n    except Exception:\n        pass\n")
    (line,) = problems_of(inv)
    assert "took longer than" in line


def test_sys_exit_in_the_inventory_is_an_error_not_a_silent_success(tmp_path):
    inv = write(tmp_path / "inv.py", "import sys\nnodes = ['n1']\nsys.exit(0)\n")
    assert problems_of(inv) == [f"{inv}: the inventory called sys.exit(0) (an inventory must not exit)"]


def test_what_the_inventory_prints_goes_to_stderr_not_stdout(tmp_path, capfd):
    inv = write(
        tmp_path / "inv.py",
        """
        import sys
        print("hello from python")
        sys.__stdout__.write("hello through sys.__stdout__\\n")
        nodes = [("n1", {"ssh_hostname": "10.0.0.1"})]
        """,
    )
    inventory.load(inv)
    captured = capfd.readouterr()
    assert captured.out == ""
    assert "hello from python" in captured.err
    assert "hello through sys.__stdout__" in captured.err


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ('storage = "n1"', "group storage: is a str, not a list of hosts"),
        ('storage = {"n1": {}}', "group storage: is a dict, not a list of hosts"),
        ('storage = {"n1"}', "group storage: is a set, not a list of hosts"),
        ('storage = ("n1", "n2")', "group storage: is a tuple but not (list of hosts, dict of group data)"),
        ("storage = [1]", "group storage: entry 1: a host is a name or a (name, dict of host data) tuple"),
        ('storage = [("n1", "x")]', "group storage: entry ('n1', 'x'): a host is a name or a (name, dict"),
    ],
)
def test_a_group_pyinfra_would_skip_is_named(tmp_path, group, expected):
    inv = write(tmp_path / "inv.py", f"nodes = [('n1', {{'ssh_hostname': '10.0.0.1'}})]\n{group}\n")
    (line,) = problems_of(inv)
    assert line.startswith(f"{inv}: {expected}")


def test_helpers_named_with_an_underscore_and_imports_are_not_groups(tmp_path):
    inv = write(
        tmp_path / "inv.py",
        """
        import os
        from pathlib import Path
        _domain = "example.com"
        _extra = {"a": 1}
        def _host(n):
            return (n, {"ssh_hostname": "10.0.0.1"})
        nodes = [_host("n1")]
        """,
    )
    assert [n.name for n in inventory.load(inv).nodes] == ["n1"]
