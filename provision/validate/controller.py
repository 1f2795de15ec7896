"""Run validate on a cluster: agents on every node, then network rounds, then the
multi-node all-reduce, then the judge.

Steps run one after another so that no benchmark disturbs another: the agents run on all
nodes at once (each node measures only itself), the link tests run round by round, the
all-reduce runs last. Every remote command goes through ``provision.remote`` and is
bounded by ``timeout`` on the node; nothing here opens a connection of its own.
"""

from __future__ import annotations

import base64
import shlex
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from provision import remote
from provision.inventory import Cluster, Node
from provision.metrics import GROUPS
from provision.validate import agent, agent_stream, judge, netrun, parsers, remeasure
from provision.validate.expectations import Overrides, parse_flat
from provision.validate.records import Measurement, NodeResult
from provision.validate.rounds import FULL_PEERS

AGENT_PATH = Path(__file__).with_name("agent.py")


def agent_budgets(node: Node, mode: str) -> dict[str, float]:
    """Seconds per agent phase on this node: the mode's own, with the node's
    validate_budgets_s setting over them (for slow or emulated hosts)."""
    return {**agent.BUDGETS_S[mode], **node.settings.validate_budgets_s}


def agent_deadline_s(node: Node, mode: str) -> int:
    """The agent's whole run on one node: the sum of its phase budgets plus a margin. Each
    phase is bounded on its own; this bounds the agent as a whole."""
    return agent.outer_deadline_s(mode, agent_budgets(node, mode))


Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class Plan:
    """What to run."""

    mode: str = "quick"  # quick or full
    groups: frozenset[str] = frozenset(GROUPS)  # --only
    expect: Overrides = field(default_factory=Overrides)  # --expect file
    iperf_seconds: int = 0  # per link test; 0: 3 s quick, 10 s full
    link_peers: int = FULL_PEERS  # full mode past every pair: random partners per node beyond the ring


@dataclass
class Outcome:
    """Everything a run produced."""

    results: list[NodeResult]  # judged, in inventory order
    network: dict[str, Any] = field(default_factory=dict[str, Any])  # pairs, bisect blame, all-reduce detail


def agent_command(node: Node, agent_path: str, plan: Plan) -> str:
    """The shell line that runs the agent with the node's venv python (else python3)."""
    venv_python = shlex.quote(f"{node.settings.venv_path}/bin/python")
    only = ",".join(sorted(plan.groups & {"cpu", "ram", "disk", "gpu", "allreduce"})) or "none"
    args = (
        f"{shlex.quote(agent_path)} --mode {plan.mode} --only {only} --data-dir {shlex.quote(node.settings.data_mount)}"
    )
    own = node.settings.validate_budgets_s  # names checked at load (metrics.check_budgets)
    if own:
        args += " --budget " + shlex.quote(",".join(f"{phase}={seconds:g}" for phase, seconds in sorted(own.items())))
    deadline = agent_deadline_s(node, plan.mode)
    return f'P={venv_python}; [ -x "$P" ] || P=python3; timeout {deadline} "$P" {args}'


def upload_command(agent_path: str) -> str:
    """Write the agent file on the node from the command line itself (base64, no SFTP):
    one round trip, and nothing but a shell needed on the node."""
    blob = base64.b64encode(AGENT_PATH.read_bytes()).decode()
    return f"umask 077; printf %s {blob} | base64 -d > {shlex.quote(agent_path)}"


@dataclass(frozen=True)
class AgentRun:
    """What running the agent on one node gave."""

    report: agent_stream.AgentReport | None  # every row that arrived, even from a killed agent
    error: str  # why the node has no report (or why it is cut short); "" when it finished
    answered: bool  # the node answered SSH (it is reachable, whatever the agent did)


def _agent(node: Node, plan: Plan, agent_path: str, progress: Progress) -> AgentRun:
    """Upload and run the agent; what it reported, and why not all of it."""
    progress(node.name, "uploading agent")
    upload = remote.run(node, upload_command(agent_path), timeout=60)
    if not upload.ok:
        why = f"cannot upload the agent: {(upload.stderr or upload.stdout).strip()[-300:]}"
        return AgentRun(None, why, upload.exited != -1)
    progress(node.name, f"agent running ({plan.mode})")
    deadline = agent_deadline_s(node, plan.mode)
    r = remote.run(node, agent_command(node, agent_path, plan), timeout=deadline + 30)
    try:
        report = agent_stream.agent_output(r.stdout, node.name)
    except parsers.ParseError as e:
        return AgentRun(None, _no_output(r, deadline, e), r.exited != -1)
    if report.stopped_in == agent_stream.STARTUP:
        return AgentRun(None, _stopped(report, r), True)
    return AgentRun(report, _stopped(report, r) if report.stopped_in else "", True)


def _stopped(report: agent_stream.AgentReport, r: remote.CommandResult) -> str:
    """Why the agent's output ended early, in words: the phase, and what the exit means."""
    how = (
        f"ran past its deadline of {report.deadline_s} s and was stopped (timeout, exit 124)"
        if r.exited == 124
        else f"stopped with exit {r.exited}: {r.stderr.strip()[-300:]}"
    )
    if report.stopped_in == agent_stream.STARTUP:
        return f"agent {how} during {report.stopped_in}, before its first benchmark"
    return f"agent {how} during {report.stopped_in}; every result it sent before is kept"


def _no_output(r: remote.CommandResult, deadline_s: int, e: parsers.ParseError) -> str:
    if r.exited == 124:
        return f"agent ran past its deadline of {deadline_s} s before printing anything (timeout, exit 124)"
    if r.exited != 0:
        return f"agent exited {r.exited}: {(r.stderr or r.stdout).strip()[-300:]}"
    return f"agent output unreadable: {e}"


def _overrides(node: Node, plan: Plan) -> Overrides:
    where = f"host {node.name}: validate_expect"
    return parse_flat(node.settings.validate_expect, where).merged(plan.expect)


def run(cluster: Cluster, plan: Plan, progress: Progress | None = None) -> Outcome:
    """Validate every node of the cluster and judge it. One node failing never stops the rest."""
    say = progress or (lambda host, text: None)
    nodes = list(cluster.nodes)
    token = uuid.uuid4().hex[:8]
    paths = {n.name: f"/tmp/provision-validate-{n.name}-{token}.py" for n in nodes}
    runs = remote.on_all(nodes, lambda n: _agent(n, plan, paths[n.name], say))
    inputs = {n.name: _input(n, runs[n.name], plan) for n in nodes}
    _remeasure_outliers(nodes, inputs, plan, paths, say)
    reports = {name: run.report for name, run in runs.items()}
    network: dict[str, Any] = {}
    # A node that answered SSH is reachable, whatever its agent did: its links are measured.
    reachable = [n for n in nodes if runs[n.name].answered]
    try:
        if "net" in plan.groups:
            network["links"] = _links(reachable, nodes, inputs, plan, say)
        if "allreduce" in plan.groups:
            network["allreduce"] = _allreduce(reachable, nodes, inputs, reports, paths, say)
    finally:
        remote.on_all(reachable, lambda n: remote.run(n, f"rm -f {shlex.quote(paths[n.name])}", timeout=30))
    for n in nodes:
        say(n.name, "judging")
    return Outcome(judge.judge([inputs[n.name] for n in nodes]), network)


def _remeasure_outliers(
    nodes: list[Node], inputs: dict[str, judge.NodeInput], plan: Plan, paths: dict[str, str], say: Progress
) -> None:
    """Run the agent again on the nodes with a fleet outlier, their outlying groups only,
    and put the second figures in ``inputs`` (provision.validate.remeasure says why)."""
    suspects = judge.fleet_outliers([inputs[n.name] for n in nodes])
    groups = {name: remeasure.groups(ms) for name, ms in suspects.items()}
    again = [n for n in nodes if groups.get(n.name)]
    if not again:
        return

    def measure_again(n: Node) -> AgentRun:
        say(n.name, f"far below the fleet: measuring {', '.join(sorted(groups[n.name]))} again, the rest idle")
        return _agent(n, replace(plan, groups=groups[n.name]), paths[n.name], say)

    runs = remote.on_all(again, measure_again)
    for n in again:
        run, first = runs[n.name], inputs[n.name].measurements
        second = list(run.report.measurements) if run.report is not None else []
        inputs[n.name].measurements = remeasure.merged(first, suspects[n.name], second, run.error)


def _input(node: Node, run: AgentRun, plan: Plan) -> judge.NodeInput:
    overrides = _overrides(node, plan)
    wants_gpu = node.has_role("gpu_nodes") and "gpu" in plan.groups
    report = run.report
    if report is None:
        return judge.NodeInput(node.name, [], wants_gpu=wants_gpu, overrides=overrides, errors=[run.error])
    # Agent errors already show as not-run metrics with their reason; keep them as notes.
    inventory = {
        **report.inventory,
        "hostname": report.hostname,
        # Every field NVML gave (versions, memory, PCIe link, ECC and remaps, clocks,
        # throttle reasons, persistence, NVLink): the acceptance record of each GPU.
        "gpus": [asdict(g) for g in report.gpus],
        "agent_errors": list(report.errors) + ([run.error] if run.error else []),
    }
    gpus = list(report.gpus) if "gpu" in plan.groups else []
    return judge.NodeInput(node.name, list(report.measurements), gpus, wants_gpu, overrides, [], inventory)


def _links(
    reachable: list[Node], nodes: list[Node], inputs: dict[str, judge.NodeInput], plan: Plan, say: Progress
) -> dict[str, Any]:
    seconds = plan.iperf_seconds or (3 if plan.mode == "quick" else 10)
    values, detail = netrun.links(reachable, plan.mode, seconds, say, plan.link_peers)
    for n in nodes:
        value, why, text = values.get(n.name, (None, "not run: node unreachable", ""))
        if len(nodes) < 2:
            value, why = None, "not run: one node"
        inputs[n.name].measurements.append(Measurement(n.name, "net_gbits", value, "", why, text))
    return detail


def _allreduce(
    reachable: list[Node],
    nodes: list[Node],
    inputs: dict[str, judge.NodeInput],
    reports: dict[str, Any],
    paths: dict[str, str],
    say: Progress,
) -> dict[str, Any]:
    detail: dict[str, Any] = {}
    value: float | None = None
    if len(nodes) < 2:
        why = "not run: one node"
    elif len(reachable) < len(nodes):
        why = "not run: a node is unreachable"
    else:
        gpus = {n.name: len(r.gpus) if r is not None else 0 for n, r in ((n, reports[n.name]) for n in nodes)}
        value, why, detail = netrun.allreduce(nodes, paths, gpus, say)
    for n in nodes:
        inputs[n.name].measurements.append(
            Measurement(
                n.name,
                "allreduce_nodes_busbw_gbs",
                value,
                "",
                why,
                f"{detail.get('world', '?')} ranks, {detail.get('backend', '?')}, {detail.get('mb', '?')} MiB"
                if value is not None
                else "",
            )
        )
    return detail
