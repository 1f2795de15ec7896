"""Run the steps of `provision up`: one pyinfra pass per step, every host in parallel.

A fresh pass per step means the facts a step reads are gathered after the previous step
changed the host (mdadm is installed before the volumes step looks for it), and a host
that failed a step is left out of the later ones while the other hosts go on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from provision.engine.collector import Collector
from provision.engine.connect import connect_all
from provision.engine.context import RunContext
from provision.engine.deadlines import HostClocks, disconnect_bounded, in_parallel, run_ops_bounded
from provision.engine.fact_watch import FactWatch
from provision.engine.pyinfra_state import new_state
from provision.engine.results import HostResult, OnEvent, RunReport, Step, no_events
from provision.inventory import Cluster, Node


def run_step(
    step: Step,
    nodes: list[Node],
    results: dict[str, HostResult],
    on_event: OnEvent = no_events,
    run: RunContext | None = None,
) -> None:
    """Apply one step to the given nodes (all reachable so far), recording into results.
    ``run`` is the run it belongs to; without one (a reboot pass) it gets a context of its own."""
    run = run or RunContext(None, (step.name,))
    from pyinfra.api.exceptions import PyinfraError

    targets = targets_of(step, nodes, results)
    if not targets:
        return
    state = new_state(targets, run)
    collector = Collector(results, step.name, on_event)
    state.add_callback_handler(collector)
    clocks = HostClocks({n.name: float(n.settings.step_timeout_s) for n in targets})
    for node in targets:
        on_event(node.name, f"{step.name}: started")
    try:
        connect_all(state)
        # Hosts are prepared (their facts read) side by side, as pyinfra's CLI does; no host
        # runs an operation before all are prepared, so a host whose facts hang holds the
        # others back until its own deadline, and no longer.
        facts = FactWatch(state)
        in_parallel(state, lambda host: _prepare(state, step, host, results, clocks, on_event, facts))
        if state.active_hosts:
            run_ops_bounded(state, clocks, lambda host: _time_out(step, host, results, clocks, on_event))
    except PyinfraError as e:
        # "No hosts remaining!": every host failed. Each failure is recorded by settle().
        collector.settle(state)
        _record_unexplained(state, targets, results, step.name, str(e))
    finally:
        collector.settle(state)
        disconnect_bounded(state)
    for node in targets:
        _finish(step, results[node.name], run, on_event)


def _prepare(
    state: Any,
    step: Step,
    host: Any,
    results: dict[str, HostResult],
    clocks: HostClocks,
    on_event: OnEvent,
    facts: FactWatch,
) -> None:
    """Add the step's operations for one host (its facts are read here), within the
    host's deadline; an error or a timeout doing so fails that host alone."""
    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.exceptions import PyinfraError

    result = results[host.name]
    facts.watch(host)
    try:
        if clocks.run(host.name, lambda: add_deploy(state, step.deploy, host=host)):
            dropped = facts.why(host)  # a fact that failed: pyinfra took the host out quietly
            if dropped is not None:
                result.fail(step.name, dropped)
                on_event(host.name, f"{step.name}: FAILED")
            return
        _time_out(step, host, results, clocks, on_event)
    except PyinfraError as e:  # an operation rejected its facts or arguments while prepared
        result.fail(step.name, f"{type(e).__name__}: {e}")
    except Exception as e:  # the host's failure alone (below)
        # Anything else raised while preparing this host's operations (a controller file
        # that cannot be written, a fact shape a deploy did not expect) is this host's
        # failure: the other hosts go on, and the summary names the error.
        result.fail(step.name, f"internal error: {type(e).__name__}: {e}")
    with contextlib.suppress(PyinfraError):  # "No hosts remaining!": the caller sees none left
        state.fail_hosts({host})


def _time_out(step: Step, host: Any, results: dict[str, HostResult], clocks: HostClocks, on_event: OnEvent) -> None:
    results[host.name].time_out(step.name, clocks.limit_s[host.name])
    on_event(host.name, f"{step.name}: timed out after {clocks.limit_s[host.name]:.0f} s")


def _finish(step: Step, result: HostResult, run: RunContext, on_event: OnEvent) -> None:
    result.notes.extend(run.take_notes(result.name))
    if step.name in run.take_skips(result.name):
        on_event(result.name, f"{step.name}: skipped")
    elif result.ok and not result.failed_in(step.name):
        if step.name not in result.steps:  # a step's second pass (a reboot's, the Slurm head's) is one step
            result.steps.append(step.name)
        on_event(result.name, f"{step.name}: done, {result.changed_by_step.get(step.name, 0)} changed")


def targets_of(step: Step, nodes: list[Node], rows: Mapping[str, Any]) -> list[Node]:
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
    failed = {h.name for h in state.failed_hosts}
    for node in targets:
        if results[node.name].ok and node.name in failed:
            results[node.name].fail(step, why)


def run_steps(
    cluster: Cluster,
    steps: list[Step],
    on_event: OnEvent = no_events,
    after_step: Callable[[Step, dict[str, HostResult]], None] | None = None,
) -> RunReport:
    """Run steps in order over all nodes; a host that fails stops there, the rest go on.

    ``after_step`` is called with each step and the results so far (the pipeline
    reboots hosts after the nvidia step there)."""
    results = {n.name: HostResult(n.name) for n in cluster.nodes}
    run = RunContext(cluster, tuple(s.name for s in steps))
    for step in steps:
        alive = [n for n in cluster.nodes if results[n.name].ok]
        if not alive:
            break
        run_step(step, alive, results, on_event, run=run)
        run.refusals.clear()  # a run reports refusals as failures; only a plan reads them
        if after_step is not None:
            after_step(step, results)
    return RunReport(results)
