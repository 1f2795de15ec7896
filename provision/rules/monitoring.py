"""Monitoring: which host runs Prometheus, where provision's files live on the hosts, and
the Prometheus configuration generated from the inventory. Pure decisions on the
inventory; the monitoring step (provision.deploys.monitoring) installs this layout, and
validate, the trainer's live series and `provision monitor` read it.

Every node runs the distribution's ``prometheus-node-exporter``, listening on its cluster
address only (never the management address that SSH uses), with its textfile collector
reading ``TEXTFILE_DIR``. provision's own series reach Prometheus through that directory:
the node collector (backups, versions, Slurm state, NFS mounts), the NVML collector on GPU
nodes, validate's verdicts and a running training job's step. The directory is root's
(0755) all the way up: the exporter's account reads it, and nothing that a node's
unprivileged user or the exporter can write is ever read by root.

The head (``Cluster.head_node()``: the head group, else the storage host, else the first
host) runs Prometheus on its cluster address, scraping every node's exporter.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from provision.inventory import Cluster, Node

EXPORTER_PACKAGE = "prometheus-node-exporter"
EXPORTER_SERVICE = "prometheus-node-exporter.service"
PROMETHEUS_PACKAGE = "prometheus"
PROMETHEUS_SERVICE = "prometheus.service"
EXPORTER_PORT = 9100
PROMETHEUS_PORT = 9090

# Root-owned all the way up (not under /var/lib/prometheus, which the package gives to the
# prometheus account): root's writers here must not follow a link that account placed.
TEXTFILE_DIR = "/var/lib/provision/metrics"

# Our own configuration beside the package's (the package's prometheus.yml is a conffile
# that dpkg would ask about); the drop-ins point the services at it.
CONFIG = "/etc/prometheus/provision.yml"
RULES = "/etc/prometheus/provision-alerts.yml"
# The follow-up stamp (facts/stamps) of Prometheus' check-and-restart after its files change.
PROMETHEUS_STAMP = "monitoring-prometheus"
EXPORTER_DROP_IN = "/etc/systemd/system/prometheus-node-exporter.service.d/provision.conf"
PROMETHEUS_DROP_IN = "/etc/systemd/system/prometheus.service.d/provision.conf"
STORAGE = "/var/lib/prometheus/metrics2"  # the package's own data directory

NODE_COLLECTOR = "/usr/local/libexec/provision-node-metrics"
NODE_COLLECTOR_UNIT = "provision-node-metrics"  # .service and .timer
NODE_COLLECTOR_EVERY_S = 60
# What the node collector computes only when its input changes (the backup schedule's
# interval): root's, beside the textfile directory, never read by the exporter.
NODE_COLLECTOR_CACHE = "/var/lib/provision/node-metrics.cache"
GPU_COLLECTOR = "/usr/local/libexec/provision-gpu-metrics.py"
GPU_COLLECTOR_UNIT = "provision-gpu-metrics"
GPU_COLLECTOR_EVERY_S = 30
GPU_COLLECTOR_TIMEOUT_S = 40  # one pass of NVML queries; past it the collector says NVML is down

# DCGM, from NVIDIA's CUDA repository, on hosts uses_dcgm() names: the host engine
# (nvidia-dcgm, on localhost only: it can change GPU settings) and the exporter, on the
# cluster address, reading provision's field list and connected to that host engine.
DCGM_PACKAGES = ["datacenter-gpu-manager-4-core", "datacenter-gpu-manager-exporter"]
DCGM_SERVICE = "nvidia-dcgm.service"
DCGM_EXPORTER_SERVICE = "nvidia-dcgm-exporter.service"
DCGM_PORT = 5555  # the host engine's default
DCGM_EXPORTER_PORT = 9400
DCGM_DROP_IN = "/etc/systemd/system/nvidia-dcgm.service.d/provision.conf"
DCGM_EXPORTER_DROP_IN = "/etc/systemd/system/nvidia-dcgm-exporter.service.d/provision.conf"
DCGM_COUNTERS = "/etc/dcgm-exporter/provision-counters.csv"
DCGM_RULES = "/etc/prometheus/provision-dcgm.yml"

SCRAPE_S = 15
# The trainer's live figures are rewritten every LIVE_EVERY_S; older than TRAIN_FRESH_S
# they belong to a run that ended or hung, and the monitor and dashboards leave them out.
LIVE_EVERY_S = 15
TRAIN_FRESH_S = 60
FRESH_TRAIN = f"and on(node, run) (time() - provision_train_updated_timestamp_seconds < {TRAIN_FRESH_S})"


def prometheus_node(cluster: Cluster) -> Node | None:
    """The host that runs Prometheus: the head, when its monitoring is on."""
    head, _ = cluster.head_node()
    return head if head.settings.monitoring else None


def monitored(cluster: Cluster) -> list[Node]:
    """Every host whose exporter Prometheus scrapes (all hosts, not only a --limit's)."""
    return [n for n in cluster.all_nodes if n.settings.monitoring]


def declared_gpu_host(node: Node) -> bool:
    """The inventory says this host has GPUs (the nvidia step runs there whatever it finds)."""
    return node.settings.nvidia != "skip" and (node.settings.nvidia == "force" or node.has_role("gpu_nodes"))


def uses_dcgm(node: Node) -> bool:
    """DCGM, not the NVML collector, reports this host's GPUs. Decided from the inventory
    alone, so that the head's scrape configuration knows it without asking the host: on
    declared GPU hosts, whose nvidia step installs NVIDIA's repository (where DCGM comes
    from), unless ``gpu_telemetry = "nvml"``. A host whose GPUs are only found by lspci
    gets the NVML collector. (The nvidia step adds NVIDIA's repository unless the driver
    is Canonical's and nothing else is wanted from it: cuda_toolkit_version null, no NCCL,
    no container toolkit; the monitoring step then refuses the host, naming the setting.)"""
    return node.settings.monitoring and node.settings.gpu_telemetry == "auto" and declared_gpu_host(node)


def dcgm_args() -> list[str]:
    # The package's own command line (run as root, dropping to its service account), bound
    # to localhost: a host engine on the network would let any host there change GPU
    # settings.
    return ["-n", "--service-account", "nvidia-dcgm", "--bind-interface", "127.0.0.1", "--port", str(DCGM_PORT)]


def dcgm_exporter_args(node: Node) -> list[str]:
    return [
        "-f",
        DCGM_COUNTERS,
        "-a",
        host_port(node.cluster_address, DCGM_EXPORTER_PORT),
        "-r",
        f"127.0.0.1:{DCGM_PORT}",
    ]


def host_port(address: str, port: int) -> str:
    """address:port, with an IPv6 address in brackets."""
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]:{port}"
    except ValueError:
        pass  # a host name
    return f"{address}:{port}"


def exporter_args(node: Node) -> list[str]:
    # Only the collectors asked for: the exporter was two thirds of monitoring's CPU on a
    # node with its default thirty-odd (BENCHMARKS.md, issue 18).
    collectors = sorted({*node.settings.exporter_collectors, "textfile"})
    return [
        f"--web.listen-address={host_port(node.cluster_address, EXPORTER_PORT)}",
        "--collector.disable-defaults",
        *[f"--collector.{name}" for name in collectors],
        f"--collector.textfile.directory={TEXTFILE_DIR}",
    ]


def prometheus_args(node: Node) -> list[str]:
    return [
        f"--config.file={CONFIG}",
        f"--storage.tsdb.path={STORAGE}",
        f"--storage.tsdb.retention.time={node.settings.prometheus_retention}",
        f"--web.listen-address={host_port(node.cluster_address, PROMETHEUS_PORT)}",
    ]


def scrape_config(cluster: Cluster) -> str:
    """Prometheus' configuration: every monitored node's exporter, labelled with its
    inventory name (``node``), Prometheus itself, and the DCGM exporters with the rules
    that put their fields in provision's names (provision.rules.dcgm). Written as JSON, which is YAML: no
    value from the inventory can change the file's structure."""
    head = prometheus_node(cluster)
    nodes = monitored(cluster)
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [RULES, DCGM_RULES],
        "scrape_configs": [
            {
                "job_name": "prometheus",
                "static_configs": [
                    {
                        "targets": [host_port(head.cluster_address, PROMETHEUS_PORT)] if head else [],
                        "labels": {"node": head.name if head else ""},
                    }
                ],
            },
            {
                "job_name": "node",
                "static_configs": [
                    {"targets": [host_port(n.cluster_address, EXPORTER_PORT)], "labels": {"node": n.name}}
                    for n in nodes
                ],
            },
        ],
    }
    dcgm = [n for n in nodes if uses_dcgm(n)]
    if dcgm:
        config["scrape_configs"].append(
            {
                "job_name": "dcgm",
                "static_configs": [
                    {"targets": [host_port(n.cluster_address, DCGM_EXPORTER_PORT)], "labels": {"node": n.name}}
                    for n in dcgm
                ],
            }
        )
    header = "# Written by provision's monitoring step; changes here are replaced.\n"
    return header + json.dumps(config, indent=2) + "\n"


_UNSAFE_NAME = re.compile(r"[^a-zA-Z0-9_]")


def label_value(value: object) -> str:
    """A label value in the text exposition format: backslash, double quote and newline
    escaped, so a value read from a host or a file cannot end the label or the line."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_name(name: str) -> str:
    """A metric name part from a free string (a validate metric's key): [a-zA-Z0-9_] only."""
    return _UNSAFE_NAME.sub("_", name)


def write_command(path: str, text: str) -> str:
    """A shell command that replaces ``path`` in TEXTFILE_DIR with ``text`` whole (a temp
    file beside it, then rename), so the exporter never reads half a file. Run as root.
    Exits NOT_MONITORED, writing nothing, on a host without the directory."""
    from shlex import quote

    if not path.startswith(TEXTFILE_DIR + "/") or "/" in path[len(TEXTFILE_DIR) + 1 :]:
        raise ValueError(f"{path} is not a file directly in {TEXTFILE_DIR}")
    tmp = quote(f"{path}.tmp")
    absent = f"test -d {quote(TEXTFILE_DIR)} || exit {NOT_MONITORED}"
    return f"{absent}; umask 022 && printf %s {quote(text)} > {tmp} && mv -f {tmp} {quote(path)}"


NOT_MONITORED = 3  # write_command's exit status where the monitoring step has not run
