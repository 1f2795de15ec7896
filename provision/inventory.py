"""Load a pyinfra inventory file and validate it into typed records.

The inventory is pyinfra's own format, unchanged: a Python file whose top-level lists are
groups of hosts (names, or ``(name, data)`` tuples), plus ``group_data/*.py`` beside it.
pyinfra's own loader reads it, so an existing pyinfra inventory loads the same way here.

Everything is checked before any host is contacted. Every problem found is collected and
raised together as one ``InputError``, so the user fixes them all in one pass.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provision import inventory_file
from provision import values as v
from provision.errors import InputError, Problem
from provision.settings import (
    ROLES,
    Settings,
    cross_key_problems,
    is_pyinfra_key,
    key_label,
    parse_settings,
    type_ok,
)
from provision.values import Check


@dataclass(frozen=True)
class SshTarget:
    """How the controller reaches a host (the management network)."""

    hostname: str  # address or DNS name that SSH connects to
    port: int  # SSH port
    user: str | None  # login user; None means the controller's default
    key: str | None  # private key file, already checked to exist
    known_hosts: str | None  # known_hosts file pinning the host key; None: ~/.ssh/known_hosts
    strict_host_key_checking: str  # "yes" by default: an unknown key is refused


@dataclass(frozen=True)
class Node:
    """One host of the inventory, with its validated settings."""

    name: str  # the inventory name, as pyinfra knows it
    ssh: SshTarget  # management-network access
    groups: tuple[str, ...]  # pyinfra groups; roles come from these (see settings.ROLES)
    settings: Settings  # every knob, defaults filled in
    data: dict[str, Any] = field(repr=False, default_factory=dict)  # raw merged host data

    @property
    def cluster_address(self) -> str:
        """Address on the cluster (data) network; the SSH address when none is given."""
        return self.settings.cluster_address or self.ssh.hostname

    def has_role(self, role: str) -> bool:
        return role in self.groups


@dataclass(frozen=True)
class Cluster:
    """A loaded, validated inventory, or part of one (``--limit``).

    ``nodes`` are the hosts a command contacts. What the whole cluster shares (/etc/hosts,
    the training user's keys, the storage host, roles) comes from ``all_nodes``: a run
    limited to some hosts writes the same cluster-wide files on them as a full run."""

    path: Path  # the inventory file
    nodes: tuple[Node, ...]  # the hosts to contact, in inventory order
    pyinfra_inventory: Any = field(repr=False, default=None)  # pyinfra.api.Inventory it came from
    whole: tuple[Node, ...] = field(repr=False, default=())  # every host, when nodes is a part

    @property
    def all_nodes(self) -> tuple[Node, ...]:
        """Every host of the inventory, whatever part of it this run contacts."""
        return self.whole or self.nodes

    def part(self, nodes: Iterable[Node]) -> Cluster:
        """This cluster contacting only ``nodes`` (a --limit, a rollout's wave), still
        knowing every host for what the cluster shares."""
        return replace(self, nodes=tuple(nodes), whole=self.all_nodes)

    def node(self, name: str) -> Node:
        for n in self.all_nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def with_role(self, role: str) -> list[Node]:
        return [n for n in self.all_nodes if n.has_role(role)]

    def head_node(self) -> tuple[Node, str]:
        """The Slurm controller and why it is that host: the head group's one host, else the
        storage host, else the first host."""
        heads = self.with_role("head")
        if heads:
            return heads[0], "the head group"
        storage = self.storage_node()
        if storage is not None:
            return storage, "no head group: the storage host"
        return self.all_nodes[0], "no head group and no storage host: the first host"

    def compute_nodes(self) -> list[Node]:
        """The hosts that run Slurm jobs: the compute group when there is one, else every host,
        the head among them unless its slurm_head_computes is false; never a host whose
        slurm setting is skip."""
        chosen = [n for n in self.with_role("compute") if n.settings.slurm != "skip"]
        if self.with_role("compute"):
            return chosen
        head, _ = self.head_node()
        return [
            n
            for n in self.all_nodes
            if n.settings.slurm != "skip" and (n is not head or n.settings.slurm_head_computes)
        ]

    def storage_node(self) -> Node | None:
        """The NFS server and backup target: the nfs_server setting, else the first storage host."""
        named = sorted({n.settings.nfs_server for n in self.all_nodes if n.settings.nfs_server})
        if named:
            return self.node(named[0])
        storage = self.with_role("storage")
        return storage[0] if storage else None


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
    problems += _cross_key_problems(inventory_path, nodes)
    if not nodes:
        problems.append(
            Problem(
                str(inventory_path),
                "the inventory has no hosts",
                "add a group, e.g. nodes = [('node1', {'ssh_hostname': '10.0.0.1'})]",
            )
        )
    problems += _file_name_problems(inventory_path, attrs)
    problems += _cluster_wide_problems(inventory_path, nodes)
    problems += _duplicates(inventory_path, nodes, attrs)
    problems += _references(inventory_path, nodes)
    problems += _network_problems(inventory_path, nodes)
    problems += _head_problems(inventory_path, nodes)
    if problems:
        raise InputError(problems)
    return Cluster(inventory_path, tuple(nodes), pyinfra_inventory)


def _node(inv: Any, host: Any, inventory_path: Path, problems: list[Problem], groups: dict[str, list[Problem]]) -> Node:
    where = f"{inventory_path}: host {host_label(host.name)}"
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


def _file_name_problems(inventory_path: Path, attrs: dict[str, Any]) -> list[Problem]:
    """pyinfra makes the file's name a group of every host: a file named storage.py or
    gpu_nodes.py would give every host that role."""
    stem = inventory_path.name.rsplit(".", 1)[0]
    if stem not in ROLES or stem in attrs:
        return []
    return [
        Problem(
            str(inventory_path),
            f"the file's name {stem!r} is a role, and pyinfra makes the file's name a group of every host",
            "rename the file (e.g. cluster.py)",
        )
    ]


# Settings every host must share: the training account owns files on the NFS shares by uid,
# and one run (the launcher, the checkpoints' paths) reads one host's shares and mount root.
CLUSTER_WIDE = ("training_user", "training_uid", "nfs_mount_root")


def _cluster_wide_problems(inventory_path: Path, nodes: list[Node]) -> list[Problem]:
    problems = []
    try:
        storage = Cluster(inventory_path, tuple(nodes)).storage_node()
    except KeyError:  # nfs_server names no host: _references says so
        storage = None
    if storage is not None:  # a host may mount fewer shares than the server exports, never more
        exported = set(storage.settings.nfs_exports)
        for node in nodes:
            missing = [share for share in node.settings.nfs_exports if share not in exported]
            if missing:
                problems.append(
                    Problem(
                        f"{inventory_path}: host {host_label(node.name)}: key nfs_exports",
                        f"{', '.join(missing)} not exported by the storage host {host_label(storage.name)}",
                        "give every host the storage host's nfs_exports (or fewer)",
                    )
                )
    for key in CLUSTER_WIDE:
        seen: dict[str, list[str]] = {}
        for node in nodes:
            seen.setdefault(repr(getattr(node.settings, key)), []).append(host_label(node.name))
        if len(seen) > 1:
            said = "; ".join(
                f"{value} on {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}" for value, names in seen.items()
            )
            problems.append(
                Problem(
                    f"{inventory_path}: key {key}",
                    f"differs between hosts ({said}); the cluster has one",
                    "set it once, in group_data/all.py",
                )
            )
    return problems


def _cross_key_problems(inventory_path: Path, nodes: list[Node]) -> list[Problem]:
    """Each host's merged settings taken together (settings.cross_key_problems): any layer
    may give either key of a pair, so only the merged data can tell. Hosts that share the
    problem (one group's data, usually) are named in one line, not a line each."""
    hosts: dict[Problem, list[str]] = {}
    for node in nodes:
        for problem in cross_key_problems(node.settings):
            hosts.setdefault(problem, []).append(host_label(node.name))
    out = []
    for problem, names in hosts.items():
        who = f"host {names[0]}" if len(names) == 1 else f"hosts {', '.join(names[:3])}"
        if len(names) > 3:
            who += f" and {len(names) - 3} more"
        out.append(replace(problem, where=f"{inventory_path}: {who}: {problem.where}"))
    return out


def host_label(name: str) -> str:
    """A host's name as problems print it: as written when it is a host name, else
    escaped (a newline or an escape sequence in a name must not reach the terminal raw)."""
    return name if v.address(name) is None else ascii(name)


def _check_layers(
    inv: Any, host: Any, inventory_path: Path, problems: list[Problem], groups: dict[str, list[Problem]]
) -> None:
    """Validate each source of this host's data separately, so a problem names its file.
    A group's data is the same for each of its hosts: checked the first time a host of the
    group is met (``groups`` keeps the answer), which keeps loading linear in the hosts."""
    found = _layer_problems(f"{inventory_path}: host {host_label(host.name)}", inv.get_host_data(host.name))
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


# Values of ssh_strict_host_key_checking that provision honours the same way in pyinfra
# (up, plan, facts) and in fabric/OpenSSH (validate, train, backup, verify). pyinfra's
# "ask" needs a terminal per host, which a parallel run cannot give.
HOST_KEY_POLICIES = ("yes", "accept-new", "no", "off")


# The shells root's commands may run under: each a system package's, in a root-owned
# directory. A path anywhere else (a home, /tmp) would be a file someone else can change.
SHELLS = tuple(f"{d}/{sh}" for d in ("/bin", "/usr/bin") for sh in ("sh", "bash", "dash"))


def _shell(value: Any) -> str | None:
    """A shell for pyinfra to run every command with, as root: one of SHELLS or its name."""
    if isinstance(value, str) and (value in SHELLS or f"/bin/{value}" in SHELLS):
        return None
    return f"{v.brief(value)} is not one of the system's shells ({', '.join(SHELLS)})"


def _root_dir(value: Any) -> str | None:
    """A directory root's commands work in or upload through: absolute, and not in a home
    (where its owner could swap what root then runs or copies into place)."""
    problem = v.absolute_path(value)
    if problem is None and (value == "/home" or value.startswith("/home/")):
        return f"{value!r} is in a home directory, which its owner can change under root"
    return problem


def _port(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536:
        return None
    return f"{v.brief(value)} is not a port number (1-65535)"


# Variables a host's commands (root's, through sudo) may be given. An allow-list: the loader
# and shell variables (LD_PRELOAD, PATH, BASH_ENV, PYTHONPATH...) would make root run code
# from wherever they point.
_ENV_NAMES = re.compile(r"(?i:(http|https|ftp|all|no)_proxy)|LANG|LANGUAGE|LC_[A-Z]+|TZ|TERM|DEBIAN_FRONTEND")


def _env(value: Any) -> str | None:
    names_ok = isinstance(value, dict) and all(
        isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in value
    )
    if not names_ok or not all(isinstance(x, str) and x.isprintable() for x in value.values()):
        return f"{v.brief(value)} is not a dict of environment variable names to one-line strings"
    refused = sorted(k for k in value if not _ENV_NAMES.fullmatch(k))
    if refused:
        return (
            f"{', '.join(refused)}: not given to root's commands (proxies, LANG, LC_*, TZ, TERM and "
            "DEBIAN_FRONTEND are; a loader or shell variable would run code from where it points)"
        )
    return None


def _paramiko_kwargs(value: Any) -> str | None:
    # Where and as whom to connect are the inventory's own keys, checked above.
    reserved = {"hostname", "port", "username", "password", "pkey", "key_filename", "sock", "passphrase"}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value) and not reserved & set(value):
        return None
    return f"{value!r} is not a dict of paramiko options other than {', '.join(sorted(reserved))}"


def _of_type(kind: type, low: float | None = None) -> Check:
    """A value of pyinfra's type for the key (settings' own rule: a bool is not an int, a
    float is any finite number), at least ``low`` when given."""
    bound = v.bounded(low, math.inf) if low is not None else None

    def check(value: Any) -> str | None:
        if type_ok(value, kind) and not (bound and bound(value)):
            return None
        wanted = f"a {kind.__name__}" if low is None else f"a {kind.__name__} of {low:g} or more"
        return f"{v.brief(value)} is not {wanted}"

    return check


# pyinfra's keys an inventory may give, each with the check of its value. pyinfra passes
# them to its connector and into the commands it builds, unquoted where they are a program
# (`_shell_executable: "sh -c id;"` would run `id` as root on every command) and untyped
# everywhere (`_sudo: "false"` is a true value). Operation arguments (`_ignore_errors`,
# `_if`, `_run_once`...) have no place in host data: they would change what `up` reports.
PYINFRA_VALUE_CHECKS: dict[str, Check] = {
    "ssh_hostname": v.address,
    "ssh_port": _port,
    "ssh_user": v.user_name,
    "ssh_password": _of_type(str),
    "ssh_key": v.controller_path,
    "ssh_key_password": _of_type(str),
    "ssh_allow_agent": _of_type(bool),
    "ssh_look_for_keys": _of_type(bool),
    "ssh_forward_agent": _of_type(bool),
    "ssh_config_file": v.controller_path,
    "ssh_known_hosts_file": v.controller_path,
    "ssh_paramiko_connect_kwargs": _paramiko_kwargs,
    "ssh_connect_retries": _of_type(int, 0),
    "ssh_connect_retry_min_delay": _of_type(float, 0),
    "ssh_connect_retry_max_delay": _of_type(float, 0),
    "ssh_file_transfer_protocol": lambda x: None if x in ("sftp", "scp") else f"{x!r} is not 'sftp' or 'scp'",
    "_sudo": _of_type(bool),
    "_sudo_user": v.user_name,
    "_use_sudo_login": _of_type(bool),
    "_sudo_password": _of_type(str),
    "_preserve_sudo_env": _of_type(bool),
    "_su_user": v.user_name,
    "_use_su_login": _of_type(bool),
    "_preserve_su_env": _of_type(bool),
    "_su_shell": _shell,
    "_su_password": _of_type(str),
    "_doas": _of_type(bool),
    "_doas_user": v.user_name,
    "_shell_executable": _shell,
    "_env": _env,
    "_timeout": _of_type(int, 1),
    "_get_pty": _of_type(bool),
    "_temp_dir": _root_dir,
    "_chdir": _root_dir,
}


def pyinfra_key_problems(data: dict[str, Any], where: str) -> list[Problem]:
    """pyinfra's own keys (``ssh_*`` connection data, ``_*`` global arguments) pass through
    to pyinfra untyped, so a typo would silently fall back to a default (a mistyped
    ``ssh_hostnme`` connects to the host's name). Check names against pyinfra's lists and
    the values provision itself reads."""
    import difflib

    from pyinfra.api.arguments import all_argument_meta
    from pyinfra.connectors.ssh import connector_data_meta

    known = {*connector_data_meta, *all_argument_meta}
    problems = []
    for key, value in data.items():
        if not is_pyinfra_key(key):
            continue
        if key.startswith("winrm_"):
            problems.append(Problem(f"{where}: key {key_label(key)}", "provision connects over SSH only"))
        elif key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"did you mean {close[0]}?" if close else "see pyinfra's connector and global arguments"
            problems.append(Problem(f"{where}: key {key_label(key)}", "unknown pyinfra key", hint))
        elif key not in PYINFRA_VALUE_CHECKS and key != "ssh_strict_host_key_checking":
            problems.append(
                Problem(
                    f"{where}: key {key}",
                    "an argument of single operations, not a host's setting",
                    "leave it out of the inventory",
                )
            )
        elif odd := v.plain_data(value):
            problems.append(Problem(f"{where}: key {key}", f"{v.brief(value)} {odd}"))
        elif key in PYINFRA_VALUE_CHECKS and (what := PYINFRA_VALUE_CHECKS[key](value)):
            problems.append(Problem(f"{where}: key {key}", what))
        elif key == "ssh_strict_host_key_checking" and value not in HOST_KEY_POLICIES:
            problems.append(
                Problem(
                    f"{where}: key {key}",
                    f"{value!r} is not one of {', '.join(HOST_KEY_POLICIES)}",
                    "'yes' (the default) refuses unknown and changed host keys",
                )
            )
    return problems


def _ssh_target(name: str, data: dict[str, Any], where: str, problems: list[Problem]) -> SshTarget:
    hostname = data.get("ssh_hostname") or name
    port = data.get("ssh_port", 22)
    if _port(port):
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


def _network_problems(inventory_path: Path, nodes: list[Node]) -> list[Problem]:
    """A cluster_cidr must hold every cluster address: NFS exports and the firewall-free
    cluster traffic go to that network only, so a node outside it is locked out."""
    problems = []
    # Each address parsed once and each network's outsiders found once: asked per node of
    # per node, a 1,000-node inventory took a million parses (BENCHMARKS.md, issue 20).
    addresses = [(n.name, _address(n.cluster_address)) for n in nodes]
    ssh_hosts = {_same_address(n.ssh.hostname): n.name for n in nodes}
    for name, a in addresses:
        if a is None:  # a DNS name: its address is not known here
            continue
        other = ssh_hosts.get(_same_address(str(a)))
        if other is not None and other != name and not a.is_loopback:  # loopback: port-forwarded hosts share it
            problems.append(
                Problem(
                    f"{inventory_path}: host {host_label(name)}: key cluster_address",
                    f"{a} is host {host_label(other)}'s SSH address; /etc/hosts and Slurm would send this host's "
                    "traffic there",
                    "give each host its own address",
                )
            )
        if isinstance(a, ipaddress.IPv6Address):
            problems.append(
                Problem(
                    f"{inventory_path}: host {host_label(name)}: key cluster_address",
                    f"{a} is an IPv6 address; the cluster network is IPv4 only (NFS mounts, the backup "
                    "repository's sftp URL, Slurm and torchrun's rendezvous write address:port unbracketed)",
                    "give cluster_address the host's IPv4 address (SSH may stay on IPv6)",
                )
            )
    outsiders: dict[str, list[str]] = {}
    for node in nodes:
        if not node.settings.cluster_cidr:
            continue
        net = ipaddress.ip_network(node.settings.cluster_cidr, strict=False)
        if node.settings.cluster_cidr not in outsiders:
            outsiders[node.settings.cluster_cidr] = [name for name, a in addresses if a is not None and a not in net]
        own = _address(node.cluster_address)
        if net.prefixlen < net.max_prefixlen - 1 and own in (net.network_address, net.broadcast_address):
            problems.append(
                Problem(
                    f"{inventory_path}: host {host_label(node.name)}: key cluster_address",
                    f"{own} is the {'network' if own == net.network_address else 'broadcast'} address of "
                    f"{node.settings.cluster_cidr}, not a host's",
                    "give the host its own address in the cluster network",
                )
            )
        outside = outsiders[node.settings.cluster_cidr]
        if outside:
            problems.append(
                Problem(
                    f"{inventory_path}: host {host_label(node.name)}: key cluster_cidr",
                    f"{node.settings.cluster_cidr} does not contain the cluster address of "
                    + ", ".join(host_label(n) for n in outside),
                    "set cluster_cidr to the network that holds every cluster_address",
                )
            )
    return problems


def _address(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(address)
    except ValueError:  # a DNS name: its address is not known here, so it is not refused
        return None


def _same_address(address: str) -> str:
    """One spelling of an address, to compare two: an IP in its compressed form (::1 and
    0:0::1 are one; an IPv4-mapped IPv6 address is its IPv4 one), a name in lower case."""
    ip = _address(address)
    if ip is None:
        return address.lower().rstrip(".")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def _duplicates(inventory_path: Path, nodes: list[Node], attrs: dict[str, Any]) -> list[Problem]:
    problems = []
    for label, keyfunc in (
        ("host name", lambda n: n.name.lower()),  # names are case-insensitive (DNS, /etc/hosts, Slurm)
        ("SSH address", lambda n: f"{_same_address(n.ssh.hostname)}:{n.ssh.port}"),
        ("cluster address", lambda n: _same_address(n.cluster_address)),
    ):
        seen: dict[str, str] = {}
        for node in nodes:
            value = keyfunc(node)
            if value in seen:
                problems.append(
                    Problem(
                        f"{inventory_path}: host {host_label(node.name)}",
                        f"duplicate {label} {v.shown(value)}, also used by host {host_label(seen[value])}",
                        "every host needs its own address",
                    )
                )
            else:
                seen[value] = node.name
    problems += _duplicate_names(inventory_path, attrs)
    return problems


def _duplicate_names(inventory_path: Path, attrs: dict[str, Any]) -> list[Problem]:
    """A name listed twice in one group is almost always a copy-paste slip: pyinfra would
    silently merge the two entries' data."""
    problems = []
    for group, entries in inventory_file.group_entries(attrs).items():
        names = [h[0] if isinstance(h, tuple) else h for h in entries]
        for name in sorted({n for n in names if names.count(n) > 1}):
            problems.append(
                Problem(
                    f"{inventory_path}: group {group}",
                    f"duplicate host {host_label(name)}",
                    "list each host once per group",
                )
            )
    return problems


def _references(inventory_path: Path, nodes: list[Node]) -> list[Problem]:
    names = {n.name for n in nodes}
    problems = []
    servers = sorted({n.settings.nfs_server for n in nodes if n.settings.nfs_server})
    if len(servers) > 1:
        problems.append(
            Problem(
                f"{inventory_path}: key nfs_server",
                f"hosts name different NFS servers ({', '.join(host_label(s) for s in servers)}); the cluster has one",
                "set nfs_server once, in group_data/all.py",
            )
        )
    for node in nodes:
        server = node.settings.nfs_server
        if server is not None and server not in names:
            problems.append(
                Problem(
                    f"{inventory_path}: host {host_label(node.name)}: key nfs_server",
                    f"{server!r} is not a host of this inventory",
                )
            )
    return problems


def _head_problems(inventory_path: Path, nodes: list[Node]) -> list[Problem]:
    """Slurm has one controller: a head group of more than one host is bad input."""
    heads = [n.name for n in nodes if n.has_role("head")]
    if len(heads) <= 1:
        return []
    return [
        Problem(
            f"{inventory_path}: group head",
            f"{len(heads)} hosts ({', '.join(host_label(h) for h in heads)}); Slurm has one controller",
            "keep one host in the head group",
        )
    ]


def describe_roles() -> list[tuple[str, str]]:
    return sorted(ROLES.items())


def pyinfra_keys(data: dict[str, Any]) -> dict[str, Any]:
    """The part of host data that belongs to pyinfra (connection keys, global arguments)."""
    return {k: v for k, v in data.items() if is_pyinfra_key(k)}
