"""The NVML GPU collector over the real pynvml, its C library replaced by the stand-in fed
from captured nvidia-smi output: the values it writes, and the file it still writes when
NVML fails at init, mid-pass or hangs past its deadline."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pynvml

from provision.monitoring import gpu_collector
from tests.standins import nvml_from_captures as nvml

XID_LOG = "NVRM: Xid (PCI:0000:17:00): 79, pid=1, GPU has fallen off the bus.\nNVRM: Xid (PCI:0000:17:00): 79, x\n"


def _series(text: str) -> dict[str, float]:
    """name{labels} -> value, the exposition's sample lines."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_a_burning_h200_reads_back_as_captured(stand_in_nvml) -> None:
    stand_in_nvml("h200-580-burn")
    samples, down = gpu_collector.collect(pynvml, journal=lambda: XID_LOG)
    text = gpu_collector.exposition(samples, down)
    series = _series(text)
    gpu = next(k for k in series if k.startswith("provision_gpu_temperature_celsius")).split("{", 1)[1]
    assert down == ""
    assert series["provision_gpu_nvml_up"] == 1
    assert series[f"provision_gpu_temperature_celsius{{{gpu}"] == 64
    assert series[f"provision_gpu_power_watts{{{gpu}"] == 714.43
    assert series[f"provision_gpu_utilization_ratio{{{gpu}"] == 0.98
    assert series[f"provision_gpu_memory_used_bytes{{{gpu}"] == 1295 * 2**20
    assert series[f"provision_gpu_memory_total_bytes{{{gpu}"] == 143771 * 2**20
    # sw_power_cap active at the 700 W cap, as captured
    assert int(series[f"provision_gpu_clock_event_reasons{{{gpu}"]) & pynvml.nvmlClocksEventReasonSwPowerCap
    assert series['provision_gpu_xid_events{xid="79"}'] == 2


def test_two_gpus_keep_each_metric_s_lines_together(stand_in_nvml) -> None:
    stand_in_nvml("rtx-a5000-x2")
    text = gpu_collector.exposition(*gpu_collector.collect(pynvml, journal=lambda: ""))
    names = [re.split(r"[{ ]", line)[0] for line in text.splitlines() if not line.startswith("#")]
    # each metric's samples are adjacent (the text format's rule), both GPUs present
    runs = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert len(runs) == len(set(runs))
    assert sum(1 for n in names if n == "provision_gpu_temperature_celsius") == 2


def test_queries_a_gpu_does_not_support_are_left_out(stand_in_nvml) -> None:
    stand_in_nvml("t4", ecc_mode=None, ecc={}, nvlinks=None)
    series = _series(gpu_collector.exposition(*gpu_collector.collect(pynvml, journal=lambda: "")))
    assert series["provision_gpu_nvml_up"] == 1
    assert not any(k.startswith(("provision_gpu_ecc_", "provision_gpu_nvlink_")) for k in series)


def test_nvml_failing_at_init_still_writes_nvml_up_0(stand_in_nvml) -> None:
    stand_in_nvml("h200", init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    samples, down = gpu_collector.collect(pynvml, journal=lambda: "")
    assert down.startswith("init: ")
    series = _series(gpu_collector.exposition(samples, down))
    assert set(series) == {"provision_gpu_nvml_up", "provision_gpu_metrics_timestamp_seconds"}
    assert series["provision_gpu_nvml_up"] == 0


def test_a_gpu_lost_mid_pass_writes_nvml_up_0_and_no_half_pass(stand_in_nvml) -> None:
    stand_in_nvml("h200", lost=True)
    samples, down = gpu_collector.collect(pynvml, journal=lambda: "")
    assert down.startswith("query: ")
    series = _series(gpu_collector.exposition(samples, down))
    assert series["provision_gpu_nvml_up"] == 0
    assert not any(k.startswith("provision_gpu_temperature") for k in series)


def test_a_hung_nvml_call_ends_at_the_deadline_with_nvml_up_0(stand_in_nvml, tmp_path: Path) -> None:
    library = nvml.stand_in_library("h200")

    class StandInHungCount:  # nvmlDeviceGetCount blocks, as on a wedged driver
        def __call__(self, ref: object) -> int:
            time.sleep(30)
            return 0

    library.c_nvmlDeviceGetCount_v2 = StandInHungCount()  # type: ignore[method-assign,assignment]
    stand_in_nvml(library)
    out = tmp_path / "provision_gpu.prom"
    started = time.monotonic()
    assert gpu_collector.main(["--out", str(out), "--timeout-s", "1"]) == 1
    assert time.monotonic() - started < 10
    assert _series(out.read_text())["provision_gpu_nvml_up"] == 0
    assert oct(out.stat().st_mode & 0o777) == "0o644"
