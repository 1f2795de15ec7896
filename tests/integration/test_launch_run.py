"""The training reaper and run-as probe run for real: process groups, sessions, markers."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from provision.launch import plan, reaper
from tests.unit.test_launch import spawn_fake_run


def test_the_run_as_probe_names_the_user_only_for_root_and_an_existing_account(tmp_path):

    me = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    out = subprocess.run(["sh", "-c", plan.run_as_probe(me)], capture_output=True, text=True).stdout
    assert out.strip() == (f"RUN_AS={me}" if os.geteuid() == 0 else "")
    missing = subprocess.run(
        ["sh", "-c", plan.run_as_probe("no-such-user-provision")], capture_output=True, text=True
    ).stdout
    assert missing == ""


def test_reaper_stops_the_group_and_workers_in_their_own_sessions(tmp_path, capsys):
    proc, run_dir = spawn_fake_run(tmp_path, "run-x", "n0")
    root = int((run_dir / "torchrun.pid").read_text())
    found = reaper.targets(root, "run-x", "n0")
    assert root in found
    assert len(found) >= 3
    assert reaper.main([str(run_dir), "run-x", "n0", "--grace", "2"]) == 0
    proc.wait(timeout=10)
    result = json.loads(capsys.readouterr().out)
    assert result["left"] == []
    assert set(result["signalled"]) >= found
    assert not reaper.alive(found)


def test_reaper_finds_strays_by_run_marker_when_the_run_file_is_gone(tmp_path, capsys):
    proc, run_dir = spawn_fake_run(tmp_path, "run-y", "n1")
    (run_dir / "torchrun.pid").unlink()
    os.kill(int(proc.pid), signal.SIGKILL)  # torchrun gone: its children are orphans now
    proc.wait(timeout=10)
    assert reaper.targets(None, "run-y", "n1"), "orphans carry the run marker"
    assert reaper.targets(None, "run-y", "other-node") == set()
    assert reaper.main([str(run_dir), "run-y", "n1", "--grace", "2"]) == 0
    assert reaper.targets(None, "run-y", "n1") == set()
