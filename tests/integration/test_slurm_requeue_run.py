"""`train --scheduler slurm --requeue`'s node shell (provision/launch/slurm_job.py) run for real
by dash: a node's script started twice as Slurm starts it (first run, then after a requeue),
and the controller's per-node stream following one job across a requeue, against a stand-in
for squeue that answers the job state the test sets. The real requeue against slurmctld is
the end-to-end tier's (tests/e2e/test_train_e2e.py).

Both run with a PATH of their own: the stand-ins first, then only the real tools they use,
so a Slurm installed on this machine is never asked."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from provision.launch import plan, slurm_job
from tests.unit.test_launch import two_node_plan

DASH = shutil.which("dash")
REAL_TOOLS = ("sh", "tail", "sleep", "head", "rm", "cat", "env")
TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(DASH is None, reason="dash (the nodes' /bin/sh) is not installed")

# squeue's stand-in: prints the state in $STATE_FILE (nothing for an empty file, as squeue
# does for a job that left the queue) and counts its calls, so the test knows the stream
# has seen a state before it moves on.
SQUEUE = """#!/bin/sh
echo x >> "{calls}"
cat "{state}"
"""
# torchrun's stand-in (the node's "python"): one worker line, then the exit status the test
# chose; it also says whether the previous attempt's exit status was still there.
PYTHON = """#!/bin/sh
if [ -e "{status}" ]; then echo "[rank0]:stale status $(cat "{status}")"; fi
echo "[rank0]:step 1/8 | restarts ${{SLURM_RESTART_COUNT:-none}}"
exit "${{STUB_RC:-0}}"
"""


def _tools(tmp: Path) -> Path:
    tools = tmp / "tools"
    tools.mkdir(exist_ok=True)
    for tool in REAL_TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not installed here"
        if not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    return tools


def _node(tmp: Path) -> plan.NodePlan:
    node = two_node_plan().nodes[0]
    run_dir, work = tmp / "run", tmp / "work"
    (run_dir / "torchrun-logs").mkdir(parents=True)
    work.mkdir()
    return dataclasses.replace(node, run_dir=str(run_dir), work_dir=str(work), python=str(tmp / "python"))


def _status(node: plan.NodePlan) -> Path:
    return Path(slurm_job.logs_dir(node)) / slurm_job.TASK_EXIT


def _log(node: plan.NodePlan) -> Path:
    return Path(slurm_job.logs_dir(node)) / slurm_job.TASK_LOG


def test_each_start_of_a_nodes_script_clears_the_last_status_and_appends_its_attempt_to_the_log(tmp_path):
    node = _node(tmp_path)
    python = Path(node.python)
    python.write_text(PYTHON.format(status=_status(node)))
    python.chmod(0o755)
    run = dataclasses.replace(two_node_plan(), nodes=(node,))
    script = tmp_path / "slurm-node.sh"
    script.write_text(slurm_job.node_script(run, node))
    assert subprocess.run([DASH, "-n", str(script)]).returncode == 0
    env = {"PATH": str(_tools(tmp_path)), "SLURM_JOB_ID": "4711"}

    first = subprocess.run([DASH, str(script)], env={**env, "STUB_RC": "143"}, timeout=TIMEOUT_S)
    assert first.returncode == 143
    assert _status(node).read_text().strip() == "143"
    again = subprocess.run(
        [DASH, str(script)], env={**env, "SLURM_RESTART_COUNT": "1", "STUB_RC": "0"}, timeout=TIMEOUT_S
    )
    assert again.returncode == 0
    assert _status(node).read_text().strip() == "0"
    assert _log(node).read_text().splitlines() == [
        "[provision] Slurm job 4711 started (attempt 1)",
        "[rank0]:step 1/8 | restarts none",
        "[provision] Slurm job 4711 started (attempt 2)",
        "[rank0]:step 1/8 | restarts 1",  # no "stale status": the first attempt's went first
    ]


class Job:
    """The job as the stand-in squeue reports it, and the node's files as its tasks write them."""

    def __init__(self, tmp: Path, node: plan.NodePlan):
        self.node, self.state, self.calls = node, tmp / "state", tmp / "calls"
        self.proc: subprocess.Popen[str] | None = None
        self.set("")
        self.calls.write_text("")
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        squeue = bin_dir / "squeue"
        squeue.write_text(SQUEUE.format(calls=self.calls, state=self.state))
        squeue.chmod(0o755)
        self.path = f"{bin_dir}:{_tools(tmp)}"

    def stream(self, requeue: bool, state: str) -> subprocess.Popen[str]:
        """The node's stream, started while the job is in ``state``."""
        self.set(state)
        argv = shlex.split(slurm_job.stream_command(self.node, "4711", None, requeue=requeue))
        assert argv[:2] == ["sh", "-c"]
        self.proc = subprocess.Popen(
            [DASH, "-c", argv[2]], env={"PATH": self.path}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        return self.proc

    def set(self, state: str) -> None:
        """What squeue answers from now on ("": nothing, the job left the queue); replaced
        whole, so the stand-in never reads a file half written."""
        new = self.state.with_name("state.new")
        new.write_text(f"{state}\n" if state else "")
        os.replace(new, self.state)

    def polls(self) -> int:
        return len(self.calls.read_text().splitlines())

    def hold(self, state: str, polls: int = 2) -> None:
        """Report ``state`` until the stream has asked at least ``polls`` more times."""
        self.set(state)
        assert self.proc is not None, "start the stream first"
        seen = self.polls()
        deadline = time.monotonic() + TIMEOUT_S
        while self.polls() < seen + polls:
            if self.proc.poll() is not None:
                pytest.fail(f"the stream ended in state {state!r}: {self.proc.communicate()[0]!r}")
            assert time.monotonic() < deadline, f"the stream stopped asking squeue in state {state!r}"
            time.sleep(0.05)

    def start(self, attempt: int) -> None:
        _status(self.node).unlink(missing_ok=True)
        self.say(f"[provision] Slurm job 4711 started (attempt {attempt})")

    def say(self, line: str) -> None:
        with _log(self.node).open("a") as f:
            f.write(line + "\n")

    def end(self, rc: int) -> None:
        _status(self.node).write_text(f"{rc}\n")


@pytest.fixture
def job(tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_job, "POLL_S", 0.2)
    return Job(tmp_path, _node(tmp_path))


def _finish(stream: subprocess.Popen[str]) -> tuple[int, list[str]]:
    out, _ = stream.communicate(timeout=TIMEOUT_S)
    return stream.returncode, out.splitlines()


def test_the_stream_follows_a_requeued_job_to_its_last_attempts_exit_status(job):
    stream = job.stream(requeue=True, state="PENDING")
    job.hold("PENDING")
    job.start(1)
    job.say("[rank0]:step 1/8")
    job.hold("RUNNING")
    # Slurm ends the first attempt for the requeue: its status is written while the job is
    # still listed, and must not end the stream.
    job.end(143)
    job.hold("RUNNING")
    job.hold("COMPLETING")
    job.hold("REQUEUED")
    job.hold("PENDING")
    assert stream.poll() is None, "the stream ended on the requeued attempt's exit status"
    job.start(2)
    job.say("[rank0]:resumed at step 4")
    job.hold("RUNNING")
    job.say("[rank0]:step 8/8")
    job.end(0)
    job.hold("COMPLETING")
    job.set("")  # gone from the queue
    rc, lines = _finish(stream)
    assert rc == 0, lines
    # The stream's own line comes between tail's lines wherever tail has got to.
    said = "[provision] Slurm job 4711 requeued (REQUEUED): following its next attempt"
    assert lines.count(said) == 1, lines
    assert [line for line in lines if line != said] == [
        "[provision] Slurm job 4711 started (attempt 1)",
        "[rank0]:step 1/8",
        "[provision] Slurm job 4711 started (attempt 2)",
        "[rank0]:resumed at step 4",
        "[rank0]:step 8/8",
    ]


def test_a_requeued_job_cancelled_before_it_starts_again_ends_killed_whatever_the_last_attempt_left(job):
    stream = job.stream(requeue=True, state="RUNNING")
    job.start(1)
    job.hold("RUNNING")
    job.end(0)  # the first attempt's, ended for the requeue
    job.hold("COMPLETING")
    job.hold("PENDING")
    job.set("")  # scancel while it waited: gone without a second attempt
    rc, lines = _finish(stream)
    assert rc == slurm_job.KILLED, lines
    assert "[provision] Slurm job 4711 ended while waiting to start (PENDING)" in lines


@pytest.mark.parametrize(
    ("requeue", "listed", "rc"),
    [
        # Where squeue lists a finished job (FAILED) until the controller forgets it.
        pytest.param(True, "FAILED", 1, id="requeue-ended-state"),
        # The contrast: a job that cannot be requeued has nothing more to follow, so its
        # status ends the stream while the job is still listed.
        pytest.param(False, "RUNNING", 3, id="no-requeue-status-first"),
    ],
)
def test_the_stream_ends_with_the_tasks_status_when_it_can_trust_it(job, requeue, listed, rc):
    stream = job.stream(requeue=requeue, state="RUNNING")
    job.start(1)
    job.hold("RUNNING")
    job.end(rc)
    job.set(listed)
    ended, lines = _finish(stream)
    assert ended == rc, lines


def test_a_placed_task_waits_for_its_nodes_script_then_runs_it_and_refuses_an_unknown_node(tmp_path):
    """tune's job of one task on the node Slurm chose (slurm_job.placed_script): it waits
    until the controller has put that node's script (renamed into place whole), runs it
    with its exit status, and a node the submission did not know is refused at once."""
    run_dir = tmp_path / "runs" / "r1" / "node2"
    script = slurm_job.placed_script({"node1": str(tmp_path / "elsewhere"), "node2": str(run_dir)})
    env = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "node2"}
    task = subprocess.Popen([DASH, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert task.poll() is None  # still waiting: nothing prepared yet
    run_dir.mkdir(parents=True)
    (run_dir / f"{slurm_job.NODE_SCRIPT}.part").write_text("echo ran on $SLURMD_NODENAME; exit 7\n")
    time.sleep(1.5)
    assert task.poll() is None  # a part file is not the script
    (run_dir / f"{slurm_job.NODE_SCRIPT}.part").rename(run_dir / slurm_job.NODE_SCRIPT)
    out, _ = task.communicate(timeout=TIMEOUT_S)
    assert (task.returncode, out.strip()) == (7, "ran on node2")

    stranger = subprocess.run(
        [DASH, "-c", script], env={**env, "SLURMD_NODENAME": "node3"}, capture_output=True, text=True, timeout=5
    )
    assert stranger.returncode == 1
    assert "no run directory for node node3" in stranger.stderr
