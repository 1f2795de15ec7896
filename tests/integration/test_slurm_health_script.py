"""The Slurm health check program (templates/slurm/health.sh.j2) run for real by bash: its
GPU checks against a stand-in for nvidia-smi (no GPU here) answering with the driver version
captured on a lent H200, a hung nvidia-smi abandoned within the probe deadline, and no drain
when the controller does not answer. Draining and resuming against a real slurmctld are the
end-to-end tier's (tests/e2e/test_slurm_e2e.py).

The script runs with a PATH of its own: the stand-in first, then only the real tools it
uses, so a Slurm installed on this machine is never asked."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from provision.rules import slurm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# What the captured H200 answered to the fact's query (tests/fixtures/gpu-facts_h200_580.159.04.txt).
CAPTURED_DRIVER = re.search(r"^smi=(\S+)$", (FIXTURES / "gpu-facts_h200_580.159.04.txt").read_text(), re.M)[1]
# Every program the script runs (and the nvidia-smi stand-in's sleep and cat), and no other:
# one it starts that is not here fails the test.
REAL_TOOLS = (
    "sleep",
    "cat",
    "bash",
    "sh",
    "mv",
    "rm",
    "mkdir",
    "mkfifo",
    "head",
    "tr",
    "grep",
    "df",
    "stat",
    "mountpoint",
    "logger",
    "printf",
    "flock",
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the script keeps its probes under /run (root)")

STAND_IN = """#!/bin/bash
# Test stand-in for nvidia-smi (no GPU on this machine): answers the health check's one query
# with the driver version captured on a real H200, once per GPU; in hang mode it ignores
# SIGTERM and sleeps, as nvidia-smi on a wedged GPU does not return.
[ "$*" = "--query-gpu=driver_version --format=csv,noheader" ] || exit 9
echo $$ >> "{mode}/starts"
[ -e "{mode}/slow" ] && sleep "$(cat "{mode}/slow")"
if [ -e "{mode}/hang" ]; then
    echo $$ > "{mode}/hung.pid"
    trap '' TERM
    sleep 300
fi
for i in $(seq {gpus}); do echo {driver}; done
"""


def _path(tmp: Path, gpus_answering: int) -> str:
    stand_in, tools = tmp / "standin-nvidia-smi", tmp / "tools"
    stand_in.mkdir(exist_ok=True)
    tools.mkdir(exist_ok=True)
    script = stand_in / "nvidia-smi"
    script.write_text(STAND_IN.format(mode=tmp, gpus=gpus_answering, driver=CAPTURED_DRIVER))
    script.chmod(0o755)
    for tool in (*REAL_TOOLS, "seq"):
        found = shutil.which(tool)
        assert found, f"{tool} is not installed here"
        if not (tools / tool).exists():
            (tools / tool).symlink_to(found)
    return f"{stand_in}:{tools}"


def _script(tmp: Path, *, declared: int, answering: int, driver: str = "580.*", mounts=()) -> Path:
    script = tmp / "health.sh"
    probes = tmp / "probes"
    script.write_text(
        slurm.health_script("n1", declared, driver, list(mounts), path=_path(tmp, answering), state_dir=str(probes))
    )
    return script


def _run(tmp: Path, **kw) -> subprocess.CompletedProcess:
    # Slurm kills the program at 60 s: it must be done well before, whatever hangs.
    return subprocess.run(["bash", str(_script(tmp, **kw))], capture_output=True, text=True, timeout=60)


def test_a_node_whose_gpus_and_driver_answer_as_provisioned_passes(tmp_path):
    p = _run(tmp_path, declared=1, answering=1, mounts=["/not-in-fstab-so-not-checked"])
    assert (p.returncode, p.stdout) == (0, ""), p.stdout + p.stderr


def test_a_driver_other_than_the_pinned_one_is_a_problem_and_no_drain_without_the_controller(tmp_path):
    p = _run(tmp_path, declared=1, answering=1, driver="580.95.05")
    assert p.returncode == 1
    assert f"n1: provision: health: driver {CAPTURED_DRIVER} loaded, 580.95.05 pinned\n" in p.stdout
    # No sinfo on this PATH: the controller's answer is unknown, and nothing is drained.
    assert "the controller did not answer (sinfo 127); not drained this time" in p.stdout


def test_a_gpu_fewer_than_declared_is_a_problem(tmp_path):
    p = _run(tmp_path, declared=2, answering=1)
    assert "n1: provision: health: 1 of 2 GPUs answer\n" in p.stdout


def test_a_hung_nvidia_smi_is_abandoned_at_the_probe_deadline_and_named(tmp_path):
    (tmp_path / "hang").touch()
    try:
        p = _run(tmp_path, declared=1, answering=1)
        assert p.returncode == 1
        assert f"provision: health: nvidia-smi did not answer in {slurm.PROBE_S} s" in p.stdout
        # Still running: the script left it behind rather than wait for it.
        hung = int((tmp_path / "hung.pid").read_text())
        os.kill(hung, 0)
        # The next run finds it still hung and starts no second one beside it.
        again = _run(tmp_path, declared=1, answering=1)
        assert f"provision: health: nvidia-smi did not answer in {slurm.PROBE_S} s" in again.stdout
        assert (tmp_path / "starts").read_text().split() == [str(hung)]
    finally:
        if (tmp_path / "hung.pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "hung.pid").read_text()), signal.SIGKILL)


def test_runs_at_once_wait_for_each_other_and_none_reads_the_others_probes_as_late(tmp_path):
    """slurmd's run every interval beside one by hand: they share the probes' files, and
    without the lock one run's fresh start of a probe removed the answer the other was about
    to read ("did not answer", a false drain; seen on the testbed)."""
    (tmp_path / "slow").write_text("0.3")
    script = _script(tmp_path, declared=1, answering=1)
    runs = []
    for _ in range(6):
        run = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        runs.append(run)
        time.sleep(0.1)
    outs = [(r.wait(timeout=60), r.stdout.read()) for r in runs]
    assert outs == [(0, "")] * 6, outs
    # Each waited for the one before: every run asked the GPU once, one after another.
    assert len((tmp_path / "starts").read_text().split()) == 6


def test_a_run_still_going_past_the_lock_deadline_leaves_the_next_one_checking_nothing(tmp_path):
    script = _script(tmp_path, declared=1, answering=1)
    probes = tmp_path / "probes"
    probes.mkdir(mode=0o700)
    # Another run holding the lock all along (flock(1) on the same file, as the script takes it).
    holder = subprocess.Popen(["flock", str(probes / "lock"), "sleep", str(slurm.LOCK_S + 30)])
    try:
        time.sleep(0.5)
        p = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 1
    assert p.stdout == f"n1: another run of this check held its lock for {slurm.LOCK_S} s; nothing checked this time\n"
    # Nothing was probed: the GPU stand-in was never started.
    assert not (tmp_path / "starts").exists()


def test_a_hung_probe_does_not_hold_the_lock_for_the_runs_after_it(tmp_path):
    (tmp_path / "hang").touch()
    try:
        first = _run(tmp_path, declared=1, answering=1)
        assert f"nvidia-smi did not answer in {slurm.PROBE_S} s" in first.stdout
        again = _run(tmp_path, declared=1, answering=1)
        # The hung probe (left running) does not hold the lock: the second run checked.
        assert "held its lock" not in again.stdout
        assert f"nvidia-smi did not answer in {slurm.PROBE_S} s" in again.stdout
    finally:
        if (tmp_path / "hung.pid").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((tmp_path / "hung.pid").read_text()), signal.SIGKILL)
