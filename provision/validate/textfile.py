"""validate's verdicts for Prometheus: each node's last verdict and every finding's value
and expectation, written on the node into the node exporter's textfile directory
(provision.rules.monitoring), where the ValidateFailed alert and the dashboards read them.

Written whole (a temp file, then rename) by root over SSH after the verdicts are in; a
host without the monitoring step is skipped, and a host that cannot be written costs only
its own series, never the run's verdicts or exit code."""

from __future__ import annotations

import math

from provision import remote
from provision.inventory import Cluster, Node
from provision.rules import monitoring as layout
from provision.validate.records import NodeResult

FILE = f"{layout.TEXTFILE_DIR}/provision_validate.prom"
WRITE_S = 30  # one host's write

_HELP = {
    "provision_validate_timestamp_seconds": "When the last provision validate judged this node.",
    "provision_validate_node_pass": "1 unless the node's last validate verdict is fail.",
    "provision_validate_node_verdict": "The node's last validate verdict (the label), always 1.",
    "provision_validate_value": "A finding's measured value, in the unit its label names.",
    "provision_validate_expected": "The floor (or ceiling) the finding was held to.",
    "provision_validate_finding": "A finding's verdict (the label), always 1.",
}


def exposition(result: NodeResult, at: float) -> str:
    """One node's series in the text format; a metric's lines stand together."""
    families: dict[str, list[str]] = {name: [] for name in _HELP}

    def add(name: str, labels: dict[str, str], value: float) -> None:
        pairs = ",".join(f'{k}="{layout.label_value(v)}"' for k, v in labels.items())
        families[name].append(f"{name}{{{pairs}}} {value!r}" if pairs else f"{name} {value!r}")

    add("provision_validate_timestamp_seconds", {}, float(int(at)))
    add("provision_validate_node_pass", {}, 0.0 if result.verdict == "fail" else 1.0)
    add("provision_validate_node_verdict", {"verdict": result.verdict}, 1.0)
    for f in result.findings:
        labels = {"metric": f.metric, "device": f.device, "unit": f.unit}
        if f.value is not None and math.isfinite(f.value):
            add("provision_validate_value", labels, float(f.value))
        if f.expectation is not None and math.isfinite(f.expectation):
            add("provision_validate_expected", labels, float(f.expectation))
        add("provision_validate_finding", {"metric": f.metric, "device": f.device, "verdict": f.verdict}, 1.0)
    lines = []
    for name, series in families.items():
        if series:
            lines += [f"# HELP {name} {_HELP[name]}", f"# TYPE {name} gauge", *series]
    return "\n".join(lines) + "\n"


def publish(cluster: Cluster, results: list[NodeResult], at: float) -> dict[str, str]:
    """Write each judged node's series on it; returns host -> why not, for the hosts where
    a write failed (a host without monitoring is not one of them)."""
    return write_each(cluster, FILE, {r.node: exposition(r, at) for r in results})


def write_each(cluster: Cluster, path: str, texts: dict[str, str]) -> dict[str, str]:
    """Write ``texts[host]`` to ``path`` (in the textfile directory) on each host named,
    in parallel, each within WRITE_S; host -> why not where a write failed. A host without
    the monitoring step (no textfile directory) is skipped, not failed. `provision status`
    writes its drift counts through this too."""
    nodes = [n for n in cluster.nodes if n.name in texts]

    def write(node: Node) -> str | None:
        done = remote.run(
            node, remote.as_root(node.ssh.user, layout.write_command(path, texts[node.name])), timeout=WRITE_S
        )
        if done.ok or done.exited == layout.NOT_MONITORED:
            return None
        return (done.stderr.strip() or f"exit {done.exited}")[:300]

    answers = remote.on_all(nodes, write)
    return {name: why for name, why in answers.items() if why}
