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

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
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

    return host.data.get(NODE_KEY)


# The whole inventory of the run in progress, for deploys that write something about every
# node (/etc/hosts, known_hosts) while pyinfra hands them one host at a time.
_cluster: Cluster | None = None
# The names of the steps in the run in progress (preflight checks the volumes step's disks
# only when that step will run).
_step_names: tuple[str, ...] = ()
# Notes deploys leave for the summary ("nvidia: skipped (no NVIDIA GPU)"), by host name.
_notes: dict[str, list[str]] = {}
# Steps whose deploy found nothing to do on a host and said so with skip(), by host name:
# such a step did not run there, so it is not listed in the host's steps (reboots read that).
_skips: dict[str, set[str]] = {}


def current_cluster() -> Cluster:
    """Inside a deploy run by run_steps/plan_steps: the full Cluster, all nodes."""
    if _cluster is None:
        raise RuntimeError("current_cluster() called outside run_steps/plan_steps")
    return _cluster


def current_steps() -> tuple[str, ...]:
    """Inside a deploy run by run_steps/plan_steps: the names of the steps in this run."""
    return _step_names


@contextlib.contextmanager
def _running(cluster: Cluster, steps: list[Step]) -> Iterator[None]:
    """Make the cluster and the step names visible to deploys for the length of a run."""
    global _cluster, _step_names
    _cluster, _step_names = cluster, tuple(s.name for s in steps)
    try:
        yield
    finally:
        _cluster, _step_names = None, ()


def note(text: str) -> None:
    """Inside a deploy: leave a note for the current host's summary row."""
    from pyinfra import host

    _notes.setdefault(host.name, []).append(text)


def skip(step: str, reason: str) -> None:
    """Inside a deploy: this step does not apply to the current host after all (a fact only
    the host knows, such as no NVIDIA GPU); the summary notes why and the step is not counted
    as run there."""
    from pyinfra import host

    note(f"{step}: skipped ({reason})")
    _skips.setdefault(host.name, set()).add(step)


def _take_notes(results: dict[str, HostResult]) -> None:
    for name, notes in list(_notes.items()):
        if name in results:
            results[name].notes.extend(notes)
        _notes.pop(name, None)
    _refusals.clear()  # a run reports refusals as failures; only a plan reads them


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
        self.finished: list[tuple[Any, str, bool]] = []  # (host, op, succeeded), settled after run_ops
        self.connect_errors: dict[str, str] = {}  # host -> last connection error, settled later

    def host_connect_error(self, state: Any, host: Any, error: Any) -> None:
        # Not final yet: pyinfra's reboot operation reconnects in a loop, and each early try
        # (the port forward answers before sshd does) lands here. settle_connections decides.
        self.connect_errors[host.name] = str(error)
        self.on_event(host.name, f"{self.step}: no SSH connection yet: {error}")

    def settle_connections(self, state: Any) -> None:
        """A host is unreachable if it is not connected once pyinfra is done trying."""
        for name, error in self.connect_errors.items():
            if not state.inventory.get_host(name).connected:
                result = self.results[name]
                result.reachable = False
                result.failures.append(f"{self.step}: unreachable: {error}")
                self.on_event(name, "unreachable")
        self.connect_errors.clear()

    def operation_host_start(self, state: Any, host: Any, op_hash: str) -> None:
        self.on_event(host.name, f"{self.step}: {_op_name(state, op_hash)}")

    def operation_host_success(self, state: Any, host: Any, op_hash: str, retry_count: int = 0) -> None:
        self.finished.append((host, op_hash, True))

    def operation_host_error(self, state: Any, host: Any, op_hash: str, *args: Any) -> None:
        self.finished.append((host, op_hash, False))
        self.on_event(host.name, f"{self.step}: FAILED")

    def settle(self, state: Any) -> None:
        """Record changes and failures. pyinfra completes an operation's meta (output,
        commands) only after calling these callbacks, so it is read here, after run_ops."""
        self.settle_connections(state)
        for host, op_hash, success in self.finished:
            meta = state.get_op_data_for_host(host, op_hash).operation_meta
            if not success:
                why = _error_text(meta)
                self.results[host.name].failures.append(f"{self.step}: {_op_name(state, op_hash)}: {why}")
            elif meta.is_complete() and meta.did_change():
                self.results[host.name].changed += 1
        self.finished.clear()


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
    from pyinfra.connectors.sshuserclient import client

    # pyinfra memoizes every known_hosts file it reads for the life of the process. Each run
    # must see the file as it is now: a testbed VM restarted on a new port has a new entry.
    client.get_host_keys.cache.clear()
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

    targets = _targets(step, nodes, results)
    if not targets:
        return
    state = _new_state(targets, parallel)
    collector = _Collector(results, step.name, on_event)
    state.add_callback_handler(collector)
    try:
        connect_all(state)
        for host in list(state.active_hosts):
            try:
                add_deploy(state, step.deploy, host=host)
            except PyinfraError as e:  # an operation rejected its facts or arguments while prepared
                results[host.name].failures.append(f"{step.name}: {type(e).__name__}: {e}")
                state.fail_hosts({host})
            except Exception as e:  # noqa: BLE001
                # Anything else raised while preparing this host's operations (a controller
                # file that cannot be written, a fact shape a deploy did not expect) is this
                # host's failure: the other hosts go on, and the summary names the error.
                results[host.name].failures.append(f"{step.name}: internal error: {type(e).__name__}: {e}")
                state.fail_hosts({host})
        if state.active_hosts:
            run_ops(state, no_wait=True)
    except PyinfraError as e:
        # "No hosts remaining!": every host failed. Each failure is recorded by settle().
        collector.settle(state)
        _record_unexplained(state, targets, results, step.name, str(e))
    finally:
        collector.settle(state)
        disconnect_all(state)
    for node in targets:
        result = results[node.name]
        if step.name in _skips.pop(node.name, set()):
            on_event(node.name, f"{step.name}: skipped")
        elif result.ok and not any(f.startswith(f"{step.name}:") for f in result.failures):
            result.steps.append(step.name)
            on_event(node.name, f"{step.name}: done")


def _targets(step: Step, nodes: list[Node], rows: Mapping[str, Any]) -> list[Node]:
    """The nodes a step applies to; each one it skips gets a note in its row (a HostResult
    when running, a HostPlan when planning) saying why."""
    targets = []
    for node in nodes:
        reason = step.applies(node)
        if reason:
            rows[node.name].notes.append(f"{step.name}: skipped ({reason})")
        else:
            targets.append(node)
    return targets


def _record_unexplained(state: Any, targets: list[Node], results: dict[str, HostResult], step: str, why: str) -> None:
    for node in targets:
        if results[node.name].ok and node.name in {h.name for h in state.failed_hosts}:
            results[node.name].failures.append(f"{step}: {why}")


def run_steps(
    cluster: Cluster,
    steps: list[Step],
    on_event: Callable[[str, str], None] = lambda host, text: None,
    after_step: Callable[[Step, dict[str, HostResult]], None] | None = None,
) -> RunReport:
    """Run steps in order over all nodes; a host that fails stops there, the rest go on.

    ``after_step`` is called with each step and the results so far (the pipeline
    reboots hosts after the nvidia step there)."""
    results = {n.name: HostResult(n.name) for n in cluster.nodes}
    with _running(cluster, steps):
        for step in steps:
            alive = [n for n in cluster.nodes if results[n.name].ok]
            if not alive:
                break
            run_step(step, alive, results, on_event)
            _take_notes(results)
            if after_step is not None:
                after_step(step, results)
    return RunReport(results)


@dataclass
class FactsResult:
    """Facts gathered from each host; hosts that could not be reached carry the reason."""

    facts: dict[str, dict[str, Any]]  # host -> fact name -> processed value (every fact answered)
    failed: dict[str, str]  # host -> why it has no facts: unreachable, or a fact that failed


def gather_facts(
    nodes: list[Node],
    wanted: dict[str, tuple[type, dict[str, Any]]],
    on_event: Callable[[str, str], None] = lambda host, text: None,
) -> FactsResult:
    """Gather pyinfra facts (name -> (FactClass, kwargs)) from every node in parallel.

    A host either answers every fact or lands in `failed` with the reason; one host's
    failure (a dropped connection, a missing command) never costs the others their facts.
    """
    import gevent
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.context import ctx_state

    state = _new_state(nodes, parallel=0)
    results = {n.name: HostResult(n.name) for n in nodes}
    collector = _Collector(results, "connect", on_event)
    state.add_callback_handler(collector)
    out: dict[str, dict[str, Any]] = {}
    fact_errors: dict[str, str] = {}

    def one(host: Any) -> None:
        values = {}
        for name, (fact, kwargs) in wanted.items():
            on_event(host.name, f"fact {name}")
            try:
                values[name] = host.get_fact(fact, **kwargs)
            except Exception as e:  # noqa: BLE001 -- any error is this host's alone
                fact_errors[host.name] = f"fact {name}: {type(e).__name__}: {e}".rstrip(": ")
                on_event(host.name, "failed")
                return
            # pyinfra answers a failed fact command with the fact's default (None) and
            # drops the host from the run; a half-gathered host is reported, not summarised.
            if values[name] is None or host not in state.active_hosts:
                fact_errors[host.name] = f"fact {name}: the command failed on the host"
                on_event(host.name, "failed")
                return
        out[host.name] = values
        on_event(host.name, "done")

    with ctx_state.use(state):
        try:
            try:
                connect_all(state)
            except PyinfraError:
                collector.settle_connections(state)
                return _unreachable_only(results)  # "No hosts remaining!": none answered
            collector.settle_connections(state)
            greenlets = [state.pool.spawn(one, h) for h in list(state.active_hosts)]
            gevent.joinall(greenlets)
        finally:
            disconnect_all(state)
    result = _unreachable_only(results)
    result.facts.update(out)
    for name, why in fact_errors.items():
        result.failed.setdefault(name, why)
    return result


def _unreachable_only(results: dict[str, HostResult]) -> FactsResult:
    unreachable = {name: "; ".join(r.failures) for name, r in results.items() if not r.reachable}
    return FactsResult({}, unreachable)


# --- refusals and dry runs (provision plan) ---------------------------------------------

_refusals: dict[str, list[str]] = {}  # host -> reasons a deploy refused it, for the plan
_secret_uploads: set[str] = set()  # remote paths whose contents a plan never shows (keys, passwords)


def secret_upload(dest: str) -> str:
    """Inside a deploy: mark an upload's destination as secret, so `provision plan` shows
    no diff of it. Returns dest, to wrap the argument: files.put(dest=secret_upload(p))."""
    _secret_uploads.add(dest)
    return dest


def refuse(step: str, reason: str) -> None:
    """Inside a deploy: fail the current host with a reason people can read.

    Adds an operation that prints the reason to stderr and exits 1, which the summary
    shows as "<step>: <step> checks: <reason>"; a plan reports it as "would stop".
    """
    import shlex

    from pyinfra import host
    from pyinfra.operations import server

    _refusals.setdefault(host.name, []).append(reason)
    server.shell(name=f"{step} checks", commands=[f"echo {shlex.quote(reason)} >&2; exit 1"])


@dataclass
class PlannedOp:
    """One operation that would change something on a host."""

    name: str  # the operation's name, e.g. "Install base packages"
    commands: list[str]  # shell commands it would run, uploads as "upload SRC -> DEST"
    diffs: list[str] = field(default_factory=list)  # unified diff per file it would write


@dataclass
class HostPlan:
    """What `up` would do on one host, step by step, without doing it."""

    name: str  # inventory name
    reachable: bool = True  # False when the host could not be contacted
    steps: dict[str, list[PlannedOp]] = field(default_factory=dict)  # step -> changing ops
    refused: list[str] = field(default_factory=list)  # "step: reason" that would stop the host
    notes: list[str] = field(default_factory=list)  # skipped steps and the like

    @property
    def changes(self) -> int:
        return sum(len(ops) for ops in self.steps.values())


def plan_steps(
    cluster: Cluster,
    steps: list[Step],
    on_event: Callable[[str, str], None] = lambda host, text: None,
) -> dict[str, HostPlan]:
    """Prepare every step against the hosts and report the operations that would change
    something, with their commands and file diffs. Nothing is executed on any host.

    Each step is planned against the hosts as they are now, so a later step cannot see
    what an earlier step would install (the nvidia step's packages appear as new even if
    base would have brought their dependencies).
    """
    plans = {n.name: HostPlan(n.name) for n in cluster.nodes}
    try:
        with _running(cluster, steps):
            for step in steps:
                alive = [n for n in cluster.nodes if plans[n.name].reachable and not plans[n.name].refused]
                if alive:
                    _plan_step(step, alive, plans, on_event)
    finally:
        _notes.clear()
        _skips.clear()
    return plans


def _plan_step(step: Step, nodes: list[Node], plans: dict[str, HostPlan],
               on_event: Callable[[str, str], None]) -> None:
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.exceptions import PyinfraError

    targets = _targets(step, nodes, plans)
    if not targets:
        return
    results = {n.name: HostResult(n.name) for n in targets}
    state = _new_state(targets, parallel=0)
    collector = _Collector(results, step.name, on_event)
    state.add_callback_handler(collector)
    try:
        with contextlib.suppress(PyinfraError):  # "No hosts remaining!": each is marked below
            connect_all(state)
        collector.settle_connections(state)
        for node in targets:
            if not results[node.name].reachable:
                plans[node.name].reachable = False
                plans[node.name].refused.append("; ".join(results[node.name].failures))
        if state.active_hosts:
            add_deploy(state, step.deploy)
            for host in state.active_hosts:
                on_event(host.name, f"{step.name}: planned")
                plans[host.name].steps[step.name] = _changing_ops(state, host)
    finally:
        disconnect_all(state)
    for name, reasons in list(_refusals.items()):
        if name in plans:
            plans[name].refused += [f"{step.name}: {r}" for r in reasons]
        _refusals.pop(name, None)
    for name, texts in list(_notes.items()):
        if name in plans:
            plans[name].notes += texts
        _notes.pop(name, None)


def _changing_ops(state: Any, host: Any) -> list[PlannedOp]:
    from pyinfra.context import ctx_host, ctx_state

    planned: list[PlannedOp] = []
    for op_hash in state.get_op_order():
        op_data = state.ops[host].get(op_hash)
        if op_data is None or not op_data.operation_meta.will_change:
            continue
        # An operation guarded by _if (restart after a config change) runs only when the
        # change it follows happens; with no other change planned, it will not run.
        if op_data.global_arguments.get("_if") and not planned:
            continue
        with ctx_state.use(state), ctx_host.use(host):
            commands = list(op_data.command_generator())
        planned.append(PlannedOp(
            _op_name(state, op_hash),
            [_command_text(c) for c in commands],
            [d for d in (_upload_diff(host, c) for c in commands) if d],
        ))
    return planned


def _command_text(command: Any) -> str:
    from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand

    if isinstance(command, StringCommand):
        return str(command)
    if isinstance(command, FileUploadCommand):
        src = command.src if isinstance(command.src, str) else "(generated)"
        return f"upload {src} -> {command.dest}"
    if isinstance(command, FunctionCommand):
        return f"(controller-side step: {command.function.__name__})"
    return repr(command)


def _upload_diff(host: Any, command: Any) -> str | None:
    """A unified diff of an upload against the file on the host (text files only)."""
    import difflib

    from pyinfra.api.command import FileUploadCommand
    from pyinfra.facts.files import FileContents

    if not isinstance(command, FileUploadCommand):
        return None
    if command.dest in _secret_uploads:
        return f"--- {command.dest}\n(secret: contents not shown)"
    try:
        if isinstance(command.src, str):
            with open(command.src, encoding="utf-8") as f:
                desired = f.read().splitlines()
        else:
            command.src.seek(0)
            data = command.src.read()
            desired = (data.decode() if isinstance(data, bytes) else data).splitlines()
    except (UnicodeDecodeError, OSError):
        return f"--- {command.dest}\n(binary file)"
    current = host.get_fact(FileContents, path=command.dest) or []
    diff = difflib.unified_diff(current, desired, f"{command.dest} (now)", f"{command.dest} (planned)",
                                lineterm="")
    return "\n".join(diff)


def plan_with_facts(step: Step, node: Node, facts: Callable[[type, dict[str, Any]], Any],
                    cluster: Cluster | None = None,
                    steps: list[Step] | None = None) -> tuple[list[PlannedOp], list[str]]:
    """Prepare one step for one node against given facts instead of a live host: pyinfra's
    "fake state". Returns the operations that would change and the refusals. Nothing is
    contacted; ``facts(FactClass, kwargs)`` answers every fact the deploy reads. ``steps``
    are the steps of the run it pretends to be part of (default: this step alone).

    This is how deploys are tested on captured facts (an Ubuntu host, a GPU host).
    """
    from unittest import mock

    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.host import Host

    state = _new_state([node], parallel=1)

    def get_fact(self: Any, cls: type, *args: Any, **kwargs: Any) -> Any:
        return facts(cls, kwargs)

    try:
        with _running(cluster or Cluster(_fake_path(), (node,)), steps or [step]), \
                mock.patch.object(Host, "get_fact", get_fact):
            host = state.inventory.get_host(node.name)
            add_deploy(state, step.deploy, host=host)
            planned = _changing_ops(state, host)
    finally:
        _notes.clear()
        _skips.clear()
    return planned, _refusals.pop(node.name, [])


def _fake_path() -> Any:
    from pathlib import Path

    return Path("fake-inventory.py")
