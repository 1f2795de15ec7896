"""engine/pyinfra_state: what it changes in pyinfra for every pass."""

from __future__ import annotations

import pytest


def test_a_pass_works_on_as_many_hosts_at_once_as_the_smallest_parallel_setting_asks():
    from dataclasses import replace

    from provision.engine.pyinfra_state import pass_parallel
    from provision.inventory import Node, SshTarget
    from provision.settings import Settings

    def node(name: str, parallel: int) -> Node:
        target = SshTarget(name, 22, "root", None, None, "yes")
        return Node(name, target, (), replace(Settings(), parallel=parallel), {})

    assert pass_parallel([node("a", 0), node("b", 0)]) == 0  # pyinfra's choice
    assert pass_parallel([node("a", 0), node("b", 25), node("c", 50)]) == 25
    assert pass_parallel([]) == 0


def test_merged_host_data_answers_every_key_as_pyinfras_layers_do():
    # Each host's fixed data layers are merged once (a third of a converged up's CPU was
    # pyinfra walking them); what a host reads must not change: the same value for a key
    # in any layer, in pyinfra's order of precedence, and a missing key still missing.
    from pyinfra.api import Inventory

    from provision.engine.pyinfra_state import _merged_host_data

    inventory = Inventory(
        ([("a", {"only_host": 1, "both": "host"}), ("b", {})], {"everywhere": "global", "both": "global"}),
        first=(["a", "b"], {"grouped": "first", "in_two": "first", "both": "group"}),
        second=(["a"], {"in_two": "second"}),
        override_data={"overridden": "cli"},
    )
    keys = ("only_host", "both", "everywhere", "grouped", "in_two", "overridden", "_sudo", "nowhere")
    for host in inventory:
        merged = _merged_host_data(host, inventory)
        for key in keys:
            assert getattr(merged, key, "missing") == getattr(host.data, key, "missing"), (host.name, key)
        assert merged.dict() == host.data.dict()
    a = inventory.get_host("a")
    merged = _merged_host_data(a, inventory)
    assert (merged.both, merged.in_two) == ("host", "second")
    assert not hasattr(merged, "nowhere")

    # What pyinfra changes during a pass is read at each lookup: its override layer (a
    # deploy's `host.data.x = ...`) and the running deploy's defaults, below every layer.
    merged.both = "set in a deploy"
    assert merged.both == "set in a deploy"
    a.current_deploy_data = {"deploy_default": 3, "everywhere": "deploy"}
    assert (merged.deploy_default, merged.everywhere) == (3, "global")
    a.current_deploy_data = None
    assert not hasattr(merged, "deploy_default")
    with pytest.raises(AttributeError, match=r"^Host `a` has no data `nowhere`$"):
        merged.nowhere  # noqa: B018  # a deploy reading a key no layer has

    # A value is handed out as a copy, as pyinfra does: changing it does not stick.
    listed = Inventory(([("c", {"items": [1]})], {}))
    c = listed.get_host("c")
    _merged_host_data(c, listed).items.append(2)
    assert _merged_host_data(c, listed).items == [1]


def test_a_hosts_operations_run_in_the_order_pyinfra_would_give_them():
    # Each host runs its own list of operations (pyinfra's global sort, asked once per host,
    # cost the square of the fleet). On hosts given overlapping, differently ordered
    # operations, each host's list is pyinfra's global order restricted to that host.
    from types import SimpleNamespace

    from pyinfra.api.state import State

    from provision.engine.op_order import host_op_order

    hosts = [
        SimpleNamespace(op_hash_order=["base", "users", "ssh", "nfs"]),
        SimpleNamespace(op_hash_order=["base", "gpu", "ssh"]),
        SimpleNamespace(op_hash_order=["users", "gpu", "train"]),
    ]
    lines = {"base": 1, "users": 2, "gpu": 3, "ssh": 4, "nfs": 5, "train": 6}  # where each was called
    state = SimpleNamespace(inventory=hosts, op_meta={op: SimpleNamespace(op_order=(n,)) for op, n in lines.items()})
    everything = State.get_op_order(state)  # type: ignore[arg-type]
    for host in hosts:
        assert host_op_order(host) == [op for op in everything if op in host.op_hash_order]
