"""benchmarks/gpu_check.sh on a machine without a CUDA GPU: it stops at its first GPU step
with a clear reason, prints the table of figures (every one a MISS) and exits 1, fast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU: the device check would run")
def test_device_check_without_cuda_stops_at_the_first_gpu_step_and_prints_every_figure_as_a_miss(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    p = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], capture_output=True, text=True, timeout=180, env=env
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "no CUDA GPU: torch.cuda.is_available() is False" in p.stdout
    assert "device check stopped: this machine has no usable CUDA GPU" in p.stdout
    table = p.stdout.split("== figures\n", 1)[1].splitlines()
    assert table[0].split() == ["figure", "value", "target", "result"]
    assert len(table) == 13
    assert all(line.endswith("MISS") for line in table[1:])
    assert "== quick" not in p.stdout  # no GPU step after the check that found none


# The GPU machine's image (the device README's package list) has torch, pytest and
# nvidia-ml-py, but not pyinfra, paramiko, fabric or gevent: the device check's Python
# steps must not need them. A sitecustomize stops their import, as their absence would.
NOT_ON_THE_GPU_IMAGE = ("pyinfra", "pyinfra_cli", "paramiko", "fabric", "invoke", "gevent")
_BLOCKER = f"""
import sys

class _NotOnTheGpuImage:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_ON_THE_GPU_IMAGE!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU image)")
        return None

sys.meta_path.insert(0, _NotOnTheGpuImage())
"""


def test_the_device_checks_python_steps_run_without_pyinfra_paramiko_or_gevent(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}", "PROVISION_GPU_CHECK": "1"}
    run = dict(capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    # The blocker works: pyinfra is installed here, and cannot be imported.
    blocked = subprocess.run([sys.executable, "-c", "import pyinfra"], **run)
    assert "not on the GPU image" in blocked.stderr
    # gpu_check.sh's steps: the names test, the gpu tier (skipped here: no CUDA, but
    # collected, so every import ran), and the names scan.
    names = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_nvml_names.py"], **run
    )
    assert names.returncode == 0, names.stdout + names.stderr
    gpu = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/gpu"], **run
    )
    # Exit 5: each module skipped itself at import (no CUDA), after its imports ran.
    assert gpu.returncode == 5, gpu.stdout + gpu.stderr
    assert "2 skipped" in gpu.stdout
    assert "error" not in gpu.stdout.lower()
    scan = subprocess.run([sys.executable, "benchmarks/gpu_figures.py", "names", str(tmp_path)], **run)
    assert scan.returncode == 0, scan.stdout + scan.stderr
    assert "missing from pynvml: none" in scan.stdout


def test_without_the_gpu_check_flag_a_missing_pyinfra_is_an_error_not_a_silent_skip(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_BLOCKER)
    env = {k: v for k, v in os.environ.items() if k != "PROVISION_GPU_CHECK"}
    env["PYTHONPATH"] = f"{tmp_path}:{ROOT}"
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_nvml_names.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode != 0
    assert "pyinfra_cli" in p.stdout + p.stderr
