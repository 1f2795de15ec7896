"""The fleet as Prometheus on the head sees it: the queries `provision monitor` asks, and
their answers read into one view per node. Prometheus is reached through the head's SSH
connection (``remote.http_get``): it listens on the head's cluster address only.

Every answer is checked by shape before it is used: a value that is not a number, a
series without its node label or a body that is not Prometheus' JSON is left out or
reported, never trusted."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote

from provision import remote
from provision.inventory import Cluster, Node
from provision.rules import monitoring as layout

QUERY_S = 20  # one API request's deadline
# (field, PromQL): one number per node (the ``node`` label Prometheus' scrape adds)
NODE_QUERIES: dict[str, str] = {
    "up": 'up{job="node"}',
    "cpu": '1 - avg by (node) (rate(node_cpu_seconds_total{mode="idle"}[1m]))',
    "memory": "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes",
    "disk": (
        'max by (node) (1 - node_filesystem_avail_bytes{fstype=~"ext4|xfs|btrfs"}'
        ' / node_filesystem_size_bytes{fstype=~"ext4|xfs|btrfs"})'
    ),
    "net_rx": 'sum by (node) (rate(node_network_receive_bytes_total{device!="lo"}[1m]))',
    "net_tx": 'sum by (node) (rate(node_network_transmit_bytes_total{device!="lo"}[1m]))',
    "slurm_drained": "provision_slurm_node_drained",
}
# (field, PromQL): one number per GPU (``node`` and ``gpu`` labels)
GPU_QUERIES: dict[str, str] = {
    "utilization": "provision_gpu_utilization_ratio",
    "memory_used": "provision_gpu_memory_used_bytes",
    "temperature": "provision_gpu_temperature_celsius",
    "power": "provision_gpu_power_watts",
}
# (field, PromQL): the running training job, rank 0's node (``node`` and ``run`` labels);
# figures older than TRAIN_FRESH_S belong to a run that ended or hung and are left out.
TRAIN_QUERIES: dict[str, str] = {
    "step": f"provision_train_step {layout.FRESH_TRAIN}",
    "loss": f"provision_train_loss {layout.FRESH_TRAIN}",
    "tokens_per_second": f"provision_train_tokens_per_second {layout.FRESH_TRAIN}",
}


class MonitorError(Exception):
    """Monitoring cannot be read: not provisioned, or Prometheus does not answer."""


@dataclass
class GpuView:
    index: str
    utilization: float | None = None
    memory_used: float | None = None
    temperature: float | None = None
    power: float | None = None


@dataclass
class NodeView:
    name: str
    up: bool | None = None  # None: Prometheus has no target for it
    cpu: float | None = None  # busy share, 0-1
    memory: float | None = None  # used share, 0-1
    disk: float | None = None  # fullest local filesystem's used share, 0-1
    net_rx: float | None = None  # bytes/s
    net_tx: float | None = None
    slurm: str | None = None  # Slurm state where Slurm runs
    gpus: list[GpuView] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)  # alert names firing for this node


@dataclass
class TrainView:
    run: str
    node: str
    step: float | None = None
    loss: float | None = None
    tokens_per_second: float | None = None


@dataclass
class FleetView:
    head: str
    at: float
    nodes: list[NodeView]
    training: list[TrainView]
    alerts: list[dict[str, str]]  # every firing alert: name, node, summary

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any) -> float | None:
    """A sample's value ("0.25", "NaN") as a finite float, else None."""
    try:
        number = float(value[1])
    except (TypeError, ValueError, IndexError):
        return None
    return number if math.isfinite(number) else None


class Prometheus:
    """Prometheus' HTTP API on the head, over the head's SSH connection."""

    def __init__(self, head: Node, conn: Any = None) -> None:
        self.head = head
        self.conn = conn or remote.connection(head)

    def close(self) -> None:
        self.conn.close()

    def get(self, path: str) -> Any:
        answer = remote.http_get(
            self.conn, self.head.name, self.head.cluster_address, layout.PROMETHEUS_PORT, path, QUERY_S
        )
        try:
            data = json.loads(answer.body)
        except ValueError as e:
            raise MonitorError(f"{self.head.name}: Prometheus answered HTTP {answer.status} with no JSON") from e
        if not isinstance(data, dict) or data.get("status") != "success":
            error = data.get("error") if isinstance(data, dict) else None
            raise MonitorError(f"{self.head.name}: Prometheus refused {path.split('?')[0]}: {error!s:.200}")
        return data.get("data")

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get(f"/api/v1/query?query={quote(expr, safe='')}")
        result = data.get("result") if isinstance(data, dict) else None
        return [s for s in result if isinstance(s, dict) and isinstance(s.get("metric"), dict)] if result else []


def _by_node(series: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for s in series:
        name = s["metric"].get("node")
        if isinstance(name, str):
            out.setdefault(name, []).append(s)
    return out


def read(cluster: Cluster, prometheus: Prometheus) -> FleetView:
    """Every node's figures, the running training job and the firing alerts."""
    nodes = {n.name: NodeView(n.name) for n in cluster.nodes}
    _node_figures(prometheus, nodes)
    _gpu_figures(prometheus, nodes)
    alerts = _alerts(prometheus, nodes)
    return FleetView(prometheus.head.name, time.time(), list(nodes.values()), _training(prometheus), alerts)


def _node_figures(prometheus: Prometheus, nodes: dict[str, NodeView]) -> None:
    for key, expr in NODE_QUERIES.items():
        for name, series in _by_node(prometheus.query(expr)).items():
            view = nodes.get(name)
            if view is None:  # a node not in this inventory (another cluster's)
                continue
            value = _number(series[0].get("value"))
            if key == "up":
                view.up = value == 1
            elif key == "slurm_drained":
                state = series[0]["metric"].get("state")
                view.slurm = str(state)[:40] if state else None
            else:
                setattr(view, key, value)


def _gpu_figures(prometheus: Prometheus, nodes: dict[str, NodeView]) -> None:
    gpus: dict[tuple[str, str], GpuView] = {}
    for key, expr in GPU_QUERIES.items():
        for s in prometheus.query(expr):
            name, index = s["metric"].get("node"), s["metric"].get("gpu")
            if name in nodes and isinstance(index, str) and index.isdigit():
                gpu = gpus.setdefault((name, index), GpuView(index))
                setattr(gpu, key, _number(s.get("value")))
    for (name, _), gpu in sorted(gpus.items(), key=lambda item: (item[0][0], int(item[0][1]))):
        nodes[name].gpus.append(gpu)


def _training(prometheus: Prometheus) -> list[TrainView]:
    runs: dict[tuple[str, str], TrainView] = {}
    for key, expr in TRAIN_QUERIES.items():
        for s in prometheus.query(expr):
            name, run = s["metric"].get("node"), s["metric"].get("run")
            if isinstance(name, str) and isinstance(run, str):
                train = runs.setdefault((name, run), TrainView(run[:80], name))
                setattr(train, key, _number(s.get("value")))
    return list(runs.values())


def _alerts(prometheus: Prometheus, nodes: dict[str, NodeView]) -> list[dict[str, str]]:
    """The firing alerts, each also listed on its node."""
    data = prometheus.get("/api/v1/alerts")
    alerts = []
    for alert in data.get("alerts", []) if isinstance(data, dict) else []:
        if not isinstance(alert, dict) or alert.get("state") != "firing":
            continue
        labels, annotations = alert.get("labels"), alert.get("annotations")
        labels = labels if isinstance(labels, dict) else {}
        annotations = annotations if isinstance(annotations, dict) else {}
        entry = {
            "name": str(labels.get("alertname", ""))[:80],
            "node": str(labels.get("node", ""))[:80],
            "summary": str(annotations.get("summary", ""))[:300],
        }
        alerts.append(entry)
        if entry["node"] in nodes:
            nodes[entry["node"]].alerts.append(entry["name"])
    return alerts


def head_of(cluster: Cluster) -> Node:
    """The host that runs Prometheus, or MonitorError saying why there is none."""
    head = layout.prometheus_node(cluster)
    if head is None:
        name = cluster.head_node()[0].name
        raise MonitorError(f"monitoring is off on the head ({name}: monitoring = false): nothing to read")
    return head
