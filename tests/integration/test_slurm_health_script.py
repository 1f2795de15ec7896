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
from pathlib import Path

import pytest

from provision.rules import slurm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# What the captured H200 answered to the fact's query (tests/fixtures/gpu-facts_h200_580.159.04.txt).
CAPTURED_DRIVER = re.search(r"^smi=(\S+)$", (FIXTURES / "gpu-facts_h200_580.159.04.txt").read_text(), re.M)[1]
REAL_TOOLS = (
    "bash",
    "sh",
    "cat",
    "mv",
    "rm",
    "mkdir",
    "sleep",
    "head",
    "tr",
    "grep",
    "awk",
    "df",
    "stat",
    "mountpoint",
    "findmnt",
    "logger",
    "printf",
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the script keeps its probes under /run (root)")

STAND_IN = """#!/bin/bash
# Test stand-in for nvidia-smi (no GPU on this machine): answers the health check's one query
# with the driver version captured on a real H200, once per GPU; in hang mode it ignores
# SIGTERM and sleeps, as nvidia-smi on a wedged GPU does not return.
[ "$*" = "--query-gpu=driver_version --format=csv,noheader" ] || exit 9
echo $$ >> "{mode}/starts"
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


def _run(tmp: Path, *, declared: int, answering: int, driver: str = "580.*", mounts=()) -> subprocess.CompletedProcess:
    script = tmp / "health.sh"
    probes = tmp / "probes"
    script.write_text(
        slurm.health_script("n1", declared, driver, list(mounts), path=_path(tmp, answering), state_dir=str(probes))
    )
    # Slurm kills the program at 60 s: it must be done well before, whatever hangs.
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)


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
