"""`validate --drain`: the verdicts applied to Slurm through the head node. Node states come
from provision.scheduler; the drains, resumes and weights go through scontrol.

Whose drain is whose is in its reason (provision/rules/slurm.py says so once): validate's
start with ``provision: validate:``, the node health check's with ``provision: health:``.
Validate drains a failed node that has no reason, its own, or the health check's (taken
over); any other reason, in any state, is someone else's and stays. It resumes only its own
drains.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from provision import remote
from provision.inventory import Cluster
from provision.rules.slurm import HEALTH_PREFIX, VALIDATE_PREFIX
from provision.scheduler import DEADLINE_S, SlurmState
from provision.validate.records import NodeResult

REASON_MAX = 200  # characters of a drain reason (sinfo shows them whole; keep them readable)


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
            if not _ours_to_drain(s.reason):
                actions.append(Action(r.node, "leave", f"{s.state}, someone else's: {s.reason}"))
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


def _ours_to_drain(reason: str) -> bool:
    """Whether validate may set its own reason over this one: none yet, validate's own, or
    the health check's (taken over: the health check lifts only its own reasons, so a node
    that failed validation is not put back in service when, say, NFS recovers). Any other
    reason, in any state (an admin's DOWN "RMA pending" as much as a drain), stays."""
    return reason in ("", "none") or reason.startswith((VALIDATE_PREFIX, HEALTH_PREFIX))


def apply(cluster: Cluster, actions: list[Action]) -> list[str]:
    """Run the actions' commands on the head, one after another in one call; the problems,
    one per action whose command failed (an empty list when all went through)."""
    commands = [a for a in actions if a.command]
    if not commands:
        return []
    # Each command's status on a line of its own, keyed by its place in the list (a node
    # can have two actions: resume and weight), so one failure names its node and action.
    script = "; ".join(f"{a.command} >/dev/null 2>&1; echo {i} $?" for i, a in enumerate(commands))
    head = cluster.head_node()[0]
    result = remote.run(head, script, timeout=DEADLINE_S)
    codes = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    return [
        f"{a.node}: {a.kind} failed on {head.name} "
        f"(scontrol exit {codes.get(str(i), 'none: the head did not answer').strip()})"
        for i, a in enumerate(commands)
        if codes.get(str(i), "").strip() != "0"
    ]
