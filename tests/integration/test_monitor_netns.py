"""`provision monitor` against the real servers, in network namespaces: the distribution's
node exporter on each host's address (its textfile directory fed by the real NVML
collector over the captured-GPU stand-in), the distribution's Prometheus on the head with
the configuration and alert rules the monitoring step generates, and the monitor reading
it through the head's sshd (a direct-tcpip channel: nothing listens on this machine).

The servers come out of the distribution's packages (scripts/bootstrap); only the scrape
and evaluation intervals are shortened, so the test waits seconds, not minutes."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from provision import inventory, resources
from provision.launch import live
from provision.monitoring import fleet, gpu_collector
from provision.resources import render_template
from provision.rules import monitoring
from provision.validate import textfile
from provision.validate.records import Finding, NodeResult
from tests.helpers.netns import NetnsHost
from tests.standins import nvml_from_captures as nvml

BIN = Path(sys.executable).parent
RULES = resources.templates_dir() / "monitoring" / "alerts.yml"


def _start(host: NetnsHost, argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", host.netns, *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:  # by pid, each one this test started
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def _monitor(inv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provision", "monitor", str(inv), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def monitored(netns_hosts, tmp_path_factory):
    """Two namespace hosts: ns0 the head (Prometheus), both with a node exporter."""
    cluster = netns_hosts(2)
    tmp = tmp_path_factory.mktemp("monitored")
    inv = cluster.write_inventory(tmp / "inv.py")
    loaded = inventory.load(inv)
    procs: list[subprocess.Popen] = []
    try:
        for host in cluster.hosts:
            textfiles = tmp / f"textfile-{host.name}"
            textfiles.mkdir()
            node = loaded.node(host.name)
            args = [a.replace(monitoring.TEXTFILE_DIR, str(textfiles)) for a in monitoring.exporter_args(node)]
            exporter = [str(BIN / "prometheus-node-exporter"), *args]
            procs.append(_start(host, exporter, tmp / f"{host.name}.log"))
        # ns1 has a captured H200 under load: the real collector's file, as its timer writes it
        with nvml.installed(nvml.stand_in_library("h200-580-burn")):
            assert gpu_collector.main(["--out", str(tmp / "textfile-ns1" / "provision_gpu.prom")]) == 0
        config = json.loads(monitoring.scrape_config(loaded).split("\n", 1)[1])
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(RULES)]
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        head = loaded.node("ns0")
        args = [
            a.replace(monitoring.CONFIG, str(tmp / "prometheus.yml")).replace(monitoring.STORAGE, str(tmp / "tsdb"))
            for a in monitoring.prometheus_args(head)
        ]
        procs.append(_start(cluster.hosts[0], [str(BIN / "prometheus"), *args], tmp / "prometheus.log"))
        yield cluster, inv, tmp
    finally:
        _stop(procs)


def _until(inv: Path, ready, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        result = _monitor(inv, "--once", "--json")
        view = json.loads(result.stdout) if result.stdout.strip() else {}
        if (view and ready(view)) or time.monotonic() > deadline:
            return view | {"_result": result}
        time.sleep(1)


def test_monitor_once_json_shows_every_node_and_the_gpus(monitored) -> None:
    _, inv, _ = monitored
    # rates need two scrapes: waited for, as every figure asserted below
    view = _until(
        inv,
        lambda v: all(
            n["up"] and None not in (n["cpu"], n["memory"], n["net_rx"]) and (n["gpus"] or n["name"] == "ns0")
            for n in v["nodes"]
        ),
    )
    result = view.pop("_result")
    assert result.returncode == 0, result.stderr
    assert view["head"] == "ns0"
    nodes = {n["name"]: n for n in view["nodes"]}
    assert set(nodes) == {"ns0", "ns1"}
    for n in nodes.values():
        assert n["up"] is True
        assert 0 <= n["cpu"] <= 1
        assert 0 < n["memory"] < 1
        assert n["net_rx"] is not None
    (gpu,) = nodes["ns1"]["gpus"]
    assert gpu == {"index": "0", "utilization": 0.98, "memory_used": 1295 * 2**20, "temperature": 64.0, "power": 714.43}
    assert nodes["ns0"]["gpus"] == []
    assert view["alerts"] == []


def test_a_firing_alert_is_listed_and_fails_once(monitored) -> None:
    _, inv, tmp = monitored
    # validate's own series for a fail verdict in ns0's textfile directory, as validate
    # writes them there: the ValidateFailed rule has no wait
    finding = Finding("ns0", "ram_triad_gbs", "", 3.5, "GB/s", 10.0, "fail", "3.5 < 10 (expect)")
    path = tmp / "textfile-ns0" / "provision_validate.prom"
    path.write_text(textfile.exposition(NodeResult("ns0", "fail", [finding]), time.time()))
    try:
        view = _until(inv, lambda v: bool(v["alerts"]))
        result = view.pop("_result")
        assert result.returncode == 1
        assert view["alerts"] == [
            {"name": "ValidateFailed", "node": "ns0", "summary": "ns0: its last provision validate verdict is fail"}
        ]
        assert {n["name"]: n["alerts"] for n in view["nodes"]} == {"ns0": ["ValidateFailed"], "ns1": []}
        table = _monitor(inv, "--once")
        assert "ValidateFailed" in table.stdout
        assert "alerts firing" in table.stdout
    finally:
        os.unlink(path)


def test_a_head_without_prometheus_is_named_with_what_to_do(netns_hosts, tmp_path) -> None:
    cluster = netns_hosts(1)
    result = _monitor(cluster.write_inventory(tmp_path / "inv.py"), "--once", "--json")
    assert result.returncode == 1
    assert result.stdout == ""
    said = " ".join(result.stderr.split())  # one message, however a terminal would wrap it
    assert "Prometheus does not answer on ns0" in said
    assert "monitoring step on ns0" in said
    assert "Traceback" not in result.stderr


def test_monitoring_off_on_the_head_says_so(netns_hosts, tmp_path) -> None:
    cluster = netns_hosts(1)
    inv = cluster.write_inventory(tmp_path / "inv.py", monitoring=False)
    result = _monitor(inv, "--once")
    assert result.returncode == 1
    assert "monitoring is off on the head (ns0" in result.stderr


DASHBOARDS = Path(fleet.__file__).parent / "dashboards"
LOCAL_FS = re.compile(r"ext4|xfs|btrfs")


def _panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel title, PromQL) of every panel, as Grafana would send it for node
    ns1 over a 1-minute rate window."""
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m").replace("$node", "ns1")
                found.append((path.stem, panel["title"], expr))
    return found


def test_every_dashboard_panel_returns_series_from_the_real_prometheus(monitored) -> None:
    """Every panel of the three dashboards asked of the real Prometheus, fed by the real
    writers: the node collector script (rendered for a temp directory, as the monitoring
    step renders it), validate's verdicts, the trainer's live figures and the NVML
    collector. Slurm's panel needs slurmctld and is asked on the testbed (e2e)."""
    _, inv, tmp = monitored
    now = time.time()
    for host in ("ns0", "ns1"):
        textfiles = tmp / f"textfile-{host}"
        (tmp / f"stamp-{host}").write_text(f"{int(now) - 3600}\n")
        script = render_template(
            "monitoring/node-metrics.j2",
            unit="provision-node-metrics",
            every_s=60,
            out=shlex.quote(str(textfiles / "provision_node.prom")),
            cache=shlex.quote(str(tmp / f"cache-{host}")),
            site_glob=shlex.quote(str(tmp / "venv")) + "/lib/python3*/site-packages",
            backups=True,
            backup_stamp=shlex.quote(str(tmp / f"stamp-{host}")),
            backup_timer=shlex.quote(str(tmp / f"stamp-{host}")),
            schedule="daily",
            mounts=[(shlex.quote(str(tmp)), shlex.quote(str(tmp)))],
            nfs_server=False,
            slurm=False,
            slurm_node=host,
        )
        subprocess.run(["bash", "-c", script], check=True, timeout=60)
    finding = Finding("ns1", "ram_triad_gbs", "", 12.5, "GB/s", 10.0, "pass", "12.5 >= 10")
    (tmp / "textfile-ns1" / "provision_validate.prom").write_text(
        textfile.exposition(NodeResult("ns1", "pass", [finding]), now)
    )
    (tmp / "textfile-ns0" / "provision_train_train-x.prom").write_text(live.exposition("train-x", 12, 3.5, 900.0, now))
    loaded = inventory.load(inv)
    prometheus = fleet.Prometheus(loaded.node("ns0"))
    has_local_fs = bool(LOCAL_FS.search(Path("/proc/1/mounts").read_text()))
    try:
        queries = [q for q in _panel_queries() if "provision_slurm" not in q[2]]
        assert len(queries) >= 25
        deadline = time.monotonic() + 60
        while True:
            empty = [q for q in queries if not prometheus.query(q[2])]
            if not has_local_fs:  # no local filesystem of those types on this machine
                empty = [q for q in empty if "fstype" not in q[2]]
            if not empty or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert empty == []
    finally:
        prometheus.close()


def test_the_training_dashboard_leaves_out_stale_runs_as_the_monitor_does() -> None:
    board = json.loads((DASHBOARDS / "training.json").read_text())
    train = [t["expr"] for p in board["panels"] for t in p["targets"] if "provision_train_" in t["expr"]]
    assert train
    assert all(e.endswith(monitoring.FRESH_TRAIN) for e in train)


def test_off_a_terminal_the_monitor_prints_a_block_per_read_until_ctrl_c(monitored) -> None:
    """Two blocks read, then Ctrl-C: exit 0 within seconds. (Seen once in a loaded CI-like
    run before the fix: a KeyboardInterrupt that landed in an SSH greenlet was dropped by
    gevent's hub and the monitor went on; the signals now only set a flag.)"""
    _, inv, _ = monitored
    proc = subprocess.Popen(
        [sys.executable, "-m", "provision", "monitor", str(inv), "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while sum("fleet from Prometheus on ns0" in line for line in list(lines)) < 2:
            assert time.monotonic() < deadline, "".join(lines) + proc.stderr.read()
            assert proc.poll() is None, "".join(lines) + proc.stderr.read()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert "Traceback" not in proc.stderr.read()


def test_a_host_with_monitoring_off_is_left_out_not_called_down(monitored, tmp_path) -> None:
    cluster, _, _ = monitored
    hosts = [
        (h.name, {**cluster.host_data(h), **({"monitoring": False} if h.name == "ns1" else {})}) for h in cluster.hosts
    ]
    inv = tmp_path / "inv.py"
    inv.write_text(f"nodes = {hosts!r}\n")
    result = _monitor(inv, "--once", "--json")
    assert result.returncode == 0, result.stderr
    assert [n["name"] for n in json.loads(result.stdout)["nodes"]] == ["ns0"]
