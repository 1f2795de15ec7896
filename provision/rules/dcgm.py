"""DCGM's fields in provision's GPU vocabulary.

On hosts that run DCGM (see provision.rules.monitoring.uses_dcgm) the GPU series come from
NVIDIA's dcgm-exporter, named for DCGM's fields (``DCGM_FI_DEV_GPU_TEMP``, in DCGM's
units: MiB, MHz, percent). Everything else that reads GPU series (the alert rules, the
dashboards, ``provision monitor``) reads provision's names (``provision_gpu_*``, the NVML
collector's). This table is the one place that joins the two:

- ``counters_csv()`` is the exporter's field list (its ``-f`` file): exactly the fields
  the table needs, so a field the rules read is never left out of what is collected;
- ``recording_rules()`` is a Prometheus rule group, loaded on the head, that records each
  provision series from its DCGM fields, with DCGM's ``UUID`` label also as ``uuid``.

Xid: DCGM reports the last Xid code per GPU (``DCGM_FI_DEV_XID_ERRORS``), not a count per
code, so it is collected under its own name and not recorded as ``provision_gpu_xid_events``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class Field:
    """One DCGM field as the exporter's CSV names it."""

    name: str  # DCGM_FI_...
    kind: str  # gauge or counter, as dcgm-exporter's CSV says
    help: str


FIELDS: tuple[Field, ...] = (
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Current clock event reasons (bitmask)."),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."),
    Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."),
    Field("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe current link generation."),
    Field("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe current link width."),
    Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter", "NVLink flow-control CRC errors."),
    Field("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "NVLink data CRC errors."),
    Field("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "NVLink retries."),
    Field("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "NVLink recovery errors."),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
)

NVLINK_ERRORS = " + ".join(f.name for f in FIELDS if f.name.startswith("DCGM_FI_DEV_NVLINK_"))

# provision series <- PromQL over DCGM's fields (same GPU, same labels: plain arithmetic).
RECORDS: dict[str, str] = {
    "provision_gpu_utilization_ratio": "DCGM_FI_DEV_GPU_UTIL / 100",
    "provision_gpu_memory_utilization_ratio": "DCGM_FI_DEV_MEM_COPY_UTIL / 100",
    "provision_gpu_memory_used_bytes": f"DCGM_FI_DEV_FB_USED * {MIB}",
    "provision_gpu_memory_total_bytes": (
        f"(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED) * {MIB}"
    ),
    "provision_gpu_temperature_celsius": "DCGM_FI_DEV_GPU_TEMP",
    "provision_gpu_power_watts": "DCGM_FI_DEV_POWER_USAGE",
    "provision_gpu_sm_clock_hertz": "DCGM_FI_DEV_SM_CLOCK * 1e6",
    "provision_gpu_clock_event_reasons": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "provision_gpu_ecc_volatile_uncorrected_errors": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "provision_gpu_ecc_volatile_corrected_errors": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "provision_gpu_pcie_link_generation": "DCGM_FI_DEV_PCIE_LINK_GEN",
    "provision_gpu_pcie_link_width": "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "provision_gpu_nvlink_errors": NVLINK_ERRORS,
}

# NVML answers through DCGM: 1 while the node's exporter is scraped and reports GPU
# fields, 0 while it does not answer or reports none (the host engine or the driver lost).
# Per node, as the NVML collector's series is; and like it, absent while the whole node is
# down (NodeDown says that; a node rebooting is not a lost GPU).
NVML_UP = (
    "(count by (job, instance, node) (DCGM_FI_DEV_GPU_TEMP) > bool 0) or on (node) "
    '(0 * (up{job="dcgm"} unless on (node) (up{job="node"} == 0)))'
)

GROUP = "provision-dcgm"


def counters_csv() -> str:
    """dcgm-exporter's ``-f`` file: one ``field, type, help`` line per field."""
    lines = ["# Written by provision's monitoring step: the DCGM fields provision's rules read."]
    lines += [f"{f.name}, {f.kind}, {f.help}" for f in FIELDS]
    return "\n".join(lines) + "\n"


def recording_rules() -> str:
    """The rule file that records provision's GPU series from DCGM's (JSON, which is YAML)."""
    rules = [
        {"record": name, "expr": f'label_replace({expr}, "uuid", "$1", "UUID", "(.+)")'}
        for name, expr in RECORDS.items()
    ]
    rules.append({"record": "provision_gpu_nvml_up", "expr": NVML_UP})
    text = json.dumps({"groups": [{"name": GROUP, "rules": rules}]}, indent=2)
    return "# Written by provision's monitoring step; changes here are replaced.\n" + text + "\n"


def fields_read() -> set[str]:
    """Every DCGM field the recorded series read (each must be in counters_csv)."""
    import re

    exprs = [*RECORDS.values(), NVML_UP]
    return {name for expr in exprs for name in re.findall(r"DCGM_FI_[A-Z0-9_]+", expr)}
