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
    assert len(table) == 12
    assert all(line.endswith("MISS") for line in table[1:])
    assert "== quick" not in p.stdout  # no GPU step after the check that found none
