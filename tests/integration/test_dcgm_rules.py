"""The rules that put DCGM's fields in provision's names (provision.rules.dcgm), run by
the real promtool: each recorded series from series labelled as dcgm-exporter labels them,
the GPU alerts firing from DCGM's fields alone, and NVML's "up" going to 0 when the
exporter stops answering or reports no GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from provision import resources
from provision.inventory import Cluster
from provision.rules import dcgm, monitoring
from tests.helpers.deploy_facts import node
from tests.integration.test_alert_rules import _promtool

ALERTS = resources.templates_dir() / "monitoring" / "alerts.yml"
# As dcgm-exporter 4 labels a GPU's series, plus the job and node the scrape adds.
GPU = (
    'gpu="0",UUID="GPU-5b0c1a2e-0000-4000-8000-000000000000",device="nvidia0",'
    'modelName="NVIDIA H200",Hostname="g1",job="dcgm",instance="10.9.0.7:9400",node="g1"'
)
OUT = {
    "gpu": "0",
    "UUID": "GPU-5b0c1a2e-0000-4000-8000-000000000000",
    "uuid": "GPU-5b0c1a2e-0000-4000-8000-000000000000",
    "device": "nvidia0",
    "modelName": "NVIDIA H200",
    "Hostname": "g1",
    "job": "dcgm",
    "instance": "10.9.0.7:9400",
    "node": "g1",
}
# DCGM field -> value, in DCGM's units (the idle H200 of the nvidia-smi capture in
# tests/fixtures: 0 % busy, 26 C, 76.5 W, 1980 MHz, 143771 MiB total, Gen5 x16)
INPUT = {
    "DCGM_FI_DEV_GPU_UTIL": 37,
    "DCGM_FI_DEV_MEM_COPY_UTIL": 12,
    "DCGM_FI_DEV_FB_USED": 1024,
    "DCGM_FI_DEV_FB_FREE": 142236,
    "DCGM_FI_DEV_FB_RESERVED": 511,
    "DCGM_FI_DEV_GPU_TEMP": 26,
    "DCGM_FI_DEV_POWER_USAGE": 76.5,
    "DCGM_FI_DEV_SM_CLOCK": 1980,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 1,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 3,
    "DCGM_FI_DEV_PCIE_LINK_GEN": 5,
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": 16,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 1,
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 2,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 3,
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 4,
}
EXPECTED = {
    "provision_gpu_utilization_ratio": 0.37,
    "provision_gpu_memory_utilization_ratio": 0.12,
    "provision_gpu_memory_used_bytes": 1024 * dcgm.MIB,
    "provision_gpu_memory_total_bytes": (1024 + 142236 + 511) * dcgm.MIB,
    "provision_gpu_temperature_celsius": 26,
    "provision_gpu_power_watts": 76.5,
    "provision_gpu_sm_clock_hertz": 1980e6,
    "provision_gpu_clock_event_reasons": 1,
    "provision_gpu_ecc_volatile_uncorrected_errors": 0,
    "provision_gpu_ecc_volatile_corrected_errors": 3,
    "provision_gpu_pcie_link_generation": 5,
    "provision_gpu_pcie_link_width": 16,
    "provision_gpu_nvlink_errors": 10,
}


def _write(tmp_path: Path, tests: list[dict[str, Any]]) -> str:
    (tmp_path / "dcgm.yml").write_text(dcgm.recording_rules())
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
    spec = {"rule_files": ["dcgm.yml", "alerts.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "tests.yml").write_text(json.dumps(spec))
    result = _promtool("test", "rules", "tests.yml", cwd=tmp_path)
    return result.stdout + result.stderr if result.returncode else ""


def _series(values: dict[str, float], up: str = "1x10") -> list[dict[str, str]]:
    series = [{"series": f"{name}{{{GPU}}}", "values": f"{value}x10"} for name, value in values.items()]
    return [*series, {"series": 'up{job="dcgm",instance="10.9.0.7:9400",node="g1"}', "values": up}]


def test_the_generated_rules_pass_promtool_check(tmp_path: Path) -> None:
    (tmp_path / "dcgm.yml").write_text(dcgm.recording_rules())
    result = _promtool("check", "rules", str(tmp_path / "dcgm.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_provision_series_is_recorded_from_dcgm_fields(tmp_path: Path) -> None:
    assert set(EXPECTED) == set(dcgm.RECORDS)
    assert set(INPUT) == dcgm.fields_read()
    exprs = [
        {"expr": name, "eval_time": "5m", "exp_samples": [{"labels": f"{name}{{{_labels(OUT)}}}", "value": value}]}
        for name, value in EXPECTED.items()
    ]
    up = {
        "expr": "provision_gpu_nvml_up",
        "eval_time": "5m",
        "exp_samples": [{"labels": 'provision_gpu_nvml_up{job="dcgm",instance="10.9.0.7:9400",node="g1"}', "value": 1}],
    }
    failed = _write(tmp_path, [{"interval": "1m", "input_series": _series(INPUT), "promql_expr_test": [*exprs, up]}])
    assert not failed, failed


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def test_gpu_alerts_fire_from_dcgm_fields_alone(tmp_path: Path) -> None:
    hot = INPUT | {"DCGM_FI_DEV_GPU_TEMP": 91, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 2}
    alert_labels = OUT | {"severity": "warning"}
    tests = [
        {
            "interval": "1m",
            "input_series": _series(hot),
            "alert_rule_test": [
                {
                    "eval_time": "8m",
                    "alertname": "GpuHot",
                    "exp_alerts": [
                        {"exp_labels": alert_labels, "exp_annotations": {"summary": "g1: GPU 0 at 91 C for 5 minutes"}}
                    ],
                },
                {
                    "eval_time": "8m",
                    "alertname": "GpuUncorrectableEcc",
                    "exp_alerts": [
                        {
                            "exp_labels": alert_labels | {"severity": "critical"},
                            "exp_annotations": {"summary": "g1: GPU 0 has 2 volatile uncorrectable ECC errors"},
                        }
                    ],
                },
                {"eval_time": "8m", "alertname": "GpuNvmlDown", "exp_alerts": []},
            ],
        },
        {
            "interval": "1m",
            "input_series": _series(INPUT),
            "alert_rule_test": [{"eval_time": "8m", "alertname": "GpuHot", "exp_alerts": []}],
        },
    ]
    failed = _write(tmp_path, tests)
    assert not failed, failed


def test_nvml_reads_down_when_the_exporter_stops_answering_or_reports_no_gpu(tmp_path: Path) -> None:
    # The exporter fails its scrapes from minute 2: its series end there (Prometheus marks
    # them stale), `up` reads 0. Then: the exporter answers with no GPU field (host engine lost).
    stopped = [{"series": f"{name}{{{GPU}}}", "values": f"{value} {value} stale"} for name, value in INPUT.items()] + [
        {"series": 'up{job="dcgm",instance="10.9.0.7:9400",node="g1"}', "values": "1 1 0x10"}
    ]
    no_gpu = [{"series": 'up{job="dcgm",instance="10.9.0.7:9400",node="g1"}', "values": "1x10"}]
    down = {"job": "dcgm", "instance": "10.9.0.7:9400", "node": "g1"}
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {
                    "expr": "provision_gpu_nvml_up",
                    "eval_time": "6m",
                    "exp_samples": [{"labels": f"provision_gpu_nvml_up{{{_labels(down)}}}", "value": 0}],
                }
            ],
            "alert_rule_test": [
                {
                    "eval_time": "6m",
                    "alertname": "GpuNvmlDown",
                    "exp_alerts": [
                        {
                            "exp_labels": down | {"severity": "critical"},
                            "exp_annotations": {"summary": "g1: NVML does not answer (driver or GPU lost)"},
                        }
                    ],
                }
            ],
        }
        for series in (stopped, no_gpu)
    ]
    failed = _write(tmp_path, tests)
    assert not failed, failed


def test_a_node_that_is_down_is_node_down_not_a_lost_gpu(tmp_path: Path) -> None:
    """The whole node gone (a reboot, a power loss): both its exporters fail their scrapes.
    NodeDown fires; NVML's "up" is absent, as the NVML collector's is, so GpuNvmlDown does not."""
    gone = [
        {"series": 'up{job="dcgm",instance="10.9.0.7:9400",node="g1"}', "values": "1 1 0x10"},
        {"series": 'up{job="node",instance="10.9.0.7:9100",node="g1"}', "values": "1 1 0x10"},
    ]
    down = {"job": "node", "instance": "10.9.0.7:9100", "node": "g1", "severity": "critical"}
    node_down = {"exp_labels": down, "exp_annotations": {"summary": "g1: its exporter has not answered for 2 minutes"}}
    tests = [
        {
            "interval": "1m",
            "input_series": gone,
            "promql_expr_test": [{"expr": "provision_gpu_nvml_up", "eval_time": "6m", "exp_samples": []}],
            "alert_rule_test": [
                {"eval_time": "6m", "alertname": "GpuNvmlDown", "exp_alerts": []},
                {"eval_time": "6m", "alertname": "NodeDown", "exp_alerts": [node_down]},
            ],
        }
    ]
    failed = _write(tmp_path, tests)
    assert not failed, failed


def test_the_configuration_with_a_dcgm_host_passes_promtool_check(tmp_path: Path) -> None:
    cluster = Cluster(
        tmp_path / "inv.py",
        (node("n1", ("head",), cluster_address="10.9.0.1"), node("g1", ("gpu_nodes",), cluster_address="10.9.0.7")),
    )
    config = yaml.safe_load(monitoring.scrape_config(cluster))
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
    (tmp_path / "dcgm.yml").write_text(dcgm.recording_rules())
    config["rule_files"] = [str(tmp_path / "alerts.yml"), str(tmp_path / "dcgm.yml")]
    (tmp_path / "provision.yml").write_text(json.dumps(config))
    result = _promtool("check", "config", str(tmp_path / "provision.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "dcgm"]
    assert job["static_configs"] == [{"targets": ["10.9.0.7:9400"], "labels": {"node": "g1"}}]
