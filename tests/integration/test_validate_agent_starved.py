"""The agent's quick mode starved to 10 % of one CPU core (a cgroup CPU quota): every phase
still reports (a value, or why not), and the run ends within its own deadline.

This is the slow emulated node of issue 14 on this machine: under the quota, the fixed-size
benchmarks of old ran for many minutes; bounded by time, each phase ends at its budget."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.validate import agent as agent_module
from provision.validate import agent_stream
from tests.helpers.cpu_quota import cpu_quota

AGENT = Path(agent_module.__file__)
BUDGETS = {"cpu": 4.0, "ram": 4.0, "disk": 6.0}  # small, so the test ends in a few minutes
QUOTA_US, PERIOD_US = 10_000, 100_000  # 10 % of one core


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_quick_agent_on_a_tenth_of_a_core_reports_every_phase_within_its_deadline(tmp_path):
    deadline = agent_module.outer_deadline_s("quick", {**agent_module.BUDGETS_S["quick"], **BUDGETS})
    deadline -= sum(v for k, v in agent_module.BUDGETS_S["quick"].items() if k not in BUDGETS)  # no GPU phases
    budget = ",".join(f"{k}={v:g}" for k, v in BUDGETS.items())
    argv = [sys.executable, str(AGENT), "--mode", "quick", "--only", "cpu,ram,disk", "--data-dir", str(tmp_path)]
    with cpu_quota(QUOTA_US, PERIOD_US) as procs:

        def join_quota() -> None:  # in the child, before exec: nothing runs outside the quota
            procs.write_text(str(os.getpid()))

        p = subprocess.Popen([*argv, "--budget", budget], stdout=subprocess.PIPE, text=True, preexec_fn=join_quota)
        try:
            # The margin bounds this test's own wait; the assertion is that the agent ended.
            stdout, _ = p.communicate(timeout=deadline + 60)
        finally:
            if p.poll() is None:
                p.kill()  # our own child, by its handle
                p.wait()
    assert p.returncode == 0
    report = agent_stream.agent_output(stdout, "starved")
    assert report.stopped_in == ""  # it finished: the end line came
    rows = {m.metric: m for m in report.measurements}
    phases = [json.loads(line) for line in stdout.splitlines() if '"type": "phase"' in line]
    assert [(d["phase"], d["state"]) for d in phases] == [
        ("cpu", "start"),
        ("cpu", "end"),
        ("ram", "start"),
        ("ram", "end"),
        ("disk", "start"),
        ("disk", "end"),
    ]
    owed = agent_module.CPU_METRICS + agent_module.RAM_METRICS + agent_module.DISK_METRICS
    for metric in owed:
        m = rows[metric]
        assert m.value is not None or "timed out" in m.not_run or "fitted in the" in m.not_run, (metric, m.not_run)
    for d in phases:
        if d["state"] == "end":
            assert d["seconds"] <= BUDGETS[d["phase"]] + agent_module.GRACE_S + 1, d  # cut off, not run to the end
