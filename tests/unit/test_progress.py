"""Progress off a terminal (one line per host and step event) and what Ctrl-C says."""

from __future__ import annotations

import contextlib
import re

import pytest

from provision.cli.console import host_progress
from tests.helpers.example_inventory import locked_example


def untimed(err: str) -> list[str]:
    """The log lines without their HH:MM:SS stamp."""
    return [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in err.splitlines()]


def test_off_a_terminal_each_step_event_is_one_line_and_each_operation_is_not(capsys):
    with host_progress(["node1", "node2"], mode="lines") as progress:
        progress("node1", "base: started")
        progress("node1", "base: Install base packages")  # an operation: the live display only
        progress("node2", "base: timed out after 60 s")
        progress("node1", "base: done, 3 changed")
        progress("node2", "volumes: FAILED")
    assert untimed(capsys.readouterr().err) == [
        "node1: base: started",
        "node2: base: timed out after 60 s",
        "node1: base: done, 3 changed",
        "node2: volumes: FAILED",
    ]


def test_auto_mode_prints_lines_when_stderr_is_not_a_terminal(capsys):
    # pytest captures stderr: not a terminal, as under CI or nohup.
    with host_progress(["node1"]) as progress:
        progress("node1", "base: started")
    assert capsys.readouterr().err.strip().endswith("node1: base: started")


def test_testbed_progress_off_a_terminal_is_a_timestamped_line_per_report(capsys):
    # The demo's testbed stage builds an image for minutes: off a terminal (the demo's pipe,
    # CI) each report is a line, control characters shown as text.
    from provision.cli.testbed import _progress

    with _progress() as report:
        report("image", "debootstrap bookworm")
        report("node1", "booting (tcg)\x1b]0;x\x07")
    assert untimed(capsys.readouterr().err) == [
        "image: debootstrap bookworm",
        "node1: booting (tcg)\\x1b]0;x\\x07",
    ]


def _interrupted_run() -> None:
    with host_progress(["node1", "node2", "node3"], mode="lines") as progress:
        progress("node1", "base: started")
        progress("node1", "base: Install base packages")
        progress("node2", "base: started")
        progress("node2", "base: done, 0 changed")
        raise KeyboardInterrupt


def test_ctrl_c_names_the_hosts_that_were_mid_step(capsys):
    with pytest.raises(KeyboardInterrupt):
        _interrupted_run()
    err = capsys.readouterr().err
    assert "interrupted; hosts mid-step: node1 (base: Install base packages)\n" in err


def test_ctrl_c_exits_130_without_a_traceback(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path))  # the run's lock goes there
    from provision.cli import up as up_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(up_cli.pipeline, "up", interrupted)

    @contextlib.contextmanager
    def no_host_locks(cluster):  # taking them connects to the hosts
        yield up_cli.host_lock.HostLocks("token", "test")

    monkeypatch.setattr(up_cli.host_lock, "held", no_host_locks)

    result = cli("up", str(locked_example(tmp_path / "inventories")))
    assert result.code == 130
    assert "interrupted; hosts mid-step: none" in result.err
    assert "Traceback" not in result.err
