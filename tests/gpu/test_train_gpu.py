"""The reference trainer on a real CUDA GPU: bf16 autocast, MFU, torch.compile, NCCL
(marker gpu; skipped without CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from provision.resources import training_script

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

TIMEOUT_S = 600
BASE = ["--data-max-mb", "4", "--eval-interval", "10", "--eval-samples", "64"]


def run(args: list[str], cwd, launcher: list[str] | None = None) -> dict:
    summary = cwd / "summary.json"
    cmd = [
        *(launcher or [sys.executable]),
        str(training_script()),
        *BASE,
        *args,
        "--ckpt-dir",
        str(cwd),
        "--data-cache",
        str(cwd / "data"),
        "--summary",
        str(summary),
    ]
    proc = subprocess.run(
        cmd, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, env={**os.environ, "OMP_NUM_THREADS": "4"}
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(summary.read_text())


def test_trains_on_cuda_in_bf16_and_reports_mfu(tmp_path):
    s = run(["--model", "medium", "--steps", "30", "--global-batch", "32", "--micro-batch", "16"], tmp_path)
    assert s["device"] == "cuda"
    assert s["final_val_loss"] < 5.0  # it learned: an untrained byte model scores ln(256) = 5.55
    name = torch.cuda.get_device_name(0)
    if any(k in name for k in ("H100", "H200", "A100", "L40S")):  # a peak is known for it
        assert s["mfu"] is not None
        assert 0.0 < s["mfu"] < 1.0
    print(f"\n{name}: {s['tokens_per_s']:.0f} tok/s, MFU {s['mfu']}")


def test_compiled_model_trains_like_the_eager_one(tmp_path):
    (tmp_path / "eager").mkdir()
    (tmp_path / "compiled").mkdir()
    args = ["--model", "small", "--steps", "20", "--global-batch", "32", "--micro-batch", "32"]
    eager = run(args, tmp_path / "eager")
    compiled = run([*args, "--compile"], tmp_path / "compiled")
    # bf16 and different kernels: not bit-equal, but the same training within a few %.
    assert compiled["final_val_loss"] == pytest.approx(eager["final_val_loss"], rel=0.05)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for NCCL")
def test_two_gpus_with_nccl_match_one_gpu_closely(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    args = ["--model", "small", "--steps", "10", "--global-batch", "16", "--micro-batch", "8"]
    one = run(args, tmp_path / "one")
    two = run(
        args, tmp_path / "two", [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    )
    assert two["world_size"] == 2
    for (_, a), (_, b) in zip(one["train_losses"], two["train_losses"], strict=True):
        assert b == pytest.approx(a, abs=2e-2)  # bf16 autocast: agreement to ~1e-2
