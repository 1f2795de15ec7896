"""Gather pyinfra facts from every host at once (`provision facts`, `status`, reboots)."""

from __future__ import annotations

import time
from typing import Any

from provision.engine.collector import Collector
from provision.engine.connect import connect_all
from provision.engine.deadlines import disconnect_bounded
from provision.engine.fact_batch import answers, batch_fact
from provision.engine.pyinfra_state import new_state
from provision.engine.results import FactsResult, HostResult, OnEvent, TimedOut, no_events
from provision.inventory import Node
from provision.pyinfra_context import held

# Deadlines: each fact's command, and the whole gather. A host that hangs (a wedged disk,
# an sshd that stops answering mid-session) lands in `failed` when its time is up; the
# others keep what they answered. A TCG test VM's slowest fact (importing the venv's
# packages) takes well under a minute.
FACT_TIMEOUT_S = 120
CHANNEL_GRACE_S = 5  # past a fact's own deadline, before its host is cut off whatever it waits on
GATHER_TIMEOUT_S = 300.0
NO_HOSTS_LEFT = "No hosts remaining!"  # pyinfra's words when it drops the last active host


def gather_facts(
    nodes: list[Node],
    wanted: dict[str, tuple[type, dict[str, Any]]],
    on_event: OnEvent = no_events,
    timeout_s: float = GATHER_TIMEOUT_S,
    fact_timeout_s: int = FACT_TIMEOUT_S,
) -> FactsResult:
    """Gather pyinfra facts (name -> (FactClass, kwargs)) from every node in parallel.

    A host either answers every fact or lands in `failed` with the reason; one host's
    failure (a dropped connection, a missing command, no answer within its deadline) never
    costs the others their facts.
    """
    import gevent
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.context import ctx_state

    state = new_state(nodes)
    results = {n.name: HostResult(n.name) for n in nodes}
    collector = Collector(results, "connect", on_event)
    state.add_callback_handler(collector)
    out: dict[str, dict[str, Any]] = {}
    fact_errors: dict[str, str] = {}
    asking: dict[str, str] = {}  # host -> the fact it is waiting for

    # The settings' deadlines bound facts too, where they are shorter than the defaults
    # here: each fact by the host's command_timeout_s, the gather by the longest
    # step_timeout_s (one clock for the whole gather).
    timeout_s = min(timeout_s, max((n.settings.step_timeout_s for n in nodes), default=timeout_s))
    fact_limit = {n.name: max(1, min(fact_timeout_s, int(timeout_s), n.settings.command_timeout_s)) for n in nodes}

    batch = batch_fact(wanted)  # one fact class for every host: made once, not per host

    def one(host: Any) -> None:
        # pyinfra's _timeout bounds reading a command's output, not opening the SSH channel
        # it runs in: a host that froze after login (seen: a VM stopped through QMP) left
        # the channel open request unanswered until the whole gather's deadline. The host's
        # facts are one command (fact_batch), so its own deadline bounds all of it.
        limit = fact_limit[host.name]
        try:
            with gevent.Timeout(limit + CHANNEL_GRACE_S):
                values, error = _host_facts(state, host, wanted, batch, on_event, asking, limit)
        except gevent.Timeout:
            values, error = {}, str(TimedOut.after(asking.get(host.name, "facts"), limit))
        if error is None:
            out[host.name] = values
            on_event(host.name, "done")
        else:
            fact_errors[host.name] = error
            on_event(host.name, "failed")

    with held(ctx_state, state):
        try:
            try:
                connect_all(state)
            except PyinfraError:
                collector.settle_connections(state)
                return _unreachable_only(results)  # "No hosts remaining!": none answered
            collector.settle_connections(state)
            hosts = list(state.active_hosts)
            greenlets = [state.pool.spawn(one, h) for h in hosts]
            gevent.joinall(greenlets, timeout=timeout_s)
            for host, g in zip(hosts, greenlets, strict=True):
                if not g.ready():
                    g.kill(block=False)
                    fact_errors[host.name] = str(TimedOut.after(asking.get(host.name, "facts"), timeout_s))
                    on_event(host.name, "failed")
        finally:
            disconnect_bounded(state)
    result = _unreachable_only(results)
    result.facts.update(out)
    for name, why in fact_errors.items():
        result.failed.setdefault(name, why)
    return result


def _host_facts(
    state: Any,
    host: Any,
    wanted: dict[str, tuple[type, dict[str, Any]]],
    batch: type,
    on_event: OnEvent,
    asking: dict[str, str],
    timeout_s: int,
) -> tuple[dict[str, Any], str | None]:
    """Every wanted fact of one host, in one command (fact_batch), or the first that
    failed and why."""
    label = ("facts " if len(wanted) > 1 else "fact ") + ", ".join(wanted)  # "facts os, cpu, ..."
    on_event(host.name, label)
    asking[host.name] = label
    from pyinfra.api.exceptions import PyinfraError

    start = time.monotonic()
    try:
        lines = host.get_fact(batch, _timeout=timeout_s)
    except Exception as e:  # any error is this host's alone
        # But pyinfra drops a host whose fact failed or timed out, and raises "No hosts
        # remaining!" in the greenlet of the last one it drops: that host's own failure,
        # told below like any other, not an error of its own.
        dropped_last = isinstance(e, PyinfraError) and str(e) == NO_HOSTS_LEFT and host not in state.active_hosts
        if not dropped_last:
            return {}, f"{label}: {type(e).__name__}: {e}".rstrip(": ")
        lines = None
    # pyinfra answers a failed fact command with the fact's default (None) and drops the
    # host from the run. A command stopped at its _timeout looks the same to us (pyinfra
    # logs the TimeoutError and returns None), so the time it took tells a hung host apart.
    if lines is None or host not in state.active_hosts:
        if time.monotonic() - start >= timeout_s:
            return {}, str(TimedOut.after(label, timeout_s))
        return {}, f"{label}: the command failed on the host"
    values: dict[str, Any] = {}
    for name, answer in answers(wanted, lines).items():
        if answer.error:
            return values, answer.error
        values[name] = answer.value
    return values, None


def _unreachable_only(results: dict[str, HostResult]) -> FactsResult:
    unreachable = {name: "; ".join(str(f) for f in r.failures) for name, r in results.items() if not r.reachable}
    return FactsResult({}, unreachable)
