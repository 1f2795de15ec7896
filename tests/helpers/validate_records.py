"""Validator records shared by the validate tests: a healthy H100 as NVML would describe it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from provision.validate import judge
from provision.validate.records import GpuInfo, Measurement, NodeResult


def h100(index: int, **changes: Any) -> GpuInfo:
    """An H100 80GB HBM3 (SXM) at full PCIe Gen5 x16 with ECC on and clean, all 18 NVLink links
    up, no MIG and no other process; ``changes`` override fields."""
    fields: dict[str, Any] = dict(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        pci_device_id=0x2330,
        memory_mib=81559,
        driver_version="565.57.01",
        cuda_version="12.7",
        pcie_gen_current=5,
        pcie_gen_max=5,
        pcie_gen_device_max=5,
        pcie_width_current=16,
        pcie_width_max=16,
        ecc_uncorrected=0,
        ecc_corrected=0,
        retired_pages=0,
        remap_failure=False,
        remap_pending=False,
        nvlink_up=18,
        nvlink_links=18,
        ecc_mode="enabled",
        ecc_uncorrected_volatile=0,
        ecc_corrected_volatile=0,
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=0,
        mig_mode="disabled",
        compute_mode="default",
        processes=(),
    )
    return GpuInfo(**(fields | changes))


def h100_fleet(nodes: int, slow: tuple[int, int] = (7, 3)) -> list[NodeResult]:
    """`nodes` judged 8-GPU H100 nodes (named node00, node01...) measuring bf16 near the
    datasheet; node `slow[0]`'s GPU `slow[1]` at 60 %, the one failure. Each node's GPU
    inventory is passed on as the controller does."""
    inputs = []
    for i in range(nodes):
        name = f"node{i:02d}"
        ms = [
            Measurement(name, "gpu_bf16_tflops", 750.0 * (0.6 if (i, g) == slow else 1.0 + 0.001 * g), f"gpu{g}")
            for g in range(8)
        ]
        gpus = [h100(g) for g in range(8)]
        inputs.append(judge.NodeInput(name, ms, gpus, wants_gpu=True, inventory={"gpus": [asdict(g) for g in gpus]}))
    return judge.judge(inputs)
