"""Nodes joining and leaving Slurm, for the slurm step (deploys/slurm/__init__.py): which nodes the
controller's slurm.conf holds that this pass's does not (removed from the inventory, or out of
the compute nodes), what runs on them, and the head's drains and resumes for them.

A leaving node is drained first (rules.slurm.REMOVED_REASON). While jobs run on it, or Slurm
cannot list them, it stays in slurm.conf: the restart that drops a node from the file ends its
jobs. The first pass that finds it empty drops it. A node back in the inventory while still
drained as removed is resumed.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyinfra.operations import server

from provision import state
from provision.engine import each_connected_host, note, once_per_pass
from provision.facts.probes import LeavingNode, SlurmLeaving, SlurmRoster
from provision.inventory import Cluster
from provision.rules import slurm as rules


def _kept_file(cluster: Cluster) -> Path:
    return state.inventory_dir(cluster.path) / "slurm-kept.json"


def roster(cluster: Cluster, computes: tuple[str, ...]) -> SlurmRoster | None:
    """Nodes the controller's slurm.conf holds that this pass's does not (removed from the
    inventory, or no longer compute nodes), with their jobs, and compute nodes coming back
    from such a removal: asked of the head once per pass (SlurmLeaving). None where the head
    is not in the pass or did not answer: then nobody knows who leaves, and nothing is
    decided (last_kept keeps the file as the head last had it)."""
    head = cluster.head_node()[0]

    def read() -> SlurmRoster | None:
        found = each_connected_host(
            lambda h: (
                h.get_fact(SlurmLeaving, computes=computes, removed=rules.REMOVED_PREFIX)
                if h.name == head.name
                else None
            )
        )
        seen = found.get(head.name)
        if seen is not None:
            state.write_atomic(_kept_file(cluster), json.dumps(kept_lines(seen.leaving), indent=1))
        return seen

    return once_per_pass("slurm roster", read)


def last_kept(cluster: Cluster) -> dict[str, str]:
    """The leaving nodes the head's last answer kept in slurm.conf, with their lines: what a
    pass without the head writes, so every node's file stays the head's."""
    try:
        data = json.loads(_kept_file(cluster).read_text())
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def kept_lines(gone: dict[str, LeavingNode]) -> dict[str, str]:
    """Leaving nodes that stay in slurm.conf in this run, with their lines: those with jobs
    (a node dropped from slurm.conf takes its running jobs with it at the restart) or whose
    jobs Slurm could not list. They stay drained until a later run finds them empty."""
    return {name: node.line for name, node in gone.items() if node.jobs is None or node.jobs}


def drain_leaving(gone: dict[str, LeavingNode], kept: dict[str, str]) -> None:
    """On the head, before its files change: every leaving node drained (REMOVED_REASON);
    one dropped in this run checked for jobs started since the pass looked. A kept node
    already drained as removed needs nothing (the run changes nothing while it waits)."""
    for name, found in sorted(gone.items()):
        dropping = name not in kept
        if dropping or not found.reason.startswith(rules.REMOVED_PREFIX):
            server.shell(
                name=f"Slurm: drain {name} (leaving Slurm)",
                commands=[rules.drain_leaving(name, dropping=dropping)],
                _timeout=3 * rules.SLURM_CALL_S + 30,
            )
        if dropping:
            note(
                f"slurm: {name} leaves slurm.conf (no longer a compute node in the inventory; no jobs on it); "
                "its slurmd stops on the next up"
            )
        elif found.jobs is None:
            note(f"slurm: {name} stays in slurm.conf, drained: Slurm could not list its jobs; run up again")
        else:
            note(
                f"slurm: {name} stays in slurm.conf, drained, until its jobs end ({' '.join(found.jobs)}); "
                "run up again then"
            )


def lost_roles(seen: SlurmRoster | None, name: str, units: list[str]) -> list[str]:
    """Of the daemons this host has no role for, those to stop now. Nothing while the head
    did not answer (who leaves is unknown; another head may not be running yet). A node
    leaving in this pass keeps its slurmd: the head drains it and checks its jobs first, and
    hosts do not wait for each other within a pass; the next pass stops it."""
    if seen is None:
        return []
    return [u for u in units if not (u == rules.COMPUTE_PACKAGE and name in seen.leaving)]


def resume_returning(returning: list[str]) -> None:
    """On the head, after its files: a node removed while it had jobs, now a compute node
    again, has its removal's drain lifted (SlurmLeaving names only nodes with that reason,
    and the command reads it again first)."""
    if returning:
        server.shell(
            name=f"Slurm: resume {', '.join(returning)} (back in the inventory)",
            commands=[rules.resume_returning(name) for name in returning],
            _timeout=len(returning) * 2 * rules.SLURM_CALL_S + 30,
        )
