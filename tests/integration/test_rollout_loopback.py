"""`provision up --canary/--wave-size/--max-fail` and `--limit` as a user runs them, against a
real sshd on loopback: a canary that fails stops the rollout and the hosts never reached are
reported "not run" with the reason; a canary that passes lets the next wave run; --limit
contacts only the hosts it names, and a pattern that matches nothing is bad input.

Both hosts are the same sshd ("canary" as 127.0.0.1, "rest" as localhost). The canary is
made to fail preflight by asking for more free space on / than any disk has.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import loopback_sshd
from tests.integration.test_facts_loopback import write_inventory


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = loopback_sshd.start(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def _inventory(sshd, tmp_path, canary_free_gb: int):
    known = tmp_path / "known_hosts"
    lines = sshd.known_hosts.read_text()
    known.write_text(lines + lines.replace("127.0.0.1", "localhost"))
    canary = {**sshd.host_data(), "min_root_free_gb": canary_free_gb, "cluster_address": "127.0.0.3"}
    rest = {
        **sshd.host_data(),
        "ssh_hostname": "localhost",
        "ssh_known_hosts_file": str(known),
        "cluster_address": "127.0.0.2",
        "min_root_free_gb": 1,
    }
    return write_inventory(tmp_path / "inv.py", [("canary", canary), ("rest", rest)])


def _up(tmp_path, inv, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "provision", "up", str(inv), "--only", "preflight", "--progress", "lines", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PROVISION_STATE_DIR": str(tmp_path / "state")},
    )


def test_a_canary_that_fails_stops_the_rollout_and_the_rest_is_reported_not_run(sshd, tmp_path):
    inv = _inventory(sshd, tmp_path, canary_free_gb=1_000_000)
    done = _up(tmp_path, inv, "--canary", "1", "--json")
    assert done.returncode == 1, done.stderr
    hosts = {h["name"]: h for h in json.loads(done.stdout)["hosts"]}
    assert hosts["canary"]["ok"] is False
    assert any("preflight" in str(f) for f in hosts["canary"]["failures"]), hosts["canary"]
    assert hosts["rest"]["ok"] is False
    assert hosts["rest"]["steps"] == []  # never contacted
    assert [str(f) for f in hosts["rest"]["failures"]] == ["rollout: not run: the canary failed on canary"], hosts
    # Off a terminal, each host's place in the rollout is a line of its own; the summary
    # table names the host that was not run and why.
    done = _up(tmp_path, inv, "--canary", "1")
    assert done.returncode == 1
    assert "failed: canary, rest" in done.stdout
    assert {"rollout:", "not", "run:"} <= set(done.stdout.split())  # the table's cell, wrapped at 80 columns
    assert re.search(r"\d\d:\d\d:\d\d canary: rollout: canary \(1 hosts\)", done.stderr), done.stderr
    assert re.search(r"\d\d:\d\d:\d\d rest: rollout: not run, the canary failed on canary", done.stderr), done.stderr
    assert "rest: preflight: started" not in done.stderr


def test_a_canary_that_passes_lets_the_next_wave_run(sshd, tmp_path):
    inv = _inventory(sshd, tmp_path, canary_free_gb=1)
    done = _up(tmp_path, inv, "--canary", "1", "--wave-size", "1")
    assert done.returncode == 0, done.stdout + done.stderr  # preflight passes here (1 GB free on /)
    lines = [line.split(" ", 1)[1] for line in done.stderr.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    # The canary finishes before the next wave starts.
    assert lines.index("canary: preflight: done, 0 changed") < lines.index("rest: rollout: wave 1 of 1 (1 hosts)")
    assert lines.index("rest: rollout: wave 1 of 1 (1 hosts)") < lines.index("rest: preflight: started")


def test_limit_contacts_only_the_hosts_it_names(sshd, tmp_path):
    inv = _inventory(sshd, tmp_path, canary_free_gb=1_000_000)
    done = _up(tmp_path, inv, "--limit", "re*", "--json")
    (host,) = json.loads(done.stdout)["hosts"]
    assert host["name"] == "rest"
    assert "canary:" not in done.stderr  # the failing host was never contacted


def test_a_limit_that_matches_nothing_is_bad_input_before_any_host(sshd, tmp_path):
    inv = _inventory(sshd, tmp_path, canary_free_gb=1)
    done = _up(tmp_path, inv, "--limit", "rest,gpu*")
    assert done.returncode == 2
    assert "error: --limit gpu*: matches no host or group of the inventory" in done.stderr
    assert "preflight: started" not in done.stderr
    assert "Traceback" not in done.stderr
