"""`provision tune` on the provisioned testbed: a study of 6 trials of the tiny model on
the two VMs, two at a time, TPE with the median pruner, with the frameworks venv `up`
built and the checkpoints share `up` exported. The testbed is a Slurm cluster (the slurm
step of the shared `up`), so each trial is a Slurm job the scheduler places. Every trial
ends complete or pruned, at least one is pruned, the best is at least as good as the
enqueued defaults, and its copy on the share loads and evaluates to the same loss, seen
from the other VM too.

The drill under Slurm: an admin cancels a running trial's job (scancel) mid-study; that
attempt fails, is asked again on the other node, and the study completes.

The SSH scheduler's node-lost drill and Ctrl-C/--resume run on network-namespace hosts
(tests/integration/test_tune_run.py), where they cost seconds instead of TCG minutes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
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
# torch import: about 75 s.
TRIAL = ["--steps", "12", "--eval-interval", "3", "--batch-per-rank", "2", "--threads", "1"]
TRAINER = ["--", "--data-max-mb", "1", "--eval-samples", "8"]


@pytest.mark.takes_s(720)  # CI's run of stop 46: 631 s; session 46's clean clone: 675 s
def test_a_study_of_six_trials_on_both_vms(provisioned, testbed, tmp_path):
    assert provisioned.exit_code == 0  # `up` made the venv, the share and the training user
    (tmp_path / "space.toml").write_text(SPACE)
    cmd = [
        sys.executable, "-m", "provision", "tune", str(testbed.inventory_path), "--space", str(tmp_path / "space.toml"),
        "--trials", "6", "--parallel", "2", "--sampler", "tpe", "--pruner", "median", "--seed", "11",
        "--study", "e2e", "--runs-dir", str(tmp_path / "runs"), "--json", "--retries", "1", *TRIAL, *TRAINER,
    ]  # fmt: skip
    cluster = inventory.load(testbed.inventory_path)
    head = cluster.head_node()[0]
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=dict(os.environ))
        try:
            cancelled = _cancel_a_running_trial(proc, tmp_path / "err.txt", head)
            code = proc.wait(timeout=STUDY_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
    err_text = (tmp_path / "err.txt").read_text()
    assert code == 0, err_text[-4000:]
    assert "scheduler: slurm" in err_text  # auto chose Slurm on the provisioned testbed
    summary = json.loads((tmp_path / "out.txt").read_text())
    rows = summary["rows"]
    finished = [r for r in rows if r["state"] in ("COMPLETE", "PRUNED")]
    assert len(finished) == 6, rows
    assert any(r["state"] == "PRUNED" for r in rows), rows
    assert {r["slot"] for r in finished} == {"node1", "node2"}  # Slurm placed trials on both
    # Each attempt was a job of its own; the cancelled one failed and ran again, elsewhere.
    assert len({r["slurm_job"] for r in rows}) == len(rows), rows
    (failed,) = [r for r in rows if r["state"] == "FAIL"]
    assert (failed["number"], failed["slurm_job"]) == cancelled, rows
    (again,) = [r for r in rows if r["retry_of"] == failed["number"]]
    assert again["state"] in ("COMPLETE", "PRUNED")
    assert again["slot"] != failed["slot"], rows
    assert again["params"] == failed["params"]
    assert sh(head, "squeue --noheader --format=%j | grep -c '^provision-tune-' || true").strip() == "0"
    (default,) = [r for r in rows if r["default"]]
    best = summary["best"]
    assert best["value"] <= default["value"] == summary["default_value"]
    assert best["problem"] is None, best
    assert best["evaluated"] == pytest.approx(best["value"], rel=1e-6)
    # The best is on the checkpoints share: the other VM reads the same file.
    assert best["checkpoint"].startswith("/shared/checkpoints/tune-e2e/best-step")
    for node in cluster.nodes:
        kept = json.loads(sh(node, f"cat {shlex.quote(str(Path(best['checkpoint']).with_name('best.json')))}"))
        assert kept["trial"] == best["number"]
        assert kept["flags"] == best["params"]
        sh(node, f"test -s {shlex.quote(best['checkpoint'])}")
    # The trials' own checkpoints are removed once the best is kept (the copy stays).
    assert summary["removed_checkpoints"] >= sum(1 for r in rows if r["state"] == "COMPLETE")
    assert sh(head, "ls /shared/checkpoints | grep -c '^tune-e2e-t' || true").strip() == "0"
    # A pruned trial's trainer stopped itself after the controller's stop file.
    logs = "\n".join(p.read_text() for p in (tmp_path / "runs" / "tune" / "e2e" / "trials").glob("*/*.log"))
    assert "stopped: pruned at step" in logs, err_text[-3000:]
    assert (tmp_path / "runs" / "tune" / "e2e" / "report.html").read_text().count("data:image/png") >= 3


RUNS_ON = re.compile(r"trial (\d+): Slurm job (\d+) runs on (\S+)")


def _cancel_a_running_trial(proc: subprocess.Popen, err_file: Path, head) -> tuple[int, str]:
    """As an admin would: scancel the job of the first trial after the defaults once it
    runs. Returns (trial number, job id)."""
    deadline = time.monotonic() + STUDY_TIMEOUT_S / 2
    while proc.poll() is None and time.monotonic() < deadline:
        for m in RUNS_ON.finditer(err_file.read_text()):
            number, job = int(m.group(1)), m.group(2)
            if number >= 1:
                sh(head, f"scancel {job}")
                return number, job
        time.sleep(2)
    raise AssertionError(f"no trial's job was seen running: {err_file.read_text()[-3000:]}")
