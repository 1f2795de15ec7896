"""`provision tune` on the provisioned testbed: a study of 8 trials of the tiny model on
the two VMs, two at a time, TPE with the median pruner, with the frameworks venv `up`
built and the checkpoints share `up` exported. Every trial ends complete or pruned, at
least one is pruned, the best is at least as good as the enqueued defaults, and its copy
on the share loads and evaluates to the same loss, seen from the other VM too.

The node-lost drill and Ctrl-C/--resume run on network-namespace hosts
(tests/integration/test_tune_run.py), where they cost seconds instead of TCG minutes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from provision import inventory
from tests.e2e.storage_helpers import sh

STUDY_TIMEOUT_S = 1800  # the whole study, bounded
SPACE = """
[lr]          # wide: some trials are hopeless, and the median pruner stops them
low = 1e-5
high = 3e-2
log = true

[warmup-steps]
low = 0
high = 8
"""
# Four evaluations a trial (the pruner's reports), one thread per trial: each VM runs one
# trial at a time and the host's two cores are shared by the two VMs. Two sequences a
# step: a step takes about 0.5 s under TCG, and a trial's time is mostly the trainer's
# torch import (the first on a node also the launch's check): about 75 s.
TRIAL = ["--steps", "12", "--eval-interval", "3", "--batch-per-rank", "2", "--threads", "1"]
TRAINER = ["--", "--data-max-mb", "1", "--eval-samples", "8"]


def test_a_study_of_eight_trials_on_both_vms(provisioned, testbed, tmp_path):
    assert provisioned.exit_code == 0  # `up` made the venv, the share and the training user
    (tmp_path / "space.toml").write_text(SPACE)
    cmd = [
        sys.executable, "-m", "provision", "tune", str(testbed.inventory_path), "--space", str(tmp_path / "space.toml"),
        "--trials", "8", "--parallel", "2", "--sampler", "tpe", "--pruner", "median", "--seed", "11",
        "--study", "e2e", "--runs-dir", str(tmp_path / "runs"), "--json", *TRIAL, *TRAINER,
    ]  # fmt: skip
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        code = subprocess.run(cmd, stdout=out, stderr=err, timeout=STUDY_TIMEOUT_S, env=dict(os.environ)).returncode
    err_text = (tmp_path / "err.txt").read_text()
    assert code == 0, err_text[-4000:]
    summary = json.loads((tmp_path / "out.txt").read_text())
    rows = summary["rows"]
    assert len(rows) == 8, rows
    assert {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}, rows
    assert any(r["state"] == "PRUNED" for r in rows), rows
    assert {r["slot"] for r in rows} == {"node1", "node2"}
    (default,) = [r for r in rows if r["default"]]
    best = summary["best"]
    assert best["value"] <= default["value"] == summary["default_value"]
    assert best["problem"] is None, best
    assert best["evaluated"] == pytest.approx(best["value"], rel=1e-6)
    # The best is on the checkpoints share: the other VM reads the same file.
    cluster = inventory.load(testbed.inventory_path)
    assert best["checkpoint"].startswith("/shared/checkpoints/tune-e2e/best-step")
    for node in cluster.nodes:
        kept = json.loads(sh(node, f"cat {shlex.quote(str(Path(best['checkpoint']).with_name('best.json')))}"))
        assert kept["trial"] == best["number"]
        assert kept["flags"] == best["params"]
        sh(node, f"test -s {shlex.quote(best['checkpoint'])}")
    # A pruned trial's trainer stopped itself after the controller's stop file.
    logs = "\n".join(p.read_text() for p in (tmp_path / "runs" / "tune" / "e2e" / "trials").glob("*/*.log"))
    assert "stopped: pruned at step" in logs, err_text[-3000:]
    assert (tmp_path / "runs" / "tune" / "e2e" / "report.html").read_text().count("data:image/png") >= 3
