"""The ONLY place that builds pyinfra's Inventory, Config and State.

Every pass of the engine (a step, a plan, a round of facts) starts from new_state(), so
the facts a step reads are gathered after the previous step changed the host.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
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
    return Inventory((names_data, {}), **{g: (names, {}) for g, names in groups.items()})


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
