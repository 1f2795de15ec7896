"""provision's alert rules (templates/monitoring/alerts.yml) and the generated Prometheus
configuration, checked by the real promtool (scripts/bootstrap puts the distribution's in
the venv): `check rules`, `check config`, and `test rules` with a firing case and a quiet
case for every alert."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from provision import resources
from provision.inventory import Cluster
from provision.rules import monitoring
from tests.helpers.deploy_facts import node

PROMTOOL = Path(sys.executable).parent / "promtool"
RULES = resources.templates_dir() / "monitoring" / "alerts.yml"


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PROMTOOL), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def _case(alert: str, series: dict[str, str], at: str, fires: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "interval": "1m",
        "input_series": [{"series": name, "values": values} for name, values in series.items()],
        "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": fires}],
    }


N = 'node="n1"'
# (alert, firing series, quiet series, eval time, the firing alert's own labels)
CASES: list[tuple[str, dict[str, str], dict[str, str], str, dict[str, str]]] = [
    (
        "NodeDown",
        {f'up{{job="node",{N}}}': "1 0 0 0 0"},
        {f'up{{job="node",{N}}}': "1 1 0 1 1"},
        "4m",
        {"job": "node", "node": "n1", "severity": "critical"},
    ),
    (
        "DiskAlmostFull",
        {
            f'node_filesystem_avail_bytes{{{N},fstype="xfs",mountpoint="/data"}}': "5x10",
            f'node_filesystem_size_bytes{{{N},fstype="xfs",mountpoint="/data"}}': "100x10",
        },
        {
            f'node_filesystem_avail_bytes{{{N},fstype="xfs",mountpoint="/data"}}': "20x10",
            f'node_filesystem_size_bytes{{{N},fstype="xfs",mountpoint="/data"}}': "100x10",
        },
        "8m",
        {"node": "n1", "fstype": "xfs", "mountpoint": "/data", "severity": "warning"},
    ),
    (
        "NfsMountMissing",
        {f'provision_nfs_mount_present{{{N},path="/shared/datasets"}}': "0x10"},
        {f'provision_nfs_mount_present{{{N},path="/shared/datasets"}}': "1x10"},
        "5m",
        {"node": "n1", "path": "/shared/datasets", "severity": "critical"},
    ),
    (
        "GpuUncorrectableEcc",
        {f'provision_gpu_ecc_volatile_uncorrected_errors{{{N},gpu="0"}}': "0 0 2 2"},
        {f'provision_gpu_ecc_volatile_uncorrected_errors{{{N},gpu="0"}}': "0 0 0 0"},
        "3m",
        {"node": "n1", "gpu": "0", "severity": "critical"},
    ),
    (
        "GpuHot",
        {f'provision_gpu_temperature_celsius{{{N},gpu="1"}}': "90x10"},
        {f'provision_gpu_temperature_celsius{{{N},gpu="1"}}': "70x10"},
        "7m",
        {"node": "n1", "gpu": "1", "severity": "warning"},
    ),
    (
        "GpuNvmlDown",
        {f"provision_gpu_nvml_up{{{N}}}": "0x10"},
        {f"provision_gpu_nvml_up{{{N}}}": "1x10"},
        "5m",
        {"node": "n1", "severity": "critical"},
    ),
    (
        # A daily backup last seen at t=0; at 49 h it is over twice its interval.
        "BackupStale",
        {
            f"provision_backup_since_timestamp_seconds{{{N}}}": "0x3000",
            f"provision_backup_interval_seconds{{{N}}}": "86400x3000",
        },
        {
            f"provision_backup_since_timestamp_seconds{{{N}}}": "100000x3000",
            f"provision_backup_interval_seconds{{{N}}}": "86400x3000",
        },
        "49h",
        {"node": "n1", "severity": "warning"},
    ),
    (
        "ValidateFailed",
        {f"provision_validate_node_pass{{{N}}}": "0x5"},
        {f"provision_validate_node_pass{{{N}}}": "1x5"},
        "2m",
        {"node": "n1", "severity": "warning"},
    ),
    (
        "SlurmNodeDrained",
        {f'provision_slurm_node_drained{{{N},state="idle+drain"}}': "1x5"},
        {f'provision_slurm_node_drained{{{N},state="idle"}}': "0x5"},
        "2m",
        {"node": "n1", "state": "idle+drain", "severity": "warning"},
    ),
    (
        "CollectorStale",
        {f'node_textfile_mtime_seconds{{{N},file="provision_node.prom"}}': "0x20"},
        {f'node_textfile_mtime_seconds{{{N},file="provision_node.prom"}}': "0+60x20"},
        "10m",
        {"node": "n1", "file": "provision_node.prom", "severity": "warning"},
    ),
]


# What each firing case's summary must read: the labels and the value rendered into it.
SUMMARIES = {
    "NodeDown": "n1: its exporter has not answered for 2 minutes",
    "DiskAlmostFull": "n1: /data is 95% full",
    "NfsMountMissing": "n1: the NFS share /shared/datasets is not mounted",
    "GpuUncorrectableEcc": "n1: GPU 0 has 2 volatile uncorrectable ECC errors",
    "GpuHot": "n1: GPU 1 at 90 C for 5 minutes",
    "GpuNvmlDown": "n1: NVML does not answer (driver or GPU lost)",
    "BackupStale": "n1: no successful backup for over twice its schedule",
    "ValidateFailed": "n1: its last provision validate verdict is fail",
    "SlurmNodeDrained": "n1: drained in Slurm (idle+drain)",
    "CollectorStale": "n1: provision_node.prom was not rewritten for 5 minutes",
}


def test_the_shipped_rules_pass_promtool_check() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    shipped = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert sorted(shipped) == sorted(c[0] for c in CASES)


@pytest.mark.parametrize(("alert", "firing", "quiet", "at", "labels"), CASES, ids=[c[0] for c in CASES])
def test_alert(
    tmp_path: Path, alert: str, firing: dict[str, str], quiet: dict[str, str], at: str, labels: dict[str, str]
) -> None:
    (tmp_path / "alerts.yml").write_text(RULES.read_text())
    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [
            _case(alert, firing, at, [{"exp_labels": labels, "exp_annotations": {"summary": SUMMARIES[alert]}}]),
            _case(alert, quiet, at, []),
        ],
    }
    (tmp_path / "tests.yml").write_text(json.dumps(tests))
    result = _promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_collector_stale_fires_on_a_full_path_in_the_file_label(tmp_path: Path) -> None:
    """Some node exporter releases put the file's whole path in the `file` label, others its
    name (1.5, the testbed's): the rule matches both, and no other file."""
    (tmp_path / "alerts.yml").write_text(RULES.read_text())
    whole = f"{monitoring.TEXTFILE_DIR}/provision_gpu.prom"
    labels = {"node": "n1", "file": whole, "severity": "warning"}
    summary = f"n1: {whole} was not rewritten for 5 minutes"
    other = f'node_textfile_mtime_seconds{{node="n1",file="{monitoring.TEXTFILE_DIR}/provision_gpuXprom"}}'
    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [
            _case(
                "CollectorStale",
                {f'node_textfile_mtime_seconds{{node="n1",file="{whole}"}}': "0x20"},
                "10m",
                [{"exp_labels": labels, "exp_annotations": {"summary": summary}}],
            ),
            _case("CollectorStale", {other: "0x20"}, "10m", []),
        ],
    }
    (tmp_path / "tests.yml").write_text(json.dumps(tests))
    result = _promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_generated_configuration_passes_promtool_and_scrapes_cluster_addresses(tmp_path: Path) -> None:
    cluster = Cluster(
        tmp_path / "inv.py",
        (
            node("n1", ("head",), cluster_address="10.9.0.1"),
            node("n2", cluster_address="fd00::2"),
            node("n3", monitoring=False),
        ),
    )
    text = monitoring.scrape_config(cluster)
    config = yaml.safe_load(text)  # JSON is YAML: what Prometheus reads
    nodes = config["scrape_configs"][1]["static_configs"]
    assert [(c["targets"], c["labels"]) for c in nodes] == [
        (["10.9.0.1:9100"], {"node": "n1"}),
        (["[fd00::2]:9100"], {"node": "n2"}),
    ]
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["10.9.0.1:9090"]
    # promtool reads the rule file it names: the shipped one, beside the copy
    config["rule_files"] = [str(RULES)]
    (tmp_path / "provision.yml").write_text(json.dumps(config))
    result = _promtool("check", "config", str(tmp_path / "provision.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
