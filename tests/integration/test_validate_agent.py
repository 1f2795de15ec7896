"""The node agent really runs on this machine: CPU, RAM and disk (real fio on a tmp dir)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.validate import agent as agent_module
from provision.validate import agent_stream

AGENT = Path(agent_module.__file__)


def run_agent(python: str, data_dir: Path, only: str, env: dict | None = None) -> agent_stream.AgentReport:
    p = subprocess.run(
        [python, str(AGENT), "--mode", "quick", "--only", only, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    return agent_stream.agent_output(p.stdout, "local")


def values(report: agent_stream.AgentReport) -> dict[str, float | None]:
    return {m.metric: m.value for m in report.measurements if not m.device}


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
def test_agent_measures_cpu_ram_and_disk_and_cleans_up(tmp_path):
    report = run_agent(sys.executable, tmp_path, "cpu,ram,disk,gpu")
    v = values(report)
    for metric in (
        "cpu_gemm_gflops",
        "ram_copy_gbs",
        "ram_scale_gbs",
        "ram_add_gbs",
        "ram_triad_gbs",
        "disk_seq_read_mibs",
        "disk_seq_write_mibs",
        "disk_rand_read_iops",
    ):
        assert v[metric] is not None, metric
        assert v[metric] > 0, metric
    assert 0 < v["cpu_gemm_peak_fraction"] < 2
    assert report.inventory["cpu"]["threads"] >= 1
    assert report.inventory["ram"]["total_bytes"] > 0
    assert list(tmp_path.iterdir()) == []  # the fio file and its directory are gone
    assert report.errors == ()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_agent_without_gpu_says_not_run_no_gpu(tmp_path):
    report = run_agent(sys.executable, tmp_path, "gpu,allreduce")
    gpu = [m for m in report.measurements if m.metric.startswith("gpu_")]
    assert gpu
    assert all(m.value is None and m.not_run == "not run: no GPU" for m in gpu)


def test_agent_without_torch_names_the_frameworks_step(tmp_path):
    python3 = shutil.which("python3", path="/usr/bin")
    probe = subprocess.run([python3, "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip("system python3 has torch")
    report = run_agent(python3, tmp_path, "cpu,ram")
    v = {m.metric: m for m in report.measurements}
    assert v["cpu_gemm_gflops"].value is None
    assert "frameworks" in v["cpu_gemm_gflops"].not_run
    assert "frameworks" in v["ram_triad_gbs"].not_run


def test_agent_without_fio_names_the_base_step(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    env = {**os.environ, "PATH": str(bindir)}  # no fio on PATH
    data = tmp_path / "data"
    data.mkdir()
    report = run_agent(sys.executable, data, "disk", env)
    disk = [m for m in report.measurements if m.metric.startswith("disk_")]
    assert len(disk) == 3
    assert all(m.value is None and "fio missing" in m.not_run and "base" in m.not_run for m in disk)


def test_agent_with_missing_data_volume_says_so(tmp_path):
    report = run_agent(sys.executable, tmp_path / "nope", "disk")
    disk = [m for m in report.measurements if m.metric.startswith("disk_")]
    assert all("does not exist" in m.not_run or "fio missing" in m.not_run for m in disk)
