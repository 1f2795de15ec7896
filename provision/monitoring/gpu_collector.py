"""The NVML GPU collector: one pass of NVML queries, written for the node exporter's
textfile collector. Installed by the monitoring step on GPU nodes as
/usr/local/libexec/provision-gpu-metrics.py and run as root by a systemd timer with the
node venv's python (``-I``: nothing from the working directory or the environment is
imported). It runs alone on a node and imports nothing of this package but the standard
library and nvidia-ml-py's pynvml.

A GPU or a query that NVML does not support is left out, not failed: a T4 has no NVLink,
a GeForce no ECC. NVML failing at init, mid-pass or past ``--timeout-s`` (a driver wedged
by a fallen GPU can block a query for minutes) still writes the file, with
``provision_gpu_nvml_up 0``, so Prometheus' GpuNvmlDown alert sees it.

Xid events come from the kernel log (``journalctl -k``, this boot), counted per code.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

# (metric, help, unit conversion) per device query; each answers one number.
HELP = {
    "provision_gpu_utilization_ratio": "GPU busy share over the driver's last sample period (0-1).",
    "provision_gpu_memory_utilization_ratio": "Share of time device memory was read or written (0-1).",
    "provision_gpu_memory_used_bytes": "Framebuffer memory in use.",
    "provision_gpu_memory_total_bytes": "Framebuffer memory in all.",
    "provision_gpu_temperature_celsius": "GPU core temperature.",
    "provision_gpu_power_watts": "Power draw.",
    "provision_gpu_sm_clock_hertz": "SM clock now.",
    "provision_gpu_clock_event_reasons": "NVML clocks event reason bits (why clocks are held down).",
    "provision_gpu_ecc_volatile_uncorrected_errors": "Uncorrectable ECC errors since the driver loaded.",
    "provision_gpu_ecc_volatile_corrected_errors": "Corrected ECC errors since the driver loaded.",
    "provision_gpu_pcie_link_generation": "PCIe link generation now.",
    "provision_gpu_pcie_link_width": "PCIe link width now (lanes).",
    "provision_gpu_nvlink_errors": "NVLink CRC, replay and recovery errors, all links.",
    "provision_gpu_xid_events": "Xid events in this boot's kernel log, per code.",
}
XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")
JOURNAL_S = 10


class Deadline(Exception):
    pass


def label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def device_samples(nvml: Any, index: int) -> list[tuple[str, dict[str, str], float]]:
    """(metric, labels, value) for one GPU; queries it does not support are left out."""
    h = nvml.nvmlDeviceGetHandleByIndex(index)
    labels = {"gpu": str(index), "uuid": _text(nvml.nvmlDeviceGetUUID(h))}
    out: list[tuple[str, dict[str, str], float]] = []

    def add(metric: str, query: Callable[[], float], extra: dict[str, str] | None = None) -> None:
        with contextlib.suppress(nvml.NVMLError_NotSupported):
            out.append((metric, {**labels, **(extra or {})}, float(query())))

    add("provision_gpu_utilization_ratio", lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100)
    add("provision_gpu_memory_utilization_ratio", lambda: nvml.nvmlDeviceGetUtilizationRates(h).memory / 100)
    add("provision_gpu_memory_used_bytes", lambda: nvml.nvmlDeviceGetMemoryInfo(h).used)
    add("provision_gpu_memory_total_bytes", lambda: nvml.nvmlDeviceGetMemoryInfo(h).total)
    add("provision_gpu_temperature_celsius", lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
    add("provision_gpu_power_watts", lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000)
    add("provision_gpu_sm_clock_hertz", lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM) * 1e6)
    add("provision_gpu_clock_event_reasons", lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h))
    ecc = nvml.nvmlDeviceGetTotalEccErrors
    uncorrected, corrected = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    add("provision_gpu_ecc_volatile_uncorrected_errors", lambda: ecc(h, uncorrected, nvml.NVML_VOLATILE_ECC))
    add("provision_gpu_ecc_volatile_corrected_errors", lambda: ecc(h, corrected, nvml.NVML_VOLATILE_ECC))
    add("provision_gpu_pcie_link_generation", lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(h))
    add("provision_gpu_pcie_link_width", lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(h))
    add("provision_gpu_nvlink_errors", lambda: nvlink_errors(nvml, h))
    return out


def nvlink_errors(nvml: Any, h: Any) -> int:
    """CRC, replay and recovery errors over the GPU's active links (NotSupported: none)."""
    counters = (
        nvml.NVML_NVLINK_ERROR_DL_REPLAY,
        nvml.NVML_NVLINK_ERROR_DL_RECOVERY,
        nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        nvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    )
    total, active = 0, 0
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue
        active += 1
        for counter in counters:
            with contextlib.suppress(nvml.NVMLError_NotSupported):
                total += nvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
    if not active:
        raise nvml.NVMLError_NotSupported()
    return total


def xid_counts(journal: Callable[[], str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for code in XID.findall(journal()):
        counts[code] = counts.get(code, 0) + 1
    return counts


def kernel_log() -> str:
    try:
        return subprocess.run(
            ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "cat", "-g", "NVRM: Xid"],
            capture_output=True,
            text=True,
            timeout=JOURNAL_S,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def collect(nvml: Any, journal: Callable[[], str] = kernel_log) -> tuple[list[tuple[str, dict[str, str], float]], str]:
    """Every sample, and why NVML is down ("" when up)."""
    samples: list[tuple[str, dict[str, str], float]] = []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return samples, f"init: {e}"
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            samples += device_samples(nvml, index)
    except nvml.NVMLError as e:  # a lost GPU answers GpuIsLost to everything
        return samples, f"query: {e}"
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    for code, n in sorted(xid_counts(journal).items()):
        samples.append(("provision_gpu_xid_events", {"xid": code}, float(n)))
    return samples, ""


def exposition(samples: list[tuple[str, dict[str, str], float]], down: str) -> str:
    lines = [
        "# HELP provision_gpu_nvml_up 1 when NVML answered every query of the last pass.",
        "# TYPE provision_gpu_nvml_up gauge",
        f"provision_gpu_nvml_up {0 if down else 1}",
        "# HELP provision_gpu_metrics_timestamp_seconds When this file was written.",
        "# TYPE provision_gpu_metrics_timestamp_seconds gauge",
        f"provision_gpu_metrics_timestamp_seconds {int(time.time())}",
    ]
    if down:  # samples from before the failure are kept out: half a pass misleads
        return "\n".join(lines) + "\n"
    # A metric's lines must stand together (the format's rule): grouped, GPUs in order.
    families: dict[str, list[str]] = {}
    for metric, labels, value in samples:
        pairs = ",".join(f'{k}="{label(v)}"' for k, v in labels.items())
        families.setdefault(metric, []).append(f"{metric}{{{pairs}}} {value!r}")
    for metric, series in families.items():
        lines += [f"# HELP {metric} {HELP[metric]}", f"# TYPE {metric} gauge", *series]
    return "\n".join(lines) + "\n"


def write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the .prom file to write")
    parser.add_argument("--timeout-s", type=int, default=40, help="one pass's deadline")
    parser.add_argument(
        "--down",
        metavar="REASON",
        help="write NVML as down and ask nothing (systemd's ExecStopPost, when the pass was killed: "
        "SIGALRM cannot end a call blocked inside the driver, and systemd's deadline then kills the pass)",
    )
    args = parser.parse_args(argv)
    if args.down:
        write(args.out, exposition([], args.down))
        print(f"NVML down: {args.down}", file=sys.stderr)
        return 0
    import pynvml

    def expire(signum: int, frame: Any) -> None:
        raise Deadline()

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(args.timeout_s)
    try:
        samples, down = collect(pynvml)
    except Deadline:
        samples, down = [], f"no answer within {args.timeout_s} s"
    finally:
        signal.alarm(0)
    write(args.out, exposition(samples, down))
    if down:
        print(f"NVML down: {down}", file=sys.stderr)
    return 1 if down else 0


if __name__ == "__main__":
    sys.exit(main())
