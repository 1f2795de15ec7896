"""The ONLY module that builds pyinfra Config/Inventory/State and runs deploys or facts.

Each step of ``provision up`` runs as its own pyinfra pass (fresh State, connect, add the
deploy, run its operations, disconnect). A fresh pass per step means the facts a step
reads are gathered after the previous step changed the host (mdadm is installed before
the volumes step looks for it), and a host that failed a step is left out of the later
ones while the other hosts go on.

Results are collected per host: operations changed, failures with their reasons, and
hosts that could not be reached. The CLI turns them into a summary table and exit code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from provision.errors import EXIT_FAILED, EXIT_OK
from provision.inventory import Cluster, Node

# pyinfra logs every connection and operation itself; the progress display replaces that.
logging.getLogger("pyinfra").setLevel(logging.CRITICAL)

NODE_KEY = "provision_node"  # host data key under which deploys find their typed Node


@dataclass
class HostResult:
    """What happened on one host across a run."""

    name: str  # inventory name
    reachable: bool = True  # False once a connection failed
    steps: list[str] = field(default_factory=list)  # steps that ran to the end on this host
    changed: int = 0  # operations that changed something
    failures: list[str] = field(default_factory=list)  # "step: why" for each failure
    notes: list[str] = field(default_factory=list)  # "nvidia: skipped (no NVIDIA GPU)" and similar
    rebooted: bool = False  # whether the run rebooted this host

    @property
    def ok(self) -> bool:
        return self.reachable and not self.failures


@dataclass
class RunReport:
    """Per-host results of one run, in inventory order."""

    hosts: dict[str, HostResult]

    @property
    def exit_code(self) -> int:
        return EXIT_OK if all(h.ok for h in self.hosts.values()) else EXIT_FAILED

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": "provision.run/1",
            "ok": self.exit_code == EXIT_OK,
            "hosts": [vars(h) | {"ok": h.ok} for h in self.hosts.values()],
        }


@dataclass(frozen=True)
class Step:
    """One named step of `provision up`: a pyinfra @deploy applied to the hosts it concerns."""

    name: str  # "base", "nvidia", ... as typed after --only/--skip
    deploy: Callable[[], Any]  # a @deploy("...") function; reads its Node via current_node()
    doc: str  # one line for --help and the plan
    applies: Callable[[Node], str | None] = lambda node: None  # a reason to skip this host, or None


def current_node() -> Node:
    """Inside a deploy: the typed Node of the host pyinfra is working on."""
    from pyinfra import host

    return host.data.get(NODE_KEY)  # type: ignore[no-any-return]


def pyinfra_inventory(nodes: Iterable[Node]) -> Any:
    """A pyinfra Inventory for these nodes, with provision's SSH defaults applied."""
    from pyinfra.api import Inventory

    names_data = []
    groups: dict[str, list[str]] = {}
    for node in nodes:
        data = dict(node.data)
        data[NODE_KEY] = node
        data["ssh_strict_host_key_checking"] = node.ssh.strict_host_key_checking
        if node.ssh.key:
            data["ssh_key"] = node.ssh.key
        names_data.append((node.name, data))
        for group in node.groups:
            groups.setdefault(group, []).append(node.name)
    return Inventory((names_data, {}), **{g: (names, {}) for g, names in groups.items()})


def _collector_base() -> type:
    from pyinfra.api.state import BaseStateCallback

    return BaseStateCallback


class _Collector(_collector_base()):  # type: ignore[misc]
    """pyinfra callback handler: records results and feeds the progress display."""

    def __init__(self, results: dict[str, HostResult], step: str, on_event: Callable[[str, str], None]):
        self.results, self.step, self.on_event = results, step, on_event

    def host_connect_error(self, state: Any, host: Any, error: Any) -> None:
        result = self.results[host.name]
        result.reachable = False
        result.failures.append(f"{self.step}: unreachable: {error}")
        self.on_event(host.name, "unreachable")

    def operation_host_start(self, state: Any, host: Any, op_hash: str) -> None:
        self.on_event(host.name, f"{self.step}: {_op_name(state, op_hash)}")

    def operation_host_success(self, state: Any, host: Any, op_hash: str, retry_count: int = 0) -> None:
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
        if meta.did_change():
            self.results[host.name].changed += 1

    def operation_host_error(self, state: Any, host: Any, op_hash: str, *args: Any) -> None:
        meta = state.get_op_data_for_host(host, op_hash).operation_meta
        why = _error_text(meta)
        self.results[host.name].failures.append(f"{self.step}: {_op_name(state, op_hash)}: {why}")
        self.on_event(host.name, f"{self.step}: FAILED")


def _op_name(state: Any, op_hash: str) -> str:
    names = state.get_op_meta(op_hash).names
    return ", ".join(sorted(names)) or op_hash[:8]


def _error_text(meta: Any) -> str:
    output = meta._combined_output  # pyinfra keeps no public accessor for a failed op's output
    if output is None:
        return "failed"
    lines = [line.line for line in output if line.line.strip()]
    return " / ".join(lines[-3:]) if lines else "command failed with no output"


def _new_state(nodes: list[Node], parallel: int) -> Any:
    from pyinfra.api import Config, State

    config = Config(PARALLEL=parallel, CONNECT_TIMEOUT=15)
    return State(pyinfra_inventory(nodes), config)


def run_step(
    step: Step,
    nodes: list[Node],
    results: dict[str, HostResult],
    on_event: Callable[[str, str], None] = lambda host, text: None,
    parallel: int = 0,
) -> None:
    """Apply one step to the given nodes (all reachable so far), recording into results."""
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operations import run_ops

    targets = []
    for node in nodes:
        reason = step.applies(node)
        if reason:
            results[node.name].notes.append(f"{step.name}: skipped ({reason})")
        else:
            targets.append(node)
    if not targets:
        return
    state = _new_state(targets, parallel)
    state.add_callback_handler(_Collector(results, step.name, on_event))
    try:
        connect_all(state)
        if state.active_hosts:
            add_deploy(state, step.deploy)
            run_ops(state, no_wait=True)
    except PyinfraError as e:
        # "No hosts remaining!": every host failed. Each failure is already recorded.
        _record_unexplained(state, targets, results, step.name, str(e))
    finally:
        disconnect_all(state)
    for node in targets:
        result = results[node.name]
        if result.ok and not any(f.startswith(f"{step.name}:") for f in result.failures):
            result.steps.append(step.name)
            on_event(node.name, f"{step.name}: done")


def _record_unexplained(state: Any, targets: list[Node], results: dict[str, HostResult], step: str, why: str) -> None:
    for node in targets:
        if results[node.name].ok and node.name in {h.name for h in state.failed_hosts}:
            results[node.name].failures.append(f"{step}: {why}")


def run_steps(
    cluster: Cluster,
    steps: list[Step],
    on_event: Callable[[str, str], None] = lambda host, text: None,
) -> RunReport:
    """Run steps in order over all nodes; a host that fails stops there, the rest go on."""
    results = {n.name: HostResult(n.name) for n in cluster.nodes}
    for step in steps:
        alive = [n for n in cluster.nodes if results[n.name].ok]
        if not alive:
            break
        run_step(step, alive, results, on_event)
    return RunReport(results)


@dataclass
class FactsResult:
    """Facts gathered from each host; hosts that could not be reached carry the reason."""

    facts: dict[str, dict[str, Any]]  # host -> fact name -> processed value
    unreachable: dict[str, str]  # host -> why


def gather_facts(
    nodes: list[Node],
    wanted: dict[str, tuple[type, dict[str, Any]]],
    on_event: Callable[[str, str], None] = lambda host, text: None,
) -> FactsResult:
    """Gather pyinfra facts (name -> (FactClass, kwargs)) from every node in parallel."""
    import gevent
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.context import ctx_state

    state = _new_state(nodes, parallel=0)
    results = {n.name: HostResult(n.name) for n in nodes}
    state.add_callback_handler(_Collector(results, "connect", on_event))
    out: dict[str, dict[str, Any]] = {}

    def one(host: Any) -> None:
        values = {}
        for name, (fact, kwargs) in wanted.items():
            on_event(host.name, f"fact {name}")
            values[name] = host.get_fact(fact, **kwargs)
        out[host.name] = values
        on_event(host.name, "done")

    with ctx_state.use(state):
        try:
            try:
                connect_all(state)
            except PyinfraError:
                return _unreachable_only(results)  # "No hosts remaining!": none answered
            greenlets = [state.pool.spawn(one, h) for h in state.active_hosts]
            gevent.joinall(greenlets, raise_error=True)
        finally:
            disconnect_all(state)
    result = _unreachable_only(results)
    result.facts.update(out)
    return result


def _unreachable_only(results: dict[str, HostResult]) -> FactsResult:
    unreachable = {name: "; ".join(r.failures) for name, r in results.items() if not r.reachable}
    return FactsResult({}, unreachable)
