"""Gather pyinfra facts from every host at once (`provision facts`, `status`, reboots)."""

from __future__ import annotations

from typing import Any

from provision.engine.collector import Collector
from provision.engine.pyinfra_state import new_state
from provision.engine.results import FactsResult, HostResult, OnEvent, no_events
from provision.inventory import Node


def gather_facts(
    nodes: list[Node],
    wanted: dict[str, tuple[type, dict[str, Any]]],
    on_event: OnEvent = no_events,
) -> FactsResult:
    """Gather pyinfra facts (name -> (FactClass, kwargs)) from every node in parallel.

    A host either answers every fact or lands in `failed` with the reason; one host's
    failure (a dropped connection, a missing command) never costs the others their facts.
    """
    import gevent
    from pyinfra.api.connect import connect_all, disconnect_all
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.context import ctx_state

    state = new_state(nodes, parallel=0)
    results = {n.name: HostResult(n.name) for n in nodes}
    collector = Collector(results, "connect", on_event)
    state.add_callback_handler(collector)
    out: dict[str, dict[str, Any]] = {}
    fact_errors: dict[str, str] = {}

    def one(host: Any) -> None:
        values, error = _host_facts(state, host, wanted, on_event)
        if error is None:
            out[host.name] = values
            on_event(host.name, "done")
        else:
            fact_errors[host.name] = error
            on_event(host.name, "failed")

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


def _host_facts(
    state: Any, host: Any, wanted: dict[str, tuple[type, dict[str, Any]]], on_event: OnEvent
) -> tuple[dict[str, Any], str | None]:
    """Every wanted fact of one host, or the first that failed and why."""
    values: dict[str, Any] = {}
    for name, (fact, kwargs) in wanted.items():
        on_event(host.name, f"fact {name}")
        try:
            values[name] = host.get_fact(fact, **kwargs)
        except Exception as e:  # any error is this host's alone
            return values, f"fact {name}: {type(e).__name__}: {e}".rstrip(": ")
        # pyinfra answers a failed fact command with the fact's default (None) and drops
        # the host from the run; a half-gathered host is reported, not summarised.
        if values[name] is None or host not in state.active_hosts:
            return values, f"fact {name}: the command failed on the host"
    return values, None


def _unreachable_only(results: dict[str, HostResult]) -> FactsResult:
    unreachable = {name: "; ".join(str(f) for f in r.failures) for name, r in results.items() if not r.reachable}
    return FactsResult({}, unreachable)
