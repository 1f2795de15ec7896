"""Gather what `provision status` shows: facts from every host, then the pure judge."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from provision import scheduler
from provision.facts.stack import StackFact
from provision.facts.system import Os
from provision.inventory import Cluster
from provision.status.judge import HostStatus, expected_mounts, format_age, judge_host
from provision.validate import history


def gather_status(cluster: Cluster, on_event: Callable[[str, str], None] = lambda h, t: None) -> list[HostStatus]:
    from provision.engine import gather_facts

    statuses = []
    # Each host's fact arguments differ (its own venv and mounts), so facts are gathered
    # per distinct argument set; hosts sharing settings share one pass.
    by_args: dict[tuple[Any, ...], list[Any]] = {}
    for node in cluster.nodes:
        key = (node.settings.venv_path, tuple(expected_mounts(node, cluster)))
        by_args.setdefault(key, []).append(node)
    found: dict[str, dict[str, Any]] = {}
    unreachable: dict[str, str] = {}
    for (venv_path, mounts), nodes in by_args.items():
        stack_args = {"venv_path": venv_path, "mount_points": mounts}
        wanted: dict[str, tuple[type, dict[str, Any]]] = {"os": (Os, {}), "stack": (StackFact, stack_args)}
        result = gather_facts(nodes, wanted, on_event=on_event)
        found.update(result.facts)
        unreachable.update(result.failed)
    for node in cluster.nodes:
        facts = found.get(node.name)
        if facts is None:
            statuses.append(HostStatus(node.name, False, error=unreachable.get(node.name, "no answer")))
            continue
        os_info = facts["os"]
        status = judge_host(node, cluster, facts["stack"], os_info.pretty_name, os_info.kernel)
        status.last_validate = last_validate(node.name, time.time())
        statuses.append(status)
    return statuses


def last_validate(host: str, now: float) -> str | None:
    """The host's last validate verdict and its age, from validate's history on this
    controller (validate records every run there); None when it was never validated."""
    last = history.last_run(host)
    if last is None:
        return None
    verdict, created = last
    try:
        age = now - datetime.fromisoformat(created).timestamp()
    except ValueError:
        return f"{verdict} ({created})"
    return f"{verdict}, {format_age(age)} ago"


def gather_slurm(cluster: Cluster, statuses: list[HostStatus]) -> scheduler.SlurmView | None:
    """Slurm's node states and queue from the head (one call, bounded), each host's state
    set on its row; None where no host runs Slurm. A head that cannot say is reported in the
    view, not raised: the rest of the status still stands."""
    if not cluster.compute_nodes():
        return None
    seen = scheduler.view(cluster)
    for s in statuses:
        state = seen.nodes.get(s.name)
        s.slurm = state.text() if state else None
    return seen
