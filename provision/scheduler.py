"""Slurm as the controller sees it, through the head node: each node's state, weight and
drain reason (sinfo) and the queue (squeue), read in one call with a deadline. `status`
shows them; `validate --drain` acts on the states (provision/validate/drain.py).

Every value here is a host's output: parsed by type, and only ever shown or compared, never
run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from provision import remote
from provision.inventory import Cluster

SINFO = "sinfo --noheader --Node --format='%N|%T|%w|%E'"
SQUEUE = "squeue --noheader --format='%i|%T|%u|%D|%M|%j'"
QUEUE_SEPARATOR = "--- squeue ---"
DEADLINE_S = 60  # one call on the head


@dataclass(frozen=True)
class SlurmState:
    """One node as sinfo shows it."""

    state: str  # sinfo's %T: idle, allocated, mixed, drained, draining, down, ... (a '*': not responding)
    weight: int  # its current Weight
    reason: str  # drain or down reason; "none" without one

    @property
    def drained(self) -> bool:
        return "drain" in self.state

    def text(self) -> str:
        """As status shows it: the state, and the reason where there is one."""
        return self.state if self.reason in ("", "none") else f"{self.state}: {self.reason}"


@dataclass(frozen=True)
class Job:
    """One job in the queue."""

    id: str
    state: str  # RUNNING, PENDING, ...
    user: str
    nodes: int
    elapsed: str  # Slurm's time format
    name: str


@dataclass(frozen=True)
class SlurmView:
    """The controller's answer, or why there is none."""

    controller: str  # the head's inventory name
    nodes: dict[str, SlurmState] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list)
    error: str | None = None  # why the head could not say (the rest is then empty)


def parse_sinfo(text: str) -> dict[str, SlurmState]:
    """Parse SINFO's lines. A node in several partitions is listed once per partition; the
    first line wins (state, weight and reason are the node's, not the partition's)."""
    nodes: dict[str, SlurmState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) != 4 or not parts[0]:
            continue
        name, state, weight, reason = parts
        nodes.setdefault(name, SlurmState(state, int(weight) if weight.isdigit() else 1, reason))
    return nodes


def parse_squeue(text: str) -> list[Job]:
    """Parse SQUEUE's lines (a job name may hold '|': it is the last field)."""
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|", 5)
        if len(parts) == 6 and parts[0]:
            jid, state, user, nodes, elapsed, name = parts
            jobs.append(Job(jid, state, user, int(nodes) if nodes.isdigit() else 0, elapsed, name))
    return jobs


def view(cluster: Cluster) -> SlurmView:
    """Node states and the queue from the head, in one call within DEADLINE_S."""
    head = cluster.head_node()[0]
    result = remote.run(head, f"{SINFO} && echo '{QUEUE_SEPARATOR}' && {SQUEUE}", timeout=DEADLINE_S)
    if not result.ok:
        why = (result.stderr or result.stdout).strip().splitlines()
        return SlurmView(head.name, error=f"{head.name}: exit {result.exited}: {why[-1] if why else 'no output'}")
    sinfo, _, squeue = result.stdout.partition(QUEUE_SEPARATOR)
    return SlurmView(head.name, parse_sinfo(sinfo), parse_squeue(squeue))


# sinfo states (%T, '*' or '~' and the like stripped) in which a node takes no new job now.
UNAVAILABLE = ("drain", "down", "fail", "maint", "reserved", "future", "unknown", "powered_down", "power_down")


def waits_for(seen: SlurmView, names: list[str]) -> dict[str, str]:
    """The nodes of a run that Slurm cannot give a new job now (drained, down, not
    responding, ...), with their state as status shows it: a job pends until they are back."""
    out = {}
    for name in names:
        node = seen.nodes.get(name)
        if node and (node.state.endswith("*") or any(word in node.state for word in UNAVAILABLE)):
            out[name] = node.text()
    return out


@dataclass(frozen=True)
class Choice:
    """Whether a run on some hosts can go through Slurm (why_not_slurm)."""

    why_not: str | None  # why it cannot; None: it can
    waits_for: dict[str, str] = field(default_factory=dict)  # its nodes Slurm cannot use now, and why


def why_not_slurm(cluster: Cluster, names: list[str]) -> Choice:
    """Whether a run on ``names`` can go through Slurm: Slurm is wanted for the cluster
    (slurm is not "skip"), every host is a compute node, and the controller answers with
    each of them in its node list (the slurm step has run). One bounded call on the head
    (view); `train`'s default scheduler is chosen by it. A node that is drained or down is
    still Slurm's: the job waits for it, as any user's job would; ``waits_for`` names them."""
    head = cluster.head_node()[0]
    if head.settings.slurm == "skip":
        return Choice("slurm = 'skip' in the inventory")
    computes = {n.name for n in cluster.compute_nodes()}
    outside = [n for n in names if n not in computes]
    if outside:
        return Choice(f"not Slurm compute nodes: {', '.join(outside)}")
    seen = view(cluster)
    if seen.error:
        return Choice(f"Slurm does not answer on the head ({seen.error})")
    missing = [n for n in names if n not in seen.nodes]
    if missing:
        return Choice(f"not in Slurm's node list yet (run `provision up`): {', '.join(missing)}")
    return Choice(None, waits_for(seen, names))


def choose(cluster: Cluster, names: list[str], say: Callable[[str, str], None], what: str = "the job") -> str:
    """--scheduler auto (train, tune): "slurm" where the cluster runs it for every one of
    ``names``, else "ssh"; said either way, so work never lands on a scheduler nobody chose
    knowingly. Nodes Slurm cannot use now are named: ``what`` waits for them."""
    choice = why_not_slurm(cluster, names)
    head = cluster.head_node()[0].name
    if choice.why_not is not None:
        say(head, f"scheduler: ssh (not Slurm: {choice.why_not})")
        return "ssh"
    say(head, "scheduler: slurm (every host is a Slurm compute node; --scheduler ssh to run over SSH)")
    for name, state in choice.waits_for.items():
        say(name, f"Slurm cannot use it now ({state}): {what} waits for it; --scheduler ssh, or --limit without it")
    return "slurm"


def not_compute(cluster: Cluster, names: list[str]) -> list[str]:
    """Which of ``names`` are not Slurm compute nodes (--scheduler slurm refuses them)."""
    computes = {n.name for n in cluster.compute_nodes()}
    return [n for n in names if n not in computes]
