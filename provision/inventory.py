"""Load a pyinfra inventory file and validate it into typed records.

The inventory is pyinfra's own format, unchanged: a Python file whose top-level lists are
groups of hosts (names, or ``(name, data)`` tuples), plus ``group_data/*.py`` beside it.
pyinfra's own loader reads it, so an existing pyinfra inventory loads the same way here.

Everything is checked before any host is contacted. Every problem found is collected and
raised together as one ``InputError``, so the user fixes them all in one pass.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from provision import inventory_checks, inventory_file
from provision import values as v
from provision.cluster import Cluster, Node, SshTarget
from provision.errors import InputError, Problem
from provision.pyinfra_keys import port_problem, pyinfra_key_problems
from provision.settings import ROLES, parse_settings

# Cluster, Node and SshTarget are cluster.py's; every importer finds them here too.
__all__ = ["Cluster", "Node", "SshTarget", "describe_roles", "load"]


def load(path: str | os.PathLike[str]) -> Cluster:
    """Load and validate an inventory file. Raises InputError listing every problem."""
    inventory_path = Path(path)
    if not inventory_path.is_file():
        raise InputError(
            Problem(str(path), "inventory file does not exist", "check the path, e.g. inventories/example.py")
        )
    pyinfra_inventory, attrs = inventory_file.load(inventory_path)
    problems: list[Problem] = []
    groups: dict[str, list[Problem]] = {}  # each group's own problems, checked once, not once a host
    nodes = [_node(pyinfra_inventory, host, inventory_path, problems, groups) for host in pyinfra_inventory]
    cluster = Cluster(inventory_path, tuple(nodes), pyinfra_inventory)
    problems += inventory_checks.problems(cluster, attrs)
    if not nodes:
        problems.append(
            Problem(
                str(inventory_path),
                "the inventory has no hosts",
                "add a group, e.g. nodes = [('node1', {'ssh_hostname': '10.0.0.1'})]",
            )
        )
    if problems:
        raise InputError(problems)
    return cluster


def _node(inv: Any, host: Any, inventory_path: Path, problems: list[Problem], groups: dict[str, list[Problem]]) -> Node:
    where = f"{inventory_path}: host {v.host_label(host.name)}"
    name_problem = v.node_name(host.name)
    if name_problem:
        problems.append(Problem(where, name_problem, "name hosts by host name; the address goes in ssh_hostname"))
    _check_layers(inv, host, inventory_path, problems, groups)
    data = {k: v for k, v in host.data.dict().items()}
    settings, _ = parse_settings(data, where)  # layer problems were reported with their source
    ssh = _ssh_target(host.name, data, where, problems)
    if ssh.user is not None and ssh.user == settings.training_user:
        problems.append(
            Problem(
                f"{where}: key training_user",
                f"{settings.training_user!r} is also ssh_user, the account provision logs in as (with sudo): "
                "a training job would run with root's reach",
                "keep the default training_user (train), or name another unprivileged account",
            )
        )
    return Node(host.name, ssh, tuple(host.groups), settings, data)


def _check_layers(
    inv: Any, host: Any, inventory_path: Path, problems: list[Problem], groups: dict[str, list[Problem]]
) -> None:
    """Validate each source of this host's data separately, so a problem names its file.
    A group's data is the same for each of its hosts: checked the first time a host of the
    group is met (``groups`` keeps the answer), which keeps loading linear in the hosts."""
    found = _layer_problems(f"{inventory_path}: host {v.host_label(host.name)}", inv.get_host_data(host.name))
    group_dir = inventory_path.parent / "group_data"
    for group in ("all", *host.groups):
        if group not in groups:
            data = inv.get_data() if group == "all" else inv.get_group_data(group)
            source = group_dir / f"{group}.py"
            groups[group] = _layer_problems(
                f"{source}" if source.is_file() else f"{inventory_path}: group {group}", data
            )
            found += groups[group]  # a group's problems are said once, with the first host met
    for problem in found:
        if problem not in problems:
            problems.append(problem)


def _layer_problems(where: str, data: dict[str, Any]) -> list[Problem]:
    return parse_settings(data, where)[1] + pyinfra_key_problems(data, where)


def _ssh_target(name: str, data: dict[str, Any], where: str, problems: list[Problem]) -> SshTarget:
    hostname = data.get("ssh_hostname") or name
    port = data.get("ssh_port", 22)
    if port_problem(port):
        port = 22  # its layer's check said so, naming the file it came from
    key = data.get("ssh_key")
    if key is not None:
        key = os.path.expanduser(str(key))
        if not os.path.isfile(key):
            problems.append(
                Problem(
                    f"{where}: key ssh_key",
                    f"SSH key file {v.shown(key)} does not exist",
                    "point ssh_key at an existing private key",
                )
            )
    known_hosts = data.get("ssh_known_hosts_file")
    if known_hosts is not None:
        known_hosts = os.path.expanduser(str(known_hosts))
    strict = data.get("ssh_strict_host_key_checking", "yes")
    return SshTarget(str(hostname), port, data.get("ssh_user"), key, known_hosts, str(strict))


def describe_roles() -> list[tuple[str, str]]:
    return sorted(ROLES.items())
