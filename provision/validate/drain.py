"""`validate --drain`: the verdicts applied to Slurm through the head node. Node states come
from provision.scheduler; the drains, resumes and weights go through scontrol.

Whose drain is whose: provision's reasons start with ``provision:``; validate's with
``provision: validate:``, the node health check's with ``provision: health:``
(templates/slurm/health.sh.j2). Each lifts only its own: validate resumes a node it drained
and leaves a health-check drain to the health check (which would drain the node again within
a minute) and an admin's drain to the admin; the health check leaves validate's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from provision import remote
from provision.inventory import Cluster, Node
from provision.scheduler import SlurmState
from provision.validate.records import NodeResult

PREFIX = "provision:"
VALIDATE_PREFIX = "provision: validate:"
HEALTH_PREFIX = "provision: health:"
REASON_MAX = 200  # characters of a drain reason (sinfo shows them whole; keep them readable)
DEADLINE_S = 60  # the batch of scontrol updates on the head


@dataclass(frozen=True)
class Action:
    """What `validate --drain` does to one node, and why."""

    node: str
    kind: str  # drain, resume, weight, leave
    detail: str  # the drain reason, the new weight, or why it is left
    command: str = ""  # the scontrol command (empty for leave)


def evidence(result: NodeResult, run: str) -> str:
    """A failing node's drain reason: its failing findings, then the run they came from."""
    failed = [f for f in result.findings if f.verdict == "fail"]
    said = "; ".join(f"{f.metric}{f'[{f.device}]' if f.device else ''} {f.reason}" for f in failed)
    said = said or "; ".join(result.errors) or "failed"
    tail = f" (validate run {run})"
    text = f"{VALIDATE_PREFIX} {said}"
    if len(text) + len(tail) > REASON_MAX:
        text = text[: REASON_MAX - len(tail) - 3].rstrip() + "..."
    # One line, no control characters: the reason is a host's output made into a command.
    return "".join(c if c.isprintable() else " " for c in text + tail)


def plan(
    results: list[NodeResult], states: dict[str, SlurmState], run: str, warn_weights: dict[str, int]
) -> list[Action]:
    """The actions for judged nodes: drain a failed one (unless someone else drained it);
    resume one validate drained that now passes or warns; give a warning node its
    ``warn_weights`` entry (its slurm_warn_weight setting) and a passing one Weight 1, where
    that changes anything."""
    actions = []
    for r in results:
        s = states.get(r.node)
        if s is None:
            actions.append(Action(r.node, "leave", "not in Slurm (not a compute node, or not in slurm.conf yet)"))
            continue
        update = f"scontrol update NodeName={shlex.quote(r.node)}"
        if r.verdict == "fail":
            reason = evidence(r, run)
            if s.drained and s.reason.startswith(HEALTH_PREFIX):
                actions.append(Action(r.node, "leave", f"drained by the health check: {s.reason}"))
            elif s.drained and not s.reason.startswith(VALIDATE_PREFIX):
                actions.append(Action(r.node, "leave", f"drained by someone else: {s.reason}"))
            elif not (s.drained and s.reason == reason):
                actions.append(Action(r.node, "drain", reason, f"{update} State=DRAIN Reason={shlex.quote(reason)}"))
            continue
        if r.verdict not in ("pass", "warn"):
            continue
        if s.drained and s.reason.startswith(VALIDATE_PREFIX):
            actions.append(Action(r.node, "resume", f"was: {s.reason}", f"{update} State=RESUME"))
        weight = warn_weights.get(r.node, 1) if r.verdict == "warn" else 1
        if s.weight != weight:
            actions.append(Action(r.node, "weight", str(weight), f"{update} Weight={weight}"))
    return actions


def head_of(cluster: Cluster) -> Node:
    return cluster.head_node()[0]


def apply(cluster: Cluster, actions: list[Action]) -> list[str]:
    """Run the actions' commands on the head, one after another in one call; the problems,
    one per action whose command failed (an empty list when all went through)."""
    commands = [a for a in actions if a.command]
    if not commands:
        return []
    # Each command's status on a line of its own, so one failure names its node.
    script = "; ".join(f"{a.command} >/dev/null 2>&1; echo {shlex.quote(a.node)} $?" for a in commands)
    head = head_of(cluster)
    result = remote.run(head, script, timeout=DEADLINE_S)
    codes = dict(line.rsplit(" ", 1) for line in result.stdout.splitlines() if " " in line)
    return [
        f"{a.node}: {a.kind} failed on {head.name} (scontrol exit {codes.get(a.node, 'none: the head did not answer')})"
        for a in commands
        if codes.get(a.node) != "0"
    ]
