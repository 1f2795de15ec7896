"""`provision tune --sweep` of a user's own program on two network-namespace hosts over
real SSH: a random search of 6 trials, two at a time, each a one-node job that gets its
parameters as --name=value flags and writes its metric as JSON lines; the best is reported
and its outputs kept. A grid runs each point once. Bad sweep files are exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """\
import argparse, json, os
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--width", type=int, default=4)
p.add_argument("--epochs", type=int, default=3)
a = p.parse_args()
loss = (a.lr - 0.01) ** 2 * 1e4 + 1.0 / a.width
for step in range(1, a.epochs + 1):
    value = loss + 1.0 / step
    line = json.dumps({"step": step, "loss": value})
    print(line, flush=True)
    with open(os.environ["PROVISION_METRICS"], "a") as f:
        f.write(line + "\\n")
with open(os.path.join(os.environ["PROVISION_RUN_DIR"], "outputs", "model.json"), "w") as f:
    json.dump({"lr": a.lr, "width": a.width, "loss": value}, f)
"""

SWEEP = """\
program: prog.py
method: random
metric:
  name: loss
  goal: minimize
parameters:
  lr:
    distribution: log_uniform_values
    min: 0.001
    max: 0.1
  width:
    values: [2, 4, 8]
  epochs:
    value: 3
run_cap: 6
"""


@pytest.fixture(scope="module")
def hosts(netns_hosts, tmp_path_factory):
    node_dir = tmp_path_factory.mktemp("node-sweep-dir")
    return netns_hosts(2, venv_path=sys.prefix, train_dir=str(node_dir))


def tune(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "provision", "tune", *args, "--runs-dir", str(cwd / "runs")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )


def test_a_random_search_of_six_trials_of_a_users_program_reports_and_keeps_the_best(hosts, tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    done = tune(tmp_path, str(hosts.inventory), "--sweep", "sweep.yaml", "--parallel", "2", "--seed", "3",
                "--scheduler", "ssh", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = result["rows"]
    assert len(rows) == 6
    assert all(r["state"] == "COMPLETE" for r in rows), rows
    assert {r["node"] for r in rows} == {"ns0", "ns1"}  # both nodes worked
    assert all(r["params"]["epochs"] == 3 for r in rows)  # the constant reached every trial
    best = result["best"]
    assert best["value"] == min(r["value"] for r in rows)
    kept = json.loads((Path(result["best_outputs"]) / "model.json").read_text())
    assert kept["lr"] == pytest.approx(best["params"]["lr"])
    assert kept["width"] == best["params"]["width"]
    assert (tmp_path / "runs" / "tune" / "sweep" / "tune.json").is_file()


def test_a_grid_runs_each_point_once(hosts, tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "grid.yaml").write_text(
        "program: prog.py\nname: grid\nmethod: grid\nmetric: {name: loss, goal: minimize}\n"
        "parameters:\n  lr: {values: [0.01, 0.05]}\n  width: {values: [2, 8]}\n"
    )
    done = tune(tmp_path, str(hosts.inventory), "--sweep", "grid.yaml", "--scheduler", "ssh", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout)["rows"]
    assert sorted((r["params"]["lr"], r["params"]["width"]) for r in rows) == [
        (0.01, 2),
        (0.01, 8),
        (0.05, 2),
        (0.05, 8),
    ]
    assert json.loads(done.stdout)["best"]["params"] == {"lr": 0.01, "width": 8}


def test_a_bad_sweep_file_names_every_problem_and_touches_nothing(hosts, tmp_path):
    (tmp_path / "bad.yaml").write_text(
        "program: ../x.py\nmethod: annealing\nmetric: {goal: up}\nparameters:\n  lr: {min: 1, max: 0}\n"
        "early_terminate: {type: envelope}\nfoo: 1\n"
    )
    done = tune(tmp_path, str(hosts.inventory), "--sweep", "bad.yaml")
    assert done.returncode == 2
    for key in ("program", "method", "metric", "parameters.lr", "early_terminate", "foo"):
        assert f"bad.yaml: {key}" in done.stderr, key
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()
