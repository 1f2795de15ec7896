"""Drill: one VM frozen dead (qemu's `stop` through its QMP socket) while facts, status, up
and validate run. A frozen server is the hard case for deadlines: its port still accepts the
TCP connection (qemu's forward answers), and then nothing comes back, not even the SSH
banner. Each command must end within its deadline plus a margin, name the frozen host,
report the other host in full and exit 1; once thawed, `up` converges again.

One test, one freeze, four commands: the commands run on a copy of the testbed inventory
with short deadlines, so the whole drill costs a few minutes of the suite.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision.validate import agent
from tests.e2e.storage_helpers import derived_inventory

pytestmark = pytest.mark.destructive

FROZEN, LIVE = "node2", "node1"
CONNECT_S, COMMAND_S, STEP_S = 10, 60, 90  # the drill inventory's deadlines
# What a command may take beyond its own deadline: the SSH handshake's 30 s floor
# (remote.connection), the live host's own work under emulation, process start-up.
MARGIN_S = 120


def _run(*args: str, timeout_s: float) -> tuple[int, str, str, float]:
    """A provision command as a user runs it: (exit code, stdout, stderr, seconds)."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True, text=True, timeout=timeout_s)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - start


def _hosts(stdout: str, key: str = "hosts") -> dict[str, dict]:
    return {h.get("name") or h.get("node"): h for h in json.loads(stdout)[key]}


def test_a_frozen_host_costs_only_itself_and_converges_once_thawed(provisioned, testbed, tmp_path: Path) -> None:
    deadlines = {"connect_timeout_s": CONNECT_S, "command_timeout_s": COMMAND_S, "step_timeout_s": STEP_S}
    inv = str(
        derived_inventory(
            Path(testbed.inventory_path), tmp_path / "drill.py", [LIVE, FROZEN], {LIVE: deadlines, FROZEN: deadlines}
        )
    )
    seen: dict[str, float] = {}
    testbed.testbed.freeze_node(FROZEN)
    try:
        code, out, err, seen["facts"] = _run("facts", inv, "--json", timeout_s=900)
        assert code == 1, err
        hosts = _hosts(out)
        assert hosts[LIVE]["reachable"], hosts[LIVE]
        assert hosts[LIVE]["os"], hosts[LIVE]
        assert not hosts[FROZEN]["reachable"], hosts[FROZEN]
        assert hosts[FROZEN]["error"], hosts[FROZEN]

        code, out, err, seen["status"] = _run("status", inv, "--json", timeout_s=900)
        assert code == 1, err
        hosts = _hosts(out)
        assert hosts[LIVE]["reachable"], hosts[LIVE]
        assert hosts[LIVE]["error"] is None, hosts[LIVE]
        assert not hosts[FROZEN]["reachable"], hosts[FROZEN]

        code, out, err, seen["up"] = _run("up", inv, "--only", "preflight", "--json", timeout_s=900)
        assert code == 1, err
        hosts = _hosts(out)
        assert hosts[LIVE]["ok"], hosts[LIVE]
        assert hosts[LIVE]["steps"] == ["preflight"], hosts[LIVE]
        assert not hosts[FROZEN]["ok"], hosts[FROZEN]
        assert hosts[FROZEN]["failures"], hosts[FROZEN]
        assert FROZEN in err  # the progress lines name it

        report = tmp_path / "validate.json"
        code, _, err, seen["validate"] = _run(
            "validate", inv, "--quick", "--only", "cpu", "--json", str(report), timeout_s=1800
        )
        assert code == 1, err
        nodes = {n["node"]: n for n in json.loads(report.read_text())["nodes"]}
        assert nodes[LIVE]["errors"] == [], nodes[LIVE]
        assert nodes[FROZEN]["errors"], nodes[FROZEN]  # said why, not left out
        assert nodes[FROZEN]["verdict"] == "fail", nodes[FROZEN]
    finally:
        testbed.testbed.thaw_node(FROZEN)
    print(f"freeze drill seconds: {json.dumps({k: round(v) for k, v in seen.items()})}")

    # The deadlines held: a frozen host costs its own deadline, not forever.
    assert seen["facts"] < CONNECT_S + MARGIN_S + COMMAND_S, seen
    assert seen["status"] < CONNECT_S + MARGIN_S + COMMAND_S, seen
    assert seen["up"] < STEP_S + MARGIN_S, seen
    assert seen["validate"] < agent.outer_deadline_s("quick") + MARGIN_S, seen

    code, out, err, _ = _run("up", inv, "--only", "preflight", "--json", timeout_s=900)
    assert code == 0, out + err
    assert all(h["ok"] for h in _hosts(out).values())
