"""`provision plan`: prepare every step against the hosts and report what would change,
with commands and file diffs, executing nothing on any host."""

from __future__ import annotations

import contextlib
from functools import partial
from typing import Any

from provision.engine.collector import Collector, op_name
from provision.engine.connect import connect_all
from provision.engine.context import RunContext
from provision.engine.deadlines import HostClocks, disconnect_bounded, in_parallel
from provision.engine.fact_watch import FactWatch
from provision.engine.op_order import host_op_order
from provision.engine.pyinfra_state import new_state
from provision.engine.results import HostPlan, HostResult, OnEvent, PlannedOp, Step, TimedOut, no_events
from provision.engine.run import targets_of
from provision.inventory import Cluster, Node
from provision.pyinfra_context import held


def plan_steps(cluster: Cluster, steps: list[Step], on_event: OnEvent = no_events) -> dict[str, HostPlan]:
    """Every step's changing operations per host, nothing executed.

    Each step is planned against the hosts as they are now, so a later step cannot see
    what an earlier step would install (the nvidia step's packages appear as new even if
    base would have brought their dependencies).
    """
    plans = {n.name: HostPlan(n.name) for n in cluster.nodes}
    run = RunContext(cluster, tuple(s.name for s in steps), planning=True)
    for step in steps:
        alive = [n for n in cluster.nodes if plans[n.name].reachable and not plans[n.name].refused]
        if alive:
            _plan_step(step, alive, plans, run, on_event)
    return plans


def _plan_step(step: Step, nodes: list[Node], plans: dict[str, HostPlan], run: RunContext, on_event: OnEvent) -> None:
    from pyinfra.api.exceptions import PyinfraError

    targets = targets_of(step, nodes, plans)
    if not targets:
        return
    results = {n.name: HostResult(n.name) for n in targets}
    state = new_state(targets, run=run)
    collector = Collector(results, step.name, on_event)
    state.add_callback_handler(collector)
    try:
        with contextlib.suppress(PyinfraError):  # "No hosts remaining!": each is marked below
            connect_all(state)
        collector.settle_connections(state)
        for node in targets:
            if not results[node.name].reachable:
                plans[node.name].reachable = False
                plans[node.name].refused.append("; ".join(str(f) for f in results[node.name].failures))
        clocks = HostClocks({n.name: float(n.settings.step_timeout_s) for n in targets})
        in_parallel(state, partial(_plan_host, state, step, plans, run, clocks, on_event, FactWatch(state)))
    finally:
        disconnect_bounded(state)
    for node in targets:
        plans[node.name].refused += [f"{step.name}: {r}" for r in run.take_refusals(node.name)]
        plans[node.name].notes += run.take_notes(node.name)
        run.take_skips(node.name)


def _plan_host(
    state: Any,
    step: Step,
    plans: dict[str, HostPlan],
    run: RunContext,
    clocks: HostClocks,
    on_event: OnEvent,
    facts: FactWatch,
    host: Any,
) -> None:
    from pyinfra.api.deploy import add_deploy

    facts.watch(host)
    try:
        finished = clocks.run(host.name, partial(add_deploy, state, step.deploy, host=host))
    except Exception as e:  # this host's alone: an operation that rejected its facts, say
        plans[host.name].refused.append(f"{step.name}: {type(e).__name__}: {e}")
        return
    if not finished:
        # Facts that never answer: this host's plan stops here, the others go on.
        plans[host.name].refused.append(str(TimedOut.after(step.name, clocks.limit_s[host.name])))
        on_event(host.name, f"{step.name}: timed out after {clocks.limit_s[host.name]:.0f} s")
        return
    dropped = facts.why(host)
    if dropped is not None:  # the plan would be built on a fact's default, not the host
        plans[host.name].refused.append(f"{step.name}: {dropped}")
        on_event(host.name, f"{step.name}: FAILED")
        return
    on_event(host.name, f"{step.name}: planned")
    plans[host.name].steps[step.name] = changing_ops(state, host, run)


def changing_ops(state: Any, host: Any, run: RunContext) -> list[PlannedOp]:
    """The operations prepared for a host that would change something."""
    from pyinfra.context import ctx_host, ctx_state

    planned: list[PlannedOp] = []
    for op_hash in host_op_order(host):
        op_data = state.ops[host].get(op_hash)
        if op_data is None or not op_data.operation_meta.will_change:
            continue
        # An operation guarded by _if (restart after a config change) runs only when the
        # change it follows happens; with no other change planned, it will not run.
        if op_data.global_arguments.get("_if") and not planned:
            continue
        with held(ctx_state, state), held(ctx_host, host):
            commands = list(op_data.command_generator())
        planned.append(
            PlannedOp(
                op_name(state, op_hash),
                [_command_text(c) for c in commands],
                [d for d in (upload_diff(host, c, run.secret_uploads) for c in commands) if d],
            )
        )
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


def upload_diff(host: Any, command: Any, secret: set[str]) -> str | None:
    """A unified diff of an upload against the file on the host (text files only); an
    upload to a path in ``secret`` is named, never shown."""
    import difflib

    from pyinfra.api.command import FileUploadCommand
    from pyinfra.facts.files import FileContents

    if not isinstance(command, FileUploadCommand):
        return None
    if command.dest in secret:
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
    diff = difflib.unified_diff(current, desired, f"{command.dest} (now)", f"{command.dest} (planned)", lineterm="")
    return "\n".join(diff)
