"""The ONLY place that builds pyinfra's Inventory, Config and State.

Every pass of the engine (a step, a plan, a round of facts) starts from new_state(), so
the facts a step reads are gathered after the previous step changed the host.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Iterable
from copy import copy
from typing import Any

from provision import hostkeys, openfiles
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

        def __getattr__(self, key: str) -> Any:
            for layer in (self.override_datas, self.fixed, self.host.get_deploy_data()):
                if key in layer:
                    return copy(layer[key])  # as pyinfra: changing the value does not stick
            raise _NoData(self.host, key)

    return MergedHostData


def _host_keys(filenames: tuple[str, ...]) -> Any:
    return hostkeys.load(*filenames)


def _host_key_policy(mode: str | None) -> Any:
    """pyinfra's "ask" (its default) would prompt; provision sets the mode on every host."""
    return hostkeys.policy(mode if mode in ("accept-new", "no", "off") else "yes")


def cache_global_arguments() -> None:
    """pyinfra works out its global arguments' names and types (typing.get_type_hints of a
    fixed TypedDict) afresh for every fact asked and every host connected: at 1,000 hosts,
    a sixth of the controller's CPU in `provision facts` (BENCHMARKS.md, issue 20). The
    answer never changes within a process, so it is worked out once. Its callers only
    iterate over the list."""
    from pyinfra.api import arguments

    if not hasattr(arguments.all_global_arguments, "cache_info"):
        arguments.all_global_arguments = functools.cache(arguments.all_global_arguments)


def cache_command_templates() -> None:
    """pyinfra builds the command of many of its facts (File, Directory, Sha1File...) from
    a fixed template it shlex-splits afresh at each call: 12 % of the controller's CPU in
    a converged `up` of 400 simulated hosts (BENCHMARKS.md, issue 20). A split depends only
    on its template, so it is kept; bounded, as a caller could pass a string of its own."""
    import shlex

    from pyinfra.api import command

    if getattr(command.shlex, "provision_cached", False):
        return

    @functools.lru_cache(maxsize=512)
    def split(text: str) -> tuple[str, ...]:
        return tuple(shlex.split(text))  # a tuple: a caller cannot change the kept answer

    cached = types.ModuleType("shlex")  # the real module's every name, with split kept
    cached.__dict__.update(vars(shlex))
    cached.__dict__.update(split=split, provision_cached=True)
    command.shlex = cached


def collect_garbage_less_often() -> None:
    """Python's default collector thresholds (700 new objects) run a young collection every
    few hundred allocations and, now and then, a full one over the whole heap, which grows
    with the fleet: in a converged `up` of 1,000 simulated hosts, 10,620 collections took
    6.6 of its 45 s of controller CPU (15 %; 5 % at 100 hosts). Every 10,000 allocations:
    248 collections, 1.6 s, peak RSS 259 MiB (every 50,000: 0.8 s, but 379 MiB). A
    controller's objects live for a pass and go. Process-wide, so set once, as pyinfra's
    own patches are; a threshold already higher (an embedding program's) stays."""
    import gc

    if gc.get_threshold()[0] < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 10)


GC_YOUNG_THRESHOLD = 10_000


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
    cache_global_arguments()
    cache_command_templates()
    collect_garbage_less_often()

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
