"""The ONLY place that builds pyinfra's Inventory, Config and State.

Every pass of the engine (a step, a plan, a round of facts) starts from new_state(), so
the facts a step reads are gathered after the previous step changed the host.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from copy import copy
from typing import Any

from provision import hostkeys, openfiles
from provision.engine import pyinfra_cpu
from provision.engine.context import NODE_KEY, RUN_KEY, RunContext
from provision.engine.deadlines import quiet_interrupts
from provision.inventory import Node

# pyinfra logs every connection and operation itself; the progress display replaces that.
logging.getLogger("pyinfra").setLevel(logging.CRITICAL)


def pyinfra_inventory(nodes: Iterable[Node], run: RunContext | None = None) -> Any:
    """A pyinfra Inventory for these nodes, with provision's SSH defaults applied; each
    host's data carries its typed Node and, inside a run, the RunContext."""
    from pyinfra.api import Inventory

    names_data = []
    groups: dict[str, list[str]] = {}
    for node in nodes:
        data = dict(node.data)
        data[NODE_KEY] = node
        if run is not None:
            data[RUN_KEY] = run
        # Every command of every operation and fact gets a deadline (pyinfra's _timeout as
        # host data is the default for all of them); an inventory's own _timeout wins.
        data.setdefault("_timeout", node.settings.command_timeout_s)
        data["ssh_strict_host_key_checking"] = node.ssh.strict_host_key_checking
        if node.ssh.key:
            data["ssh_key"] = node.ssh.key
        names_data.append((node.name, data))
        for group in node.groups:
            groups.setdefault(group, []).append(node.name)
    inventory = Inventory((names_data, {}), **{g: (names, {}) for g, names in groups.items()})
    for host in inventory:
        host.data = _merged_host_data(host, inventory)
    return inventory


def _merged_host_data(host: Any, inventory: Any) -> Any:
    """The host's data with its fixed layers merged once.

    pyinfra's HostData looks a key up layer by layer (override, the inventory's override,
    host, groups, global, then the current deploy's defaults), calling a function and
    catching a KeyError for each, and merges every group's data afresh on each lookup. It
    looks up each of about 35 global arguments for every fact asked and every operation,
    almost all of them missing: at 100 simulated hosts that was a third of the controller's
    CPU in a converged `up` (BENCHMARKS.md, issue 20). The inventory's layers do not change
    during a pass, so they are merged here; what pyinfra changes during a pass (its
    override layer, the running deploy's defaults) is still read at each lookup, in
    pyinfra's order."""
    fixed: dict[str, Any] = dict(inventory.get_data())
    fixed.update(inventory.get_groups_data(host.groups))
    fixed.update(inventory.get_host_data(host.name))
    fixed.update(inventory.get_override_data())
    return _merged_host_data_class()(host, fixed)


class _NoData(AttributeError):
    """pyinfra's words for a missing key, put together only when shown: pyinfra asks for
    about 35 keys a host does not have, for every fact and operation."""

    def __str__(self) -> str:
        host, key = self.args
        return f"Host `{host}` has no data `{key}`"


@functools.cache
def _merged_host_data_class() -> Any:
    from pyinfra.api.host import HostData

    class MergedHostData(HostData):
        def __init__(self, host: Any, fixed: dict[str, Any]):
            # The same layers in pyinfra's shape, so its dict() and str() still work.
            super().__init__(host, lambda: fixed, host.get_deploy_data)
            self.__dict__["fixed"] = fixed
            names = pyinfra_cpu.global_argument_names()
            self.__dict__["fixed_globals"] = {k: v for k, v in fixed.items() if k in names}

        def __getattr__(self, key: str) -> Any:
            for layer in (self.override_datas, self.fixed, self.host.get_deploy_data()):
                if key in layer:
                    return copy(layer[key])  # as pyinfra: changing the value does not stick
            raise _NoData(self.host, key)

        def global_argument_values(self) -> dict[str, Any]:
            """The values, copied, of pyinfra's global arguments this host's data sets, in
            __getattr__'s order of precedence; one it does not set is simply absent, where
            __getattr__ would raise (pyinfra_cpu.pop_global_arguments)."""
            names = pyinfra_cpu.global_argument_names()
            found = {k: v for k, v in self.host.get_deploy_data().items() if k in names}
            found.update(self.fixed_globals)
            found.update((k, v) for k, v in self.override_datas.items() if k in names)
            return {k: copy(v) for k, v in found.items()}

    return MergedHostData


def _host_keys(filenames: tuple[str, ...]) -> Any:
    return hostkeys.load(*filenames)


def _host_key_policy(mode: str | None) -> Any:
    """pyinfra's "ask" (its default) would prompt; provision sets the mode on every host."""
    return hostkeys.policy(mode if mode in ("accept-new", "no", "off") else "yes")


def pass_parallel(nodes: list[Node]) -> int:
    """How many of the pass's hosts are connected to and worked on at once: the smallest
    ``parallel`` a host asks for, 0 (pyinfra's choice) when none asks. A host queued
    behind the others starts its deadlines when its turn comes (HostClocks, gather_facts)."""
    asked = [n.settings.parallel for n in nodes if n.settings.parallel > 0]
    return min(asked, default=0)


def new_state(nodes: list[Node], run: RunContext | None = None) -> Any:
    """A fresh pyinfra State over these nodes."""
    from pyinfra.api import Config, State
    from pyinfra.connectors.sshuserclient import client

    openfiles.ensure(len(nodes))  # every host of the pass is connected at once
    pyinfra_cpu.apply()

    # pyinfra's own loader stops at known_hosts' marker lines and memoizes the file for the
    # life of the process; its accept-new rewrites the file without them. provision reads
    # the file the one way both SSH seams share (hostkeys), fresh for each run (a testbed VM
    # restarted on a new port has a new entry), and refuses @revoked keys.
    client.get_host_keys = _host_keys
    client.get_missing_host_key_policy = _host_key_policy
    quiet_interrupts()
    # pyinfra has one connect timeout per pass: the longest any of its hosts asks for.
    connect_timeout = max((n.settings.connect_timeout_s for n in nodes), default=15)
    config = Config(PARALLEL=pass_parallel(nodes), CONNECT_TIMEOUT=connect_timeout)
    return State(pyinfra_inventory(nodes, run), config)
