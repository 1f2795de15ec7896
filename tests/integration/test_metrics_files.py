"""The files provision writes for the node exporter's textfile collector, run for real here
and read by the real promtool (`check metrics`, the exposition format's linter): the node
collector script (sh, as the monitoring step renders it, paths moved into a temp dir) and
the NVML collector's output over the captured-GPU stand-in."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from shlex import quote

import pynvml

from provision.deploys import monitoring as monitoring_deploy
from provision.inventory import Cluster
from provision.monitoring import gpu_collector
from provision.resources import render_template
from provision.rules import monitoring as monitoring_layout
from provision.status import textfile as status_textfile
from provision.status.judge import Drift, HostStatus
from provision.validate import textfile
from provision.validate.records import Finding, NodeResult
from tests.helpers.deploy_facts import node
from tests.standins import nvml_from_captures as nvml

PROMTOOL = Path(sys.executable).parent / "promtool"


def _check(text: str) -> None:
    result = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _collector(tmp_path: Path, **changes: object) -> str:
    values: dict[str, object] = {
        "unit": "provision-node-metrics",
        "every_s": 60,
        "out": quote(str(tmp_path / "provision_node.prom")),
        "cache": quote(str(tmp_path / "node-metrics.cache")),
        "site_glob": quote(str(tmp_path / "venv")) + "/lib/python3*/site-packages",
        "backups": True,
        "backup_stamp": quote(str(tmp_path / "stamp")),
        "backup_timer": quote(str(tmp_path / "timer")),
        "schedule": "daily",
        "mounts": [(quote(str(tmp_path / 'not an "nfs" mount')), quote(f'{tmp_path}/not an \\"nfs\\" mount'))],
        "nfs_server": False,
        "slurm": True,
        "slurm_node": "n1",
    }
    return render_template("monitoring/node-metrics.j2", **(values | changes))


def _run(tmp_path: Path, script: str) -> dict[str, float]:
    path = tmp_path / "collector"
    path.write_text(script)
    subprocess.run(["bash", str(path)], check=True, timeout=60)
    text = (tmp_path / "provision_node.prom").read_text()
    _check(text)
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_the_node_collector_writes_valid_series(tmp_path: Path) -> None:
    (tmp_path / "venv/lib/python3.11/site-packages/torch-2.13.0+cpu.dist-info").mkdir(parents=True)
    (tmp_path / "stamp").write_text("1796500000\n")
    (tmp_path / "timer").write_text("")
    (tmp_path / 'not an "nfs" mount').mkdir()
    series = _run(tmp_path, _collector(tmp_path))
    assert series['provision_versions_info{driver="",cuda="",torch="2.13.0+cpu"}'] == 1
    assert series["provision_backup_last_success_timestamp_seconds"] == 1796500000
    assert series["provision_backup_since_timestamp_seconds"] == 1796500000
    assert series["provision_backup_interval_seconds"] == 86400  # daily, as systemd reads it
    assert series[f'provision_nfs_mount_present{{path="{tmp_path}/not an \\"nfs\\" mount"}}'] == 0
    assert abs(series["provision_node_metrics_timestamp_seconds"] - time.time()) < 60
    assert oct((tmp_path / "provision_node.prom").stat().st_mode & 0o777) == "0o644"


def test_the_backup_interval_follows_a_changed_schedule_and_a_failed_reading_is_tried_again(tmp_path: Path) -> None:
    """The interval is cached with its schedule: a new schedule (the script is rendered
    again with it, the timer file untouched) is read again, and a schedule systemd cannot
    read leaves no interval and nothing cached, so the next pass tries again."""
    (tmp_path / "timer").write_text("")
    assert _run(tmp_path, _collector(tmp_path, mounts=[], slurm=False))["provision_backup_interval_seconds"] == 86400
    hourly = _run(tmp_path, _collector(tmp_path, schedule="hourly", mounts=[], slurm=False))
    assert hourly["provision_backup_interval_seconds"] == 3600
    (tmp_path / "node-metrics.cache").unlink()
    broken = _run(tmp_path, _collector(tmp_path, schedule=quote("not a schedule"), mounts=[], slurm=False))
    assert "provision_backup_interval_seconds" not in broken
    assert broken["provision_backup_since_timestamp_seconds"] == int((tmp_path / "timer").stat().st_mtime)
    assert not (tmp_path / "node-metrics.cache").exists()
    again = _run(tmp_path, _collector(tmp_path, mounts=[], slurm=False))
    assert again["provision_backup_interval_seconds"] == 86400


def test_a_backup_never_run_counts_from_the_timer_s_installation(tmp_path: Path) -> None:
    (tmp_path / "timer").write_text("")
    series = _run(tmp_path, _collector(tmp_path, mounts=[], slurm=False))
    assert series["provision_backup_last_success_timestamp_seconds"] == 0
    assert series["provision_backup_since_timestamp_seconds"] == int((tmp_path / "timer").stat().st_mtime)


def test_hostile_file_contents_never_reach_a_label_or_value(tmp_path: Path) -> None:
    """A stamp or a dist-info name written to break the format is reduced to digits, or to
    the label's safe characters."""
    (tmp_path / 'venv/lib/python3.11/site-packages/torch-1"} 9\nevil{x="y.dist-info').mkdir(parents=True)
    (tmp_path / "stamp").write_text('12"} 1\nprovision_x 5\n')
    (tmp_path / "timer").write_text("")
    series = _run(tmp_path, _collector(tmp_path, mounts=[], slurm=False))
    assert series["provision_backup_last_success_timestamp_seconds"] == 1215
    assert not any("evil" in k and "{" not in k for k in series)
    assert not any(k.startswith("provision_x") for k in series)


def test_the_gpu_collector_s_files_pass_promtool() -> None:
    for model in ("h100-sxm-loaded", "rtx-a5000-x2", "a100-80gb-mig"):
        with nvml.installed(nvml.stand_in_library(model)):
            _check(gpu_collector.exposition(*gpu_collector.collect(pynvml, journal=lambda: "NVRM: Xid (PCI:1): 48, x")))
    _check(gpu_collector.exposition([], "init: Driver Not Loaded"))


def test_validate_s_series_pass_promtool() -> None:
    findings = [
        Finding("n1", "gpu_bf16_tflops", "gpu0", 612.5, "TFLOP/s", 700.0, "fail", "below"),
        Finding("n1", "gpu_bf16_tflops", "gpu1", 790.1, "TFLOP/s", 700.0, "pass", "ok"),
        Finding("n1", "net_gbits", "", None, "Gbit/s", None, "skip", "not run"),
        Finding("n1", 'odd"name\\', "", float("nan"), "x", float("inf"), "warn", "hostile"),
    ]
    text = textfile.exposition(NodeResult("n1", "fail", findings), 1796500000.0)
    _check(text)
    assert "provision_validate_node_pass 0.0" in text
    assert 'provision_validate_value{metric="gpu_bf16_tflops",device="gpu1",unit="TFLOP/s"} 790.1' in text
    assert "nan" not in text.lower().replace("metric=", "")  # no NaN or Inf sample
    assert 'metric="odd\\"name\\\\"' in text


def test_status_s_drift_count_passes_promtool() -> None:
    drift = [Drift("numpy", "2.2.6", "1.26.4"), Drift("torch", "2.13.0", "2.12.0")]
    text = status_textfile.exposition(HostStatus("n1", True, drift=drift), 1796500000.0)
    _check(text)
    assert "provision_drift_items 2\n" in text


def test_on_the_nfs_server_a_share_counts_when_it_is_on_a_mounted_volume(tmp_path: Path) -> None:
    """The storage host sees its shares through its own volume (the bind of the export
    root), not over NFS: a share on a mounted filesystem counts (/proc stands in for the
    volume here, a mount point on every Linux machine), one on the root filesystem does
    not (the volume is not mounted, and nfsd waits for it)."""
    (tmp_path / "timer").write_text("")
    mounts = [(quote("/proc"), quote("/proc")), (quote("/etc"), quote("/etc"))]
    series = _run(tmp_path, _collector(tmp_path, mounts=mounts, nfs_server=True, slurm=False))
    assert series['provision_nfs_mount_present{path="/proc"}'] == 1
    assert series['provision_nfs_mount_present{path="/etc"}'] == 0


def test_a_killed_gpu_pass_is_followed_by_nvml_down_and_a_finished_one_is_not(tmp_path: Path) -> None:
    """The GPU unit's ExecStopPost, run as systemd runs it (its $$ made $, SERVICE_RESULT set)
    with this machine's python and the collector's own file: after a pass killed at the
    unit's deadline the file says NVML is down; after a pass that ended, it is left alone."""
    gpu = node("g1", ("gpu_nodes",), venv_path=str(Path(sys.executable).parent.parent))
    units = monitoring_deploy.collector_units(gpu, Cluster(tmp_path / "inv.py", (gpu,)), gpus=True)
    service = units[f"/etc/systemd/system/{monitoring_layout.GPU_COLLECTOR_UNIT}.service"]
    (line,) = re.findall(r"^ExecStopPost=(.*)$", service, re.M)
    out = tmp_path / "provision_gpu.prom"
    line = line.replace("$$", "$").replace(monitoring_layout.GPU_COLLECTOR, gpu_collector.__file__)
    line = line.replace(f"{monitoring_layout.TEXTFILE_DIR}/provision_gpu.prom", str(out))
    argv = shlex.split(line)  # systemd's own word splitting follows the same quotes
    for result in ("success", "exit-code"):
        subprocess.run(argv, env={"SERVICE_RESULT": result}, check=True, timeout=60)
        assert not out.exists()
    subprocess.run(argv, env={"SERVICE_RESULT": "timeout"}, check=True, timeout=60)
    assert "provision_gpu_nvml_up 0\n" in out.read_text()
