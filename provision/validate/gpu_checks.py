"""Verdicts on a GPU's state as NVML reports it: memory repairs, ECC mode, NVLink, MIG,
compute mode and other processes. Pure: GpuInfo in, Findings out.

The memory rules follow NVIDIA's "GPU Memory Error Management" guide (docs.nvidia.com/
deploy/a100-gpu-mem-error-mgmt, "Error Recovery and Response Flags") and NVML's
nvmlDeviceGetRemappedRows documentation:

- a row remapping *failure* means the GPU ran out of spare rows: RMA policy, fail;
- a *pending* remap is applied at the next GPU reset, and "a pending remapping won't affect
  future work on the GPU": warn, telling the operator to reset;
- the SRAM threshold flag says SRAM errors passed the threshold NVIDIA replaces a GPU at: fail;
- aggregate (lifetime) counts, remapped rows and retired pages are repairs already made
  (used or rented GPUs carry them): warn, never fail alone. The volatile uncorrectable count
  (since the driver loaded) is the current fault; judge.gpu_health holds it to a ceiling.

A check that has nothing to say about a GPU returns no finding, except NVLink on SKUs with
a link count in expectations.NVLINK_LINKS, which always reports its count.
"""

from __future__ import annotations

from collections.abc import Callable

from provision.validate.expectations import NVLINK_LINKS, find_sku
from provision.validate.records import Finding, GpuInfo

# Finding names (not metrics: nothing to set a floor on), one per check.
REMAP_FAILURE = "gpu_remap_failure"
REMAP_PENDING = "gpu_remap_pending"
PAGES_PENDING = "gpu_retired_pages_pending"
SRAM_THRESHOLD = "gpu_sram_threshold"
ECC_MODE = "gpu_ecc_mode"
ECC_HISTORY = "gpu_ecc_history"
NVLINK = "gpu_nvlink_up"
MIG = "gpu_mig"
COMPUTE_MODE = "gpu_compute_mode"
PROCESSES = "gpu_other_processes"

# What a check says about one GPU: (finding name, verdict, value, expectation, reason).
Answer = tuple[str, str, float | None, float | None, str]
Check = Callable[[GpuInfo], Answer | None]


def gpu_checks(node: str, gpus: list[GpuInfo]) -> list[Finding]:
    """Every check on every GPU; a check answers (name, verdict, value, expectation, reason)."""
    out = []
    for g in gpus:
        for check in _CHECKS:
            answer = check(g)
            if answer is not None:
                name, verdict, value, expectation, reason = answer
                out.append(Finding(node, name, f"gpu{g.index}", value, "", expectation, verdict, reason))
    return out


def _remap_failure(g: GpuInfo) -> Answer | None:
    if not g.remap_failure:
        return None
    why = "row remapping failed: the GPU is out of spare rows (NVIDIA's RMA policy for row remapping); replace it"
    return REMAP_FAILURE, "fail", 1.0, 0.0, why


def _remap_pending(g: GpuInfo) -> Answer | None:
    if not g.remap_pending:
        return None
    why = "a row remap is pending: reset the GPU (nvidia-smi -r -i N, or reboot) to apply it"
    return REMAP_PENDING, "warn", 1.0, 0.0, why


def _pages_pending(g: GpuInfo) -> Answer | None:
    if not g.retired_pages_pending:
        return None
    return PAGES_PENDING, "warn", 1.0, 0.0, "a page retirement is pending: reboot (or reset the GPU) to apply it"


def _sram_threshold(g: GpuInfo) -> Answer | None:
    if not g.sram_threshold_exceeded:
        return None
    why = "SRAM uncorrectable errors exceeded NVIDIA's threshold (nvidia-smi: SRAM Threshold Exceeded): replace the GPU"
    return SRAM_THRESHOLD, "fail", 1.0, 0.0, why


def _ecc_mode(g: GpuInfo) -> Answer | None:
    if g.ecc_mode != "disabled":
        return None
    pending = "; enabled after the next reboot" if g.ecc_mode_pending == "enabled" else ""
    why = f"ECC is disabled: memory errors go undetected (nvidia-smi -e 1, then reboot){pending}"
    return ECC_MODE, "warn", 0.0, 1.0, why


def _ecc_history(g: GpuInfo) -> Answer | None:
    parts = [
        (g.ecc_uncorrected, "uncorrectable ECC errors over its life (aggregate)"),
        (g.remapped_rows_uncorrectable, "rows remapped for uncorrectable errors"),
        (g.retired_pages, "pages retired"),
    ]
    seen = [f"{n} {what}" for n, what in parts if n]
    if not seen:
        return None
    why = "; ".join(seen) + ": repairs already made, not a current fault (the volatile count judges that)"
    return ECC_HISTORY, "warn", float(sum(n or 0 for n, _ in parts)), 0.0, why


def _nvlink(g: GpuInfo) -> Answer | None:
    spec = find_sku(g.name, g.pci_device_id)
    if spec is None or spec.key not in NVLINK_LINKS or g.mig_mode == "enabled":
        return None  # no count to hold it to; NVML hides NVLink state in MIG mode
    want, source = NVLINK_LINKS[spec.key]
    if g.nvlink_up is None:
        return (
            NVLINK,
            "warn",
            None,
            float(want),
            f"NVML reports no NVLink state; {spec.key} has {want} links ({source})",
        )
    verdict = "fail" if g.nvlink_up < want else "pass"
    why = f"{g.nvlink_up} of {want} NVLink links up ({source})"
    return NVLINK, verdict, float(g.nvlink_up), float(want), why + ("; a link is down" if verdict == "fail" else "")


def _mig(g: GpuInfo) -> Answer | None:
    if g.mig_mode != "enabled" and g.mig_mode_pending != "enabled":
        return None
    sizes = ", ".join(f"{d.memory_mib} MiB" for d in g.mig_devices) or "none created"
    if g.mig_mode != "enabled":
        return MIG, "warn", 0.0, None, "MIG is enabled after the next GPU reset: benchmarks measured the whole GPU"
    why = f"MIG is enabled ({len(g.mig_devices)} MIG devices: {sizes}): not benchmarked as a whole GPU"
    return MIG, "warn", float(len(g.mig_devices)), None, why


def _compute_mode(g: GpuInfo) -> Answer | None:
    if g.compute_mode == "prohibited":
        return (
            COMPUTE_MODE,
            "fail",
            None,
            None,
            "compute mode Prohibited: no process may use this GPU (nvidia-smi -c 0)",
        )
    if g.compute_mode in ("exclusive_process", "exclusive_thread"):
        why = (
            f"compute mode {g.compute_mode}: one process per GPU; the in-node all-reduce and a second job "
            "cannot open it (nvidia-smi -c 0 sets Default)"
        )
        return COMPUTE_MODE, "warn", None, None, why
    return None


def _processes(g: GpuInfo) -> Answer | None:
    if not g.processes:
        return None
    named = ", ".join(
        f"pid {p.pid} ({p.name}" + (f", {p.used_mib} MiB)" if p.used_mib is not None else ")") for p in g.processes
    )
    why = f"in use by another process: {named}; its measurements may be low, and a job would share the GPU"
    return PROCESSES, "warn", float(len(g.processes)), 0.0, why


_CHECKS: tuple[Check, ...] = (
    _remap_failure,
    _remap_pending,
    _pages_pending,
    _sram_threshold,
    _ecc_mode,
    _ecc_history,
    _nvlink,
    _mig,
    _compute_mode,
    _processes,
)
