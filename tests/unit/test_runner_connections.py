"""A connection error is final only if the host is still not connected when pyinfra is done:
pyinfra's reboot operation retries while the guest boots, and its early tries fail."""

from __future__ import annotations

from types import SimpleNamespace

from provision.engine import HostResult
from provision.engine.collector import Collector


def state_with(connected: dict[str, bool]):
    hosts = {name: SimpleNamespace(name=name, connected=up) for name, up in connected.items()}
    return SimpleNamespace(inventory=SimpleNamespace(get_host=hosts.__getitem__)), hosts


def settled(name: str, step: str, connected: bool, error: str) -> HostResult:
    """A host's row after one connection error and pyinfra's final connected state."""
    results = {name: HostResult(name)}
    collector = Collector(results, step, lambda host, text: None)
    state, hosts = state_with({name: connected})
    collector.host_connect_error(state, hosts[name], error)
    collector.settle_connections(state)
    return results[name]


def test_host_that_reconnected_after_early_errors_stays_reachable():
    row = settled("node1", "reboot", True, "Error reading SSH protocol banner")
    assert row.reachable
    assert row.failures == []


def test_host_never_connected_is_unreachable_with_the_last_error():
    row = settled("node2", "base", False, "Connection refused")
    assert not row.reachable
    assert [str(f) for f in row.failures] == ["base: unreachable: Connection refused"]
