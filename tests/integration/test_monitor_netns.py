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
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provision import inventory, resources
from provision.monitoring import gpu_collector
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
    assert "Prometheus does not answer on ns0" in result.stderr
    assert "monitoring step" in result.stderr
    assert "Traceback" not in result.stderr


def test_monitoring_off_on_the_head_says_so(netns_hosts, tmp_path) -> None:
    cluster = netns_hosts(1)
    inv = cluster.write_inventory(tmp_path / "inv.py", monitoring=False)
    result = _monitor(inv, "--once")
    assert result.returncode == 1
    assert "monitoring is off on the head (ns0" in result.stderr
