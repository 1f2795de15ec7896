"""Gather what `provision status` shows: facts from every host, then the pure judge."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from provision.facts.stack import StackFact
from provision.facts.system import Os
from provision.inventory import Cluster
from provision.status import HostStatus, expected_mounts, judge_host


def gather_status(cluster: Cluster, on_event: Callable[[str, str], None] = lambda h, t: None) -> list[HostStatus]:
    from provision.runner import gather_facts

    statuses = []
    # Each host's fact arguments differ (its own venv and mounts), so facts are gathered
    # per distinct argument set; hosts sharing settings share one pass.
    by_args: dict[tuple, list] = {}
    for node in cluster.nodes:
        key = (node.settings.venv_path, tuple(expected_mounts(node, cluster)))
        by_args.setdefault(key, []).append(node)
    found: dict[str, dict] = {}
    unreachable: dict[str, str] = {}
    for (venv_path, mounts), nodes in by_args.items():
        stack_args = {"venv_path": venv_path, "mount_points": mounts}
        wanted: dict[str, tuple[type, dict[str, Any]]] = {"os": (Os, {}), "stack": (StackFact, stack_args)}
        result = gather_facts(nodes, wanted, on_event=on_event)
        found.update(result.facts)
        unreachable.update(result.unreachable)
    history = _validate_history()
    for node in cluster.nodes:
        facts = found.get(node.name)
        if facts is None:
            statuses.append(HostStatus(node.name, False, error=unreachable.get(node.name, "no answer")))
            continue
        os_info = facts["os"]
        status = judge_host(node, cluster, facts["stack"], os_info.pretty_name, os_info.kernel)
        status.last_validate = history(node.name)
        statuses.append(status)
    return statuses


def _validate_history() -> Callable[[str], str | None]:
    """The last validate verdict per host, from validate's history when it is recorded."""
    import importlib

    try:
        history = importlib.import_module("provision.validate.history")
    except ImportError:
        return lambda name: None
    last_verdict: Callable[[str], str | None] = getattr(history, "last_verdict", lambda name: None)
    return last_verdict
