"""What each GPU SKU should deliver, and what fraction of it a healthy node achieves.

Spec numbers are DENSE (no 2:4 sparsity) peak figures from NVIDIA's datasheets; the
source is named beside every entry. A healthy GPU reaches a known fraction of its peak in
a GEMM or a copy (mamf-finder style measurements land at 0.75-0.9 for bf16), so the floor
a GPU is held to is ``spec x fraction``. Users override floors and fractions per group
(setting ``validate_expect``) or per run (``--expect FILE``); see ``Overrides``.

Non-GPU metrics have no datasheet: they are judged against the fleet (judge.py) and any
floor the user gives.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provision import controller_files
from provision.errors import InputError, Problem
from provision.metrics import METRICS, parse_flat_keys


@dataclass(frozen=True)
class FleetRule:
    """How far below the fleet median a node may fall (see judge._fleet_check)."""

    warn_drop: float = 0.10  # warn when > 10% below the median and outside the MAD band
    fail_drop: float = 0.25  # fail when > 25% below the median and outside the MAD band
    mad_k: float = 3.0  # band half-width in scaled MADs (1.4826 x MAD ~ one sigma)


@dataclass(frozen=True)
class Overrides:
    """User thresholds: absolute floors, fractions of spec and counter ceilings."""

    floors: dict[str, float] = field(default_factory=dict)  # metric -> minimum value
    fractions: dict[str, float] = field(default_factory=dict)  # metric -> share of spec
    ceilings: dict[str, float] = field(default_factory=dict)  # counter metric -> maximum
    fleet: FleetRule | None = None  # outlier rule for every metric; None: per-group defaults

    def fraction(self, metric: str) -> float | None:
        return self.fractions.get(metric, DEFAULT_FRACTIONS.get(metric))

    def floor(self, metric: str) -> float | None:
        return self.floors.get(metric, DEFAULT_FLOORS.get(metric))

    def ceiling(self, metric: str) -> float | None:
        return self.ceilings.get(metric, DEFAULT_CEILINGS.get(metric))

    def fleet_rule(self, metric: str) -> FleetRule:
        if self.fleet is not None:
            return self.fleet
        return GROUP_FLEET_RULES.get(METRICS[metric].group, FleetRule())

    def merged(self, other: Overrides) -> Overrides:
        """``other`` wins key by key (a --expect file over the settings)."""
        return Overrides(
            {**self.floors, **other.floors},
            {**self.fractions, **other.fractions},
            {**self.ceilings, **other.ceilings},
            other.fleet if other.fleet is not None else self.fleet,
        )


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures of one GPU SKU (dense, per GPU)."""

    key: str  # short SKU name used in reports, e.g. "H100-SXM"
    device_ids: tuple[int, ...]  # PCI device ids (vendor 0x10de) of this SKU
    name_hints: tuple[str, ...]  # substrings of the NVML product name, lower case
    bf16_tflops: float  # dense BF16 tensor-core peak
    fp16_tflops: float  # dense FP16 tensor-core peak
    tf32_tflops: float  # dense TF32 tensor-core peak
    fp32_tflops: float  # FP32 (CUDA cores, no tensor cores) peak
    hbm_gbs: float  # memory bandwidth, GB/s
    pcie_gen: int | None  # host link generation; None: no PCIe host link (NVLink-C2C)
    pcie_width: int | None  # host link lanes
    source: str  # where the numbers come from

    def spec(self, metric: str) -> float | None:
        """The datasheet figure a metric is compared with, if the datasheet has one."""
        return {
            "gpu_bf16_tflops": self.bf16_tflops,
            "gpu_fp16_tflops": self.fp16_tflops,
            "gpu_tf32_tflops": self.tf32_tflops,
            "gpu_fp32_tflops": self.fp32_tflops,
            "gpu_hbm_gbs": self.hbm_gbs,
            "gpu_h2d_gbs": pcie_gbs(self.pcie_gen, self.pcie_width),
            "gpu_d2h_gbs": pcie_gbs(self.pcie_gen, self.pcie_width),
        }.get(metric)


# The datasheets' "with sparsity" figures are twice the dense ones; the dense ones are used.
GPU_SPECS: tuple[GpuSpec, ...] = (
    # NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4):
    # TF32 156, BF16/FP16 312, FP32 19.5 TFLOPS; A100 40GB SXM 1,555 GB/s; PCIe Gen4 x16.
    GpuSpec(
        "A100-SXM4-40GB",
        (0x20B0,),
        ("a100-sxm4-40gb",),
        312,
        312,
        156,
        19.5,
        1555,
        4,
        16,
        "NVIDIA A100 datasheet r4, SXM 40GB",
    ),
    # Same datasheet: A100 80GB SXM 2,039 GB/s.
    GpuSpec(
        "A100-SXM4-80GB",
        (0x20B2, 0x20B3),
        ("a100-sxm4-80gb", "a100-sxm-80gb"),
        312,
        312,
        156,
        19.5,
        2039,
        4,
        16,
        "NVIDIA A100 datasheet r4, SXM 80GB",
    ),
    # Same datasheet: A100 40GB PCIe 1,555 GB/s (same tensor peaks at 250 W).
    GpuSpec(
        "A100-PCIE-40GB",
        (0x20F1,),
        ("a100-pcie-40gb",),
        312,
        312,
        156,
        19.5,
        1555,
        4,
        16,
        "NVIDIA A100 datasheet r4, PCIe 40GB",
    ),
    # Same datasheet: A100 80GB PCIe 1,935 GB/s.
    GpuSpec(
        "A100-PCIE-80GB",
        (0x20B5,),
        ("a100 80gb pcie", "a100-pcie-80gb"),
        312,
        312,
        156,
        19.5,
        1935,
        4,
        16,
        "NVIDIA A100 datasheet r4, PCIe 80GB",
    ),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): FP32 67, TF32 989 sparse
    # (494.5 dense), BF16/FP16 1,979 sparse (989.5 dense) TFLOPS, 3.35 TB/s, PCIe Gen5 x16.
    GpuSpec(
        "H100-SXM",
        (0x2330,),
        ("h100 80gb hbm3", "h100-sxm"),
        989.5,
        989.5,
        494.5,
        67,
        3350,
        5,
        16,
        "NVIDIA H100 datasheet, SXM column",
    ),
    # Same datasheet, H100 PCIe column: FP32 51, TF32 756 sparse (378 dense), BF16/FP16
    # 1,513 sparse (756.5 dense), 2 TB/s (80GB HBM2e), PCIe Gen5 x16.
    GpuSpec(
        "H100-PCIE", (0x2331,), ("h100 pcie",), 756.5, 756.5, 378, 51, 2000, 5, 16, "NVIDIA H100 datasheet, PCIe column"
    ),
    # Same datasheet, H100 NVL column (per GPU): FP32 60, TF32 835 sparse, BF16/FP16 1,671
    # sparse, 3.9 TB/s, PCIe Gen5 x16.
    GpuSpec(
        "H100-NVL", (0x2321,), ("h100 nvl",), 835.5, 835.5, 417.5, 60, 3900, 5, 16, "NVIDIA H100 datasheet, NVL column"
    ),
    # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column: FP32 67, TF32 989 sparse,
    # BF16/FP16 1,979 sparse, 141 GB HBM3e at 4.8 TB/s, PCIe Gen5 x16 (128 GB/s).
    GpuSpec(
        "H200-SXM", (0x2335,), ("h200",), 989.5, 989.5, 494.5, 67, 4800, 5, 16, "NVIDIA H200 datasheet, SXM column"
    ),
    # Same datasheet, H200 NVL column: FP32 60, TF32 835 sparse, BF16/FP16 1,671 sparse, 4.8 TB/s.
    GpuSpec(
        "H200-NVL", (0x233B,), ("h200 nvl",), 835.5, 835.5, 417.5, 60, 4800, 5, 16, "NVIDIA H200 datasheet, NVL column"
    ),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 183 (366 sparse), BF16/FP16 362.05 (733
    # sparse) TFLOPS, 48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16.
    GpuSpec("L40S", (0x26B9,), ("l40s",), 362.05, 362.05, 183, 91.6, 864, 4, 16, "NVIDIA L40S datasheet"),
    # NVIDIA HGX B200 datasheet (8 GPUs): FP16/BF16 36 PFLOPS sparse, TF32 18 PFLOPS sparse,
    # FP32 600 TFLOPS, 64 TB/s HBM3e -> per GPU dense 2,250 / 1,125 / 75 TFLOPS, 8 TB/s.
    # Host link PCIe Gen5 x16 per the HGX platform; TODO: confirm on a B200 capture.
    GpuSpec("B200", (0x2901,), ("b200",), 2250, 2250, 1125, 75, 8000, 5, 16, "NVIDIA HGX B200 datasheet, divided by 8"),
    # NVIDIA GH200 Grace Hopper Superchip datasheet: H100 compute (FP32 67, TF32 494.5
    # dense, BF16/FP16 989.5 dense), 96 GB HBM3 at 4 TB/s. The CPU link is NVLink-C2C
    # (900 GB/s), not PCIe, so no PCIe expectation.
    GpuSpec(
        "GH200-96GB",
        (0x2342,),
        ("gh200",),
        989.5,
        989.5,
        494.5,
        67,
        4000,
        None,
        None,
        "NVIDIA GH200 datasheet, 96GB HBM3",
    ),
    # Same datasheet, 144 GB HBM3e variant: 4.9 TB/s.
    GpuSpec(
        "GH200-144GB",
        (0x2348,),
        ("gh200 144g",),
        989.5,
        989.5,
        494.5,
        67,
        4900,
        None,
        None,
        "NVIDIA GH200 datasheet, 144GB HBM3e",
    ),
)

# NVLink links a GPU of the SKU has, with the source; only these SKUs are judged on links
# up. PCIe boards (H100 NVL, H200 NVL, A100 PCIe, L40S) have none or bridge-dependent links.
NVLINK_LINKS: dict[str, tuple[int, str]] = {
    "A100-SXM4-40GB": (12, "NVIDIA A100 datasheet r4: 3rd-gen NVLink, 12 links x 50 GB/s = 600 GB/s"),
    "A100-SXM4-80GB": (12, "NVIDIA A100 datasheet r4: 3rd-gen NVLink, 12 links x 50 GB/s = 600 GB/s"),
    "H100-SXM": (18, "NVIDIA H100 datasheet, SXM: 4th-gen NVLink 900 GB/s = 18 links x 50 GB/s"),
    "H200-SXM": (18, "NVIDIA H200 datasheet, SXM: NVLink 900 GB/s = 18 links x 50 GB/s"),
    "B200": (18, "NVIDIA HGX B200 datasheet: 5th-gen NVLink 1.8 TB/s per GPU = 18 links x 100 GB/s"),
}

# Share of the datasheet figure a healthy GPU reaches. bf16/fp16: the agent measures them
# at the power-capped steady state (after a pre-heat, agent._gemm), which is below what
# mamf-finder's short bursts report (H100 SXM ~0.8 of dense peak). Measured on lent H200
# SXMs (BENCHMARKS.md, device check, three runs): 793 TFLOP/s for about a second from cold
# (0.80), then 586-722 at the 700 W cap (0.59-0.73). At the old 0.70 floor one healthy GPU
# failed fp16 in one run of three. 0.50 leaves the lowest steady state seen a 15 % margin; a
# GPU slow against its peers is the fleet check's to find. fp32 without tensor cores and
# tf32 reach less; a device-to-device copy reaches ~0.85-0.9 of HBM peak (the H200s:
# 4064-4198 of 4800 GB/s); pinned host copies ~0.8 of the PCIe line rate (55 of 63 GB/s).
DEFAULT_FRACTIONS: dict[str, float] = {
    "gpu_bf16_tflops": 0.50,
    "gpu_fp16_tflops": 0.50,
    "gpu_tf32_tflops": 0.55,
    "gpu_fp32_tflops": 0.60,
    "gpu_hbm_gbs": 0.75,
    "gpu_h2d_gbs": 0.65,
    "gpu_d2h_gbs": 0.65,
}

# Ceilings for health counters: more than this is a fail. gpu_ecc_uncorrected is the volatile
# count (since the driver loaded): NVIDIA's "GPU Memory Error Management" guide treats an
# uncorrectable error as a current fault, while the aggregate (lifetime) counts, remapped
# rows and retired pages are repairs the GPU already made; those warn (gpu_checks.py).
DEFAULT_CEILINGS: dict[str, float] = {
    "gpu_ecc_uncorrected": 0,
    "gpu_burn_mismatches": 0,
    # Hardware slowdown (thermal, power brake, HW slowdown) active: DCGM treats it as a fault.
    "gpu_hw_slowdown": 0,
}

# Floors that hold on any hardware, so that a single node is still judged.
DEFAULT_FLOORS: dict[str, float] = {
    # torch's CPU GEMM reaches 0.5-0.9 of the ISA peak on an idle machine; below 0.2 the
    # cores are throttled, oversubscribed or the BLAS lacks the ISA.
    "cpu_gemm_peak_fraction": 0.2,
    # The burn's last window against its first: a GPU that heats up or power-brakes under
    # sustained load slows down as the burn goes on; a healthy one holds within a few %.
    "gpu_burn_throughput_ratio": 0.85,
}

# PCIe payload rate of an x16 link per generation, GB/s per direction (PCI-SIG line rate
# after 128b/130b encoding: Gen3 8 GT/s, Gen4 16, Gen5 32, Gen6 64 PAM4 with FLIT).
_PCIE_X16_GBS = {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}


def pcie_gbs(gen: int | None, width: int | None) -> float | None:
    """Line rate of a PCIe link in GB/s per direction."""
    if gen is None or width is None or gen not in _PCIE_X16_GBS:
        return None
    return _PCIE_X16_GBS[gen] * width / 16


def find_sku(name: str, pci_device_id: int | None) -> GpuSpec | None:
    """The spec for a GPU: by PCI device id first (exact), then by product name."""
    if pci_device_id is not None:
        for spec in GPU_SPECS:
            if pci_device_id in spec.device_ids:
                return spec
    lowered = name.lower()
    # Longest hint first, so "h200 nvl" wins over "h200" and "gh200 144g" over "gh200".
    by_hint = sorted(((h, s) for s in GPU_SPECS for h in s.name_hints), key=lambda p: -len(p[0]))
    for hint, spec in by_hint:
        if hint in lowered:
            return spec
    return None


# Links, disks and collectives vary more run to run than compute and memory do (shared
# switches, SSD garbage collection, TCP), so their fleet rule is wider by default.
GROUP_FLEET_RULES: dict[str, FleetRule] = {
    "net": FleetRule(0.20, 0.50),
    "disk": FleetRule(0.20, 0.50),
    "allreduce": FleetRule(0.20, 0.50),
}


EXPECT_MAX_BYTES = 2**20  # a flat object of thresholds: a few hundred bytes


def load_expect_file(path: str | Path) -> Overrides:
    """Read an --expect file: a JSON object of flat keys (same form as validate_expect).

    Example: {"disk_seq_read_mibs": 2000, "gpu_bf16_tflops.fraction": 0.8, "fleet.warn_drop": 0.05}
    """
    p = Path(path)
    try:
        data = json.loads(controller_files.read_small_text(p, EXPECT_MAX_BYTES))
    except controller_files.Unreadable as e:
        raise InputError(Problem(str(p), f"cannot read expect file: {e}")) from None
    except json.JSONDecodeError as e:
        raise InputError(
            Problem(f"{p}:{e.lineno}", f"not valid JSON: {e.msg}", 'write an object, e.g. {"disk_seq_read_mibs": 2000}')
        ) from None
    if not isinstance(data, dict):
        raise InputError(Problem(str(p), "expect file must hold a JSON object of metric: number"))
    return parse_flat(data, str(p))


def parse_flat(values: dict[str, Any], where: str) -> Overrides:
    """Overrides from flat keys, the form of the ``validate_expect`` setting (the grammar:
    provision.metrics.parse_flat_keys). A threshold is a finite number: every comparison
    with NaN is false, so a NaN floor or fail_drop would pass any node (JSON's NaN and
    Infinity, and 1e999, all parse)."""
    odd = [k for k, x in values.items() if isinstance(x, float) and not math.isfinite(x)]
    if odd:
        raise InputError([Problem(f"{where}: {k}", f"{values[k]!r} is not a finite number") for k in odd])
    keys = parse_flat_keys(values, where)
    drops = keys.fleet.get("warn_drop", FleetRule.warn_drop), keys.fleet.get("fail_drop", FleetRule.fail_drop)
    if drops[0] > drops[1]:
        raise InputError(
            Problem(
                f"{where}: fleet.warn_drop",
                f"{drops[0]:g} is above fleet.fail_drop {drops[1]:g}: a node would fail before it is ever warned of",
                "keep warn_drop at or below fail_drop",
            )
        )
    fleet = replace(FleetRule(), **keys.fleet) if keys.fleet else None
    return Overrides(keys.floors, keys.fractions, keys.ceilings, fleet)
