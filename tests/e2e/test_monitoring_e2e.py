"""Monitoring on the provisioned testbed: Prometheus on the head (node1, the storage host)
answers on its cluster address with every node's exporter up and provision's alert rules
loaded; provision's own series (versions, NFS mounts, backups) arrive from the textfile
collectors; the exporter listens on the cluster address only, never the management one."""

from __future__ import annotations

import json
import time
from shlex import quote
from typing import Any
from urllib.parse import quote as url_quote

from provision import inventory
from provision.rules import monitoring
from tests.e2e.storage_helpers import sh

SCRAPE_WAIT_S = 120  # a restored snapshot's Prometheus needs a scrape or two after boot


def api(head, path: str) -> Any:
    """GET Prometheus' HTTP API on the head, from the head itself (its cluster address)."""
    url = f"http://{monitoring.host_port(head.cluster_address, monitoring.PROMETHEUS_PORT)}{path}"
    code = f"import urllib.request,sys; sys.stdout.write(urllib.request.urlopen({url!r}, timeout=20).read().decode())"
    return json.loads(sh(head, f"python3 -c {quote(code)}", timeout_s=60))


def query(head, expr: str) -> list[dict[str, Any]]:
    return api(head, f"/api/v1/query?query={url_quote(expr)}")["data"]["result"]


def wait_for(head, expr: str, count: int) -> list[dict[str, Any]]:
    """The query's series once there are ``count`` of them (scrapes take a while)."""
    deadline = time.monotonic() + SCRAPE_WAIT_S
    while True:
        result = query(head, expr)
        if len(result) >= count or time.monotonic() > deadline:
            return result
        time.sleep(5)


def test_prometheus_scrapes_every_node_with_provision_s_series_and_rules(provisioned, testbed):
    cluster = inventory.load(testbed.inventory_path)
    head = monitoring.prometheus_node(cluster)
    assert head is not None
    assert head.name == "node1"
    names = {n.name for n in cluster.nodes}

    up = wait_for(head, 'up{job="node"} == 1', len(names))
    assert {s["metric"]["node"] for s in up} == names, api(head, "/api/v1/targets")

    rules = api(head, "/api/v1/rules")["data"]["groups"]
    loaded = {r["name"] for g in rules for r in g["rules"]}
    assert {"NodeDown", "BackupStale", "NfsMountMissing", "GpuNvmlDown", "SlurmNodeDrained"} <= loaded

    versions = wait_for(head, "provision_versions_info", len(names))
    assert {s["metric"]["node"] for s in versions} == names
    assert all(s["metric"]["torch"].startswith("2.13.0") for s in versions), versions
    assert all(s["metric"]["driver"] == "" for s in versions)  # no GPU on the testbed

    mounts = wait_for(head, "provision_nfs_mount_present", len(names))
    assert mounts, "no NFS mount series"
    assert all(s["value"][1] == "1" for s in mounts), mounts
    assert {s["metric"]["node"] for s in mounts} == names

    # the storage host backs up daily; its interval is what systemd reads in the schedule
    interval = query(head, "provision_backup_interval_seconds")
    assert [(s["metric"]["node"], s["value"][1]) for s in interval] == [("node1", "86400")]

    slurm = wait_for(head, "provision_slurm_node_drained", len(names))
    assert {s["metric"]["node"] for s in slurm} == names


def test_the_exporter_listens_on_the_cluster_address_only(provisioned, testbed):
    cluster = inventory.load(testbed.inventory_path)
    for node in cluster.nodes:
        listening = sh(node, f"ss -Hltn 'sport = :{monitoring.EXPORTER_PORT}'").split()
        local = [w for w in listening if w.endswith(f":{monitoring.EXPORTER_PORT}")]
        assert local == [monitoring.host_port(node.cluster_address, monitoring.EXPORTER_PORT)], listening
    # and from the head, the other node's exporter answers on its cluster address
    head, other = cluster.nodes[0], cluster.nodes[1]
    url = f"http://{monitoring.host_port(other.cluster_address, monitoring.EXPORTER_PORT)}/metrics"
    code = f"import urllib.request; print(len(urllib.request.urlopen({url!r}, timeout=20).read()))"
    assert int(sh(head, f"python3 -c {quote(code)}")) > 1000
