"""Typed records that flow from the agent to the judge to the reports."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Verdict = Literal["pass", "warn", "fail", "not_run"]

# Severity order for "the worst verdict wins". not_run ranks with warn when it counts
# (judge.node_verdict decides when), so it never reads as a pass.
SEVERITY: dict[str, int] = {"pass": 0, "not_run": 1, "warn": 2, "fail": 3}


@dataclass(frozen=True)
class Measurement:
    """One value measured on one node (and one GPU, for per-GPU metrics)."""

    node: str  # inventory name
    metric: str  # key in metrics.METRICS
    value: float | None  # None when the benchmark did not run
    device: str = ""  # "gpu0".. for per-GPU metrics; "" for the node
    not_run: str = ""  # why value is None: "not run: no GPU", "fio missing (run `up` step base)"
    detail: str = ""  # extra context (shape that won, pair partners, ...)
    note: str = ""  # said in the reason whatever the verdict: the figure a re-measure replaced


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a slice of a GPU) as NVML lists it."""

    index: int  # MIG device index on its GPU
    gpu_instance_id: int | None  # GPU instance id
    memory_mib: int | None  # its share of the framebuffer
    uuid: str = ""  # MIG-... (what CUDA_VISIBLE_DEVICES takes)


@dataclass(frozen=True)
class GpuProcess:
    """A compute process found on a GPU (not the validation agent itself)."""

    pid: int  # process id on the node
    name: str  # process name, from NVML or /proc
    used_mib: int | None  # GPU memory it holds


@dataclass(frozen=True)
class GpuInfo:
    """Inventory and health of one GPU, from NVML or `nvidia-smi -q`."""

    index: int  # CUDA/NVML index
    name: str  # product name, e.g. "NVIDIA H100 80GB HBM3"
    pci_device_id: int | None  # PCI device id, e.g. 0x2330 (vendor part dropped)
    memory_mib: int | None  # framebuffer size
    driver_version: str | None  # e.g. "565.57.01"
    cuda_version: str | None  # e.g. "12.7"
    pcie_gen_current: int | None  # link generation now (drops when idle)
    pcie_gen_max: int | None  # best generation the GPU and slot agree on
    pcie_gen_device_max: int | None  # best generation the GPU supports
    pcie_width_current: int | None  # lanes now
    pcie_width_max: int | None  # lanes the link can have
    ecc_uncorrected: int | None  # aggregate (lifetime) uncorrectable ECC errors (DRAM+SRAM); None: N/A
    ecc_corrected: int | None  # aggregate (lifetime) correctable ECC errors
    retired_pages: int | None  # pages retired (pre-Ampere page retirement); None: N/A
    remap_failure: bool | None  # row remapping failed: the GPU is out of spare rows
    remap_pending: bool | None  # a remap waits for a GPU reset
    throttle_active: tuple[str, ...] = ()  # active clock event reasons other than idle
    persistence_mode: bool | None = None  # persistence mode enabled
    bus_id: str = ""  # PCI bus id
    numa_node: int | None = None  # NUMA node the GPU hangs off, when known
    clocks_mhz: dict[str, int | None] | None = None  # {"sm": now, "sm_max": its maximum}
    nvlink_up: int | None = None  # NVLink links up; None where the GPU has none
    nvlink_links: int | None = None  # NVLink links NVML reports on the GPU
    ecc_mode: str | None = None  # "enabled" or "disabled"; None: the GPU has no ECC
    ecc_mode_pending: str | None = None  # the ECC mode after the next reboot
    ecc_uncorrected_volatile: int | None = None  # uncorrectable ECC errors since the driver loaded
    ecc_corrected_volatile: int | None = None  # correctable ECC errors since the driver loaded
    remapped_rows_correctable: int | None = None  # rows remapped for correctable errors (Ampere+)
    remapped_rows_uncorrectable: int | None = None  # rows remapped for uncorrectable errors (Ampere+)
    retired_pages_pending: bool | None = None  # a page retirement waits for a reboot
    sram_threshold_exceeded: bool | None = None  # SRAM errors past NVIDIA's replacement threshold
    mig_mode: str | None = None  # "enabled" or "disabled"; None: not MIG capable
    mig_mode_pending: str | None = None  # the MIG mode after the next GPU reset
    mig_devices: tuple[MigDevice, ...] = ()  # MIG devices that exist
    compute_mode: str | None = None  # "default", "exclusive_process", "prohibited"
    processes: tuple[GpuProcess, ...] | None = None  # other compute processes; None: unknown


@dataclass(frozen=True)
class Finding:
    """The judge's verdict on one metric of one node (or one GPU of it)."""

    node: str  # inventory name
    metric: str  # key in metrics.METRICS
    device: str  # "" for node level, "gpu3" for a GPU
    value: float | None  # measured value; None when not run
    unit: str  # unit of value and expectation
    expectation: float | None  # the floor (or ceiling for counts) it was held to
    verdict: str  # one of Verdict
    reason: str  # why, in words: "312 >= 0.75 x 312 (A100 spec)", "not run: no GPU"


@dataclass
class NodeResult:
    """Everything validate learned about one node."""

    node: str  # inventory name
    verdict: str = "pass"  # worst of its findings (see judge.node_verdict)
    findings: list[Finding] = field(default_factory=list)  # one per metric (and GPU)
    sku: str = ""  # GPU SKU key from expectations, "unknown SKU: <name>", or "" without GPUs
    inventory: dict[str, Any] = field(default_factory=dict[str, Any])  # CPU/RAM/NIC/GPU inventory from the agent
    errors: list[str] = field(default_factory=list)  # why parts of the node could not be measured
