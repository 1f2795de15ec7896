"""Failure drill: one VM frozen (qemu's `stop` through its QMP socket: the guest stops dead,
its TCP connections stay open and nothing answers on them), as a hung host is.

- `facts` and `up` freeze it mid-run, once it has logged in and is answering;
- `status` and `validate` start while it is frozen (side by side, to spend the TCG
  minutes once);

each ends within its deadline plus a margin, names the frozen host with what it was doing,
reports the other host in full, and exits 1. Thawed, the same `facts` and `up` pass: no
run left the host half-changed. The drill's inventory is the testbed's with short
deadlines (connect 10 s, each command 30 s), so the hung host costs seconds, not minutes;
status and validate, whose host that answers needs minutes under TCG, get longer command
deadlines (the frozen host costs them its connection attempts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from unittest import mock

import pytest
from pyinfra.api.host import Host

from provision import inventory
from provision.engine import gather_facts
from provision.facts.host import HOST_FACTS
from provision.testbed import node as tb_node
from provision.testbed import qemu
from provision.up import pipeline
from tests.e2e.storage_helpers import derived_inventory

pytestmark = pytest.mark.destructive

FROZEN = "node2"
DEADLINES = {"connect_timeout_s": 10, "command_timeout_s": 30, "step_timeout_s": 120}
# status and validate start with the host already frozen, so its connection attempt is what
# it costs them (10 s, tried three times: no banner is a transient error). Validate's agent
# on the host that answers imports torch, which alone takes a minute or more on a TCG VM,
# and status runs beside it: a 30 s command deadline would cut that host off too.
STARTED_FROZEN = {**DEADLINES, "command_timeout_s": 400, "step_timeout_s": 600}
MARGIN_S = 60  # disconnects (at most 30 s), reports and TCG's slowness on the host that answers


class Freezer:
    """Freezes the VM (once) when `when(host, text)` first holds; thaws it on demand."""

    def __init__(self, testbed) -> None:
        self.sock = tb_node.files(testbed.testbed.state_dir, FROZEN).dir / "qmp.sock"
        self.frozen = threading.Event()

    def freeze(self) -> None:
        qemu.qmp(self.sock, "stop")
        self.frozen.set()

    def thaw(self) -> None:
        qemu.qmp(self.sock, "cont")
        self.frozen.clear()

    def before(self, host_name: str, call):
        """``call`` (a Host method), which first freezes the VM when ``host_name`` makes it."""

        def freezing(host, *args, **kwargs):
            if host.name == host_name and not self.frozen.is_set():
                self.freeze()
            return call(host, *args, **kwargs)

        return freezing

    def on(self, when):
        def on_event(host: str, text: str) -> None:
            if not self.frozen.is_set() and when(host, text):
                self.freeze()

        return on_event


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "provision", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


@pytest.mark.takes_s(330)  # session 46's clean clone: 272 s
def test_a_frozen_host_costs_each_command_its_deadline_and_names_it_while_the_other_is_reported(
    provisioned, testbed, tmp_path
):
    names = [n.name for n in testbed.nodes]
    inv = derived_inventory(testbed.inventory_path, tmp_path / "drill.py", names, dict.fromkeys(names, DEADLINES))
    cluster = inventory.load(inv)
    other = next(n for n in names if n != FROZEN)
    freezer = Freezer(testbed)
    try:
        # facts: frozen once it asks its first fact (logged in, answering until then).
        start = time.monotonic()
        facts = gather_facts(list(cluster.nodes), HOST_FACTS, on_event=freezer.on(lambda h, t: h == FROZEN))
        took = time.monotonic() - start
        assert freezer.frozen.is_set()
        assert facts.failed[FROZEN].startswith("timed out in facts os, "), facts.failed
        assert set(facts.facts[other]) == set(HOST_FACTS)
        assert took < DEADLINES["command_timeout_s"] + MARGIN_S

        # status and validate, started with the host frozen, side by side.
        env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
        validate_json = tmp_path / "validate.json"
        frozen_at_start = derived_inventory(
            testbed.inventory_path, tmp_path / "frozen.py", names, dict.fromkeys(names, STARTED_FROZEN)
        )
        status = _cli(["status", str(frozen_at_start), "--json"], env)
        validate = _cli(
            ["validate", str(frozen_at_start), "--quick", "--only", "cpu", "--json", str(validate_json)], env
        )
        status_out, status_err = status.communicate(timeout=900)
        validate_err = validate.communicate(timeout=900)[1]
        assert status.returncode == 1, status_err[-2000:]
        assert validate.returncode == 1, validate_err[-2000:]
        hosts = {h["name"]: h for h in json.loads(status_out)["hosts"]}
        # Frozen before the command started: its connection is what hangs (a timeout, or
        # no SSH banner within paramiko's wait), said in its row.
        assert hosts[FROZEN]["reachable"] is False
        assert hosts[FROZEN]["error"], hosts[FROZEN]
        assert hosts[other]["reachable"] is True, (hosts[other], status_err[-3000:])
        assert hosts[other]["versions"]["torch"].startswith("2.13.0")
        report = json.loads(validate_json.read_text())
        verdicts = {n["node"]: n for n in report["nodes"]}
        assert verdicts[FROZEN]["verdict"] == "fail"
        assert verdicts[FROZEN]["errors"], verdicts[FROZEN]
        measured = [r for r in report["records"] if r["node"] == other and r["value"] is not None]
        assert measured, "the host that answered must keep its figures"

        # up: thawed, then frozen again once its preflight is under way: logged in, and
        # about to read its first fact (preflight reads facts and runs no operation, and
        # no event marks the moment after login, so the test hooks pyinfra's fact call).
        freezer.thaw()
        start = time.monotonic()
        with mock.patch.object(Host, "get_fact", freezer.before(FROZEN, Host.get_fact)):
            up = pipeline.up(cluster, pipeline.select(only="preflight"))
        took = time.monotonic() - start
        assert freezer.frozen.is_set()
        assert up.exit_code == 1
        failure = " ".join(str(f) for f in up.hosts[FROZEN].failures)
        assert "timed out" in failure, up.as_json()
        assert up.hosts[other].ok, up.as_json()
        assert took < DEADLINES["step_timeout_s"] + MARGIN_S
    finally:
        if freezer.frozen.is_set():
            freezer.thaw()

    # Thawed, the same commands pass on both hosts: nothing was left half-done.
    again = gather_facts(list(cluster.nodes), HOST_FACTS)
    assert again.failed == {}, again.failed
    rerun = pipeline.up(cluster, pipeline.select(only="preflight"))
    assert rerun.exit_code == 0, rerun.as_json()
