"""A connection error is final only if the host is still not connected when pyinfra is done:
pyinfra's reboot operation retries while the guest boots, and its early tries fail."""

from __future__ import annotations

from types import SimpleNamespace

from provision.runner import HostResult, _Collector


def state_with(connected: dict[str, bool]):
    hosts = {name: SimpleNamespace(name=name, connected=up) for name, up in connected.items()}
    return SimpleNamespace(inventory=SimpleNamespace(get_host=hosts.__getitem__)), hosts


def test_host_that_reconnected_after_early_errors_stays_reachable():
    results = {"node1": HostResult("node1")}
    collector = _Collector(results, "reboot", lambda host, text: None)
    state, hosts = state_with({"node1": True})
    collector.host_connect_error(state, hosts["node1"], "Error reading SSH protocol banner")
    collector.settle_connections(state)
    assert results["node1"].reachable and results["node1"].failures == []


def test_host_never_connected_is_unreachable_with_the_last_error():
    results = {"node2": HostResult("node2")}
    collector = _Collector(results, "base", lambda host, text: None)
    state, hosts = state_with({"node2": False})
    collector.host_connect_error(state, hosts["node2"], "Connection refused")
    collector.settle_connections(state)
    assert not results["node2"].reachable
    assert results["node2"].failures == ["base: unreachable: Connection refused"]
