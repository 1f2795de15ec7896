"""`provision run` on two network-namespace hosts over real SSH, with a job written here
(not the bundled trainer): a torch DDP script over gloo with torchrun, a requirements file
of a wheel the job ships, metrics and a saved model; then `runs` and `logs`; a second run
reusing the env; and a failing node that tears the job down on every node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.user_job import RUN, TRAIN, wheel

RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def hosts(netns_hosts, tmp_path_factory):
    node_dir = tmp_path_factory.mktemp("node-job-dir")
    return netns_hosts(2, venv_path=sys.prefix, train_dir=str(node_dir)), node_dir


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    work = tmp_path_factory.mktemp("job")
    (work / "code").mkdir()
    (work / "code" / "train.py").write_text(TRAIN)
    (work / "code" / "requirements.txt").write_text("--no-index\n--find-links wheels\nprovision-demo-extra==1.0\n")
    wheel(work / "code" / "wheels")
    (work / "code" / ".git").mkdir()
    (work / "code" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (work / "task.yaml").write_text(
        "name: ddp-test\nworkdir: code\nnum_nodes: 2\nenvs:\n  OMP_NUM_THREADS: 1\n  WRITE_TB: 1\n"
        "setup: |\n  echo setup on $SKYPILOT_NODE_RANK\nrun: |\n  " + RUN + "\n"
    )
    return work


def provision(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "provision", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_a_users_ddp_task_runs_on_two_nodes_and_its_results_come_back(hosts, job):
    cluster, _ = hosts
    inv = str(cluster.inventory)
    done = provision(job, "run", inv, "task.yaml", "--scheduler", "ssh", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["ok"]
    assert report["exits"] == {"ns0": 0, "ns1": 0}
    assert "rank 0 of 2 on node 0 extra=42 done" in done.stderr
    assert "rank 1 of 2 on node 1 extra=42 done" in done.stderr
    assert "setup on 0" in done.stderr
    assert "setup on 1" in done.stderr
    assert report["metrics"]["loss"] < 1.0
    assert report["best"]["loss"] <= report["metrics"]["loss"]
    import torch

    state = torch.load(Path(report["outputs"]) / "model.pt")
    assert set(state) == {"weight", "bias"}
    assert report["environment"]
    assert "building" in done.stderr
    assert report["clean"] is True
    assert ".git/ (left out by default)" in done.stderr
    assert report["tensorboard"] == f"{report['job_dir']}/tb"  # events written there, the command printed
    # The second run with the same requirements builds nothing.
    again = provision(job, "run", inv, "task.yaml", "--scheduler", "ssh", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    assert ": cached" in again.stderr
    assert "building" not in again.stderr
    assert "Successfully installed" not in again.stderr
    # runs lists both from the nodes' own files, logs shows a node's lines.
    listed = provision(job, "runs", inv, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {r["id"]: r for r in json.loads(listed.stdout)}
    assert rows[report["run_id"]]["state"] == "succeeded"
    assert rows[report["run_id"]]["name"] == "ddp-test"
    shown = provision(job, "logs", inv, report["run_id"], "--node", "ns1")
    assert "rank 1 of 2" in shown.stdout


def test_a_failing_node_ends_the_job_on_every_node_and_is_named(hosts, job):
    cluster, _node_dir = hosts
    run = 'if [ "$NODE_RANK" = 1 ]; then echo dying; exit 7; fi; echo waiting; sleep 600'
    done = provision(job, "run", str(cluster.inventory), "--scheduler", "ssh", "--nodes", "2", "--json", "--", run)
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["failed_node"] == "ns1"
    assert "exit 7" in report["failure"]
    assert "dying" in report["last_lines"]
    assert report["clean"] is True  # ns0's sleep was stopped by the reaper
    assert _ours(report["run_id"]) == []  # nothing of the run is left on either host


def test_a_task_file_with_cloud_and_unknown_keys_is_refused_naming_each(tmp_path, hosts):
    cluster, _ = hosts
    (tmp_path / "t.yaml").write_text("run: echo hi\nnum_nodes: 0\nresources:\n  cloud: aws\nservice: {}\nfoo: 1\n")
    done = provision(tmp_path, "run", str(cluster.inventory), "t.yaml")
    assert done.returncode == 2
    for key in ("num_nodes", "resources.cloud", "service", "foo"):
        assert f"t.yaml: {key}" in done.stderr
    assert "Traceback" not in done.stderr


def _ours(run_id: str) -> list[str]:
    """Processes on this machine (every namespace host's) carrying the run's marker."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"PROVISION_RUN_ID={run_id}".encode() in environ.read_bytes():
                found.append(environ.parent.name)
        except OSError:
            continue
    return found


def test_ctrl_c_stops_the_job_on_every_node(hosts, tmp_path):
    cluster, _ = hosts
    cmd = [sys.executable, "-m", "provision", "run", str(cluster.inventory), "--scheduler", "ssh", "--nodes", "2",
           "--runs-dir", str(tmp_path / "runs"), "--json", "--", "echo up on $NODE_RANK; sleep 600"]  # fmt: skip
    with open(tmp_path / "err.txt", "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    deadline = time.monotonic() + 120
    said = ""
    while time.monotonic() < deadline and not ("up on 0" in said and "up on 1" in said):
        time.sleep(0.5)
        said = (tmp_path / "err.txt").read_text()
    assert "up on 1" in said, said[-2000:]
    run_id = next(p.name for p in (tmp_path / "runs").iterdir())
    assert _ours(run_id)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1
    report = json.loads(out)
    assert report["failure"] == "interrupted (Ctrl-C)"
    assert report["clean"] is True
    assert _ours(run_id) == []


def test_requirements_that_do_not_resolve_fail_before_run_naming_the_package_and_node(hosts, tmp_path):
    cluster, _ = hosts
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "requirements.txt").write_text("--no-index\nno-such-package-provision==9.9\n")
    done = provision(tmp_path, "run", str(cluster.inventory), "--scheduler", "ssh", "--nodes", "2",
                     "--workdir", "code", "--json", "--", "echo never ran")  # fmt: skip
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["failed_node"] == "ns0"
    assert "preparing the job failed" in report["failure"]
    assert any("no-such-package-provision" in line for line in report["last_lines"])
    assert "never ran" not in done.stderr


def test_a_task_file_and_a_command_together_are_refused(hosts, job):
    cluster, _ = hosts
    done = provision(job, "run", str(cluster.inventory), "task.yaml", "--", "echo", "x")
    assert done.returncode == 2
    assert "a task file (task.yaml) and a command" in done.stderr
    assert "Traceback" not in done.stderr
