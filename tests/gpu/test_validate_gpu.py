"""The agent's GPU benchmarks on a real CUDA GPU (marker gpu; skipped without CUDA)."""

from __future__ import annotations

import pytest

from provision.validate import agent
from provision.validate.expectations import find_sku
from provision.validate.parsers import gpu_from_nvml

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)


def test_gpu_benchmarks_give_a_value_for_every_gpu_and_metric():
    gpus, _, _ = agent.gpu_inventory()
    res = agent.Results()
    # Short budgets and burn: the device check runs this file within 100 s.
    budgets = {**agent.BUDGETS_S["quick"], "gemm": 16, "hbm": 4, "burn": 12, "copies": 6}
    cfg = {**agent.MODES["quick"], "burn_s": 6}
    for group in agent.gpu_phases(torch, cfg, budgets, gpus):
        agent.run_phases(group, res)
    assert res.errors == []
    for i in range(torch.cuda.device_count()):
        got = {r["metric"]: r["value"] for r in res.rows if r["device"] == f"gpu{i}"}
        for metric in (
            "gpu_bf16_tflops",
            "gpu_fp16_tflops",
            "gpu_tf32_tflops",
            "gpu_fp32_tflops",
            "gpu_hbm_gbs",
            "gpu_h2d_gbs",
            "gpu_d2h_gbs",
        ):
            assert got[metric], metric
            assert got[metric] > 0, metric
        assert got["gpu_burn_mismatches"] == 0
        assert got["gpu_burn_throughput_ratio"] > 0.5  # a real GPU over a 6 s burn
        # tensor cores beat CUDA cores on any datacenter GPU
        assert got["gpu_bf16_tflops"] > got["gpu_fp32_tflops"]


def test_nvml_inventory_names_a_known_sku():
    gpus, _, why = agent.gpu_inventory()
    assert gpus, why
    info = gpu_from_nvml(gpus[0])
    assert info.pci_device_id
    assert info.pcie_gen_max
    assert find_sku(info.name, info.pci_device_id) is not None, info.name
