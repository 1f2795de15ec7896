"""`provision testbed` as a user meets it, without starting any VM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROVISION = [sys.executable, "-m", "provision", "testbed"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PROVISION, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", ["up", "status", "ssh", "down"])
def test_every_command_has_help_with_an_example(command: str) -> None:
    done = _run(command, "--help")
    assert done.returncode == 0
    assert "Example: provision testbed " + command in done.stdout


def test_bad_counts_are_bad_input_and_nothing_is_created(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = _run("up", "--nodes", "0", "--disks", "9", "--state-dir", str(state))
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: --nodes: 0 is outside 1..200", "error: --disks: 9 is outside 0..8"]
    assert not state.exists()


def test_status_without_a_testbed_says_so(tmp_path: Path) -> None:
    done = _run("status", "--state-dir", str(tmp_path / "none"))
    assert done.returncode == 0
    assert "no testbed" in done.stdout
    as_json = _run("status", "--json", "--state-dir", str(tmp_path / "none"))
    assert json.loads(as_json.stdout)["nodes"] == []


def test_ssh_without_a_testbed_is_one_error_line(tmp_path: Path) -> None:
    done = _run("ssh", "node1", "--state-dir", str(tmp_path / "none"))
    assert done.returncode == 1
    assert done.stderr.strip().startswith("error: no testbed in ")


def test_down_without_a_testbed_stops_nothing(tmp_path: Path) -> None:
    done = _run("down", "--state-dir", str(tmp_path / "none"))
    assert done.returncode == 0
    assert "stopped 0 processes" in done.stdout
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("command", ["down", "up", "status"])
def test_a_state_dir_that_is_not_a_testbeds_is_refused_and_left_whole(tmp_path: Path, command: str) -> None:
    # `down` deletes known_hosts, keys/ and nodes/ in its state directory, and `up` writes
    # them: --state-dir ~/.ssh would have cost someone their known_hosts and keys.
    home_ssh = tmp_path / "ssh"
    (home_ssh / "keys").mkdir(parents=True)
    for name in ("known_hosts", "id_ed25519", "keys/id_rsa"):
        (home_ssh / name).write_text("ORIGINAL\n")
    done = _run(command, "--state-dir", str(home_ssh))
    assert done.returncode == 2, done.stderr
    assert "holds files a testbed never makes (id_ed25519)" in done.stderr
    assert sorted(str(p.relative_to(home_ssh)) for p in home_ssh.rglob("*")) == [
        "id_ed25519", "keys", "keys/id_rsa", "known_hosts",
    ]  # fmt: skip
    assert (home_ssh / "known_hosts").read_text() == "ORIGINAL\n"


def test_a_bad_accelerator_or_mirror_is_said_with_the_counts_before_anything_is_built(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = _run(
        "up", "--nodes", "0", "--accel", "bogus", "--mirror", "http://x/debian\nTrusted: yes", "--state-dir", str(state)
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0] == "error: --nodes: 0 is outside 1..200"
    assert lines[1] == "error: --accel: 'bogus' is not one of auto, kvm, tcg"
    assert lines[2].startswith("error: --mirror: ")
    assert "is not an http(s):// or file:/// URL" in lines[2]
    assert not state.exists()


def test_a_state_file_that_is_not_a_testbeds_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_text("{not json")
    done = _run("status", "--state-dir", str(state))
    assert done.returncode == 1, done.stderr
    assert "is not a testbed's state" in done.stderr
    assert "internal error" not in done.stderr
