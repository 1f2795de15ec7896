"""What is wrong with an inventory's hosts taken together: the checks across hosts and
across keys that ``inventory.load`` runs once every host's data is merged and typed.

Each takes the loaded hosts and returns Problems, one line each, naming the file, host
and key; nothing here contacts a host.
"""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from pathlib import Path
from typing import Any

from provision import inventory_file
from provision import values as v
from provision.cluster import Cluster, Node
from provision.errors import Problem, hosts_label, names_label
from provision.settings import ROLES, cross_key_problems


def problems(cluster: Cluster, attrs: dict[str, Any]) -> list[Problem]:
    """Every problem of the hosts together; ``attrs`` are the file's top-level names."""
    path, nodes = cluster.path, list(cluster.nodes)
    try:
        storage = cluster.storage_node()
    except KeyError:  # nfs_server names no host: _references says so
        storage = None
    found = _cross_key_problems(path, nodes)
    found += _file_name_problems(path, attrs)
    found += _cluster_wide_problems(path, nodes, storage)
    found += _duplicates(path, nodes, attrs)
    found += _references(path, nodes)
    found += _network_problems(path, nodes)
    found += _head_problems(path, nodes)
    found += _backup_problems(path, nodes, storage)
    found += _slurm_problems(cluster)
    return found


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


def _cluster_wide_problems(inventory_path: Path, nodes: list[Node], storage: Node | None) -> list[Problem]:
    problems = []
    if storage is not None:  # a host may mount fewer shares than the server exports, never more
        exported = set(storage.settings.nfs_exports)
        for node in nodes:
            missing = [share for share in node.settings.nfs_exports if share not in exported]
            if missing:
                problems.append(
                    Problem(
                        f"{inventory_path}: host {v.host_label(node.name)}: key nfs_exports",
                        f"{', '.join(missing)} not exported by the storage host {v.host_label(storage.name)}",
                        "give every host the storage host's nfs_exports (or fewer)",
                    )
                )
    for key in CLUSTER_WIDE:
        seen: dict[str, list[str]] = {}
        for node in nodes:
            seen.setdefault(repr(getattr(node.settings, key)), []).append(v.host_label(node.name))
        if len(seen) > 1:
            said = "; ".join(f"{value} on {names_label(names)}" for value, names in seen.items())
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
            hosts.setdefault(problem, []).append(v.host_label(node.name))
    return [
        replace(problem, where=f"{inventory_path}: {hosts_label(names)}: {problem.where}")
        for problem, names in hosts.items()
    ]


def _network_problems(inventory_path: Path, nodes: list[Node]) -> list[Problem]:
    """A cluster_cidr must hold every cluster address: NFS exports and the firewall-free
    cluster traffic go to that network only, so a node outside it is locked out."""
    problems = []
    # Each address parsed once and each network's outsiders found once: asked per node of
    # per node, a 1,000-node inventory took a million parses (BENCHMARKS.md, issue 20).
    addresses = [(n.name, _address(n.cluster_address)) for n in nodes]
    problems += _address_problems(inventory_path, nodes, addresses)
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
                    f"{inventory_path}: host {v.host_label(node.name)}: key cluster_address",
                    f"{own} is the {'network' if own == net.network_address else 'broadcast'} address of "
                    f"{node.settings.cluster_cidr}, not a host's",
                    "give the host its own address in the cluster network",
                )
            )
        outside = outsiders[node.settings.cluster_cidr]
        if outside:
            problems.append(
                Problem(
                    f"{inventory_path}: host {v.host_label(node.name)}: key cluster_cidr",
                    f"{node.settings.cluster_cidr} does not contain the cluster address of "
                    + ", ".join(v.host_label(n) for n in outside),
                    "set cluster_cidr to the network that holds every cluster_address",
                )
            )
    return problems


Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address_problems(
    inventory_path: Path, nodes: list[Node], addresses: list[tuple[str, Address | None]]
) -> list[Problem]:
    """Each host's cluster address is its own and IPv4. An address that is another host's
    SSH address, and not its own too (hosts behind one NAT address, each on its own port,
    share it), would send this host's traffic there; loopback is shared by port forwards."""
    problems = []
    ssh_hosts: dict[str, set[str]] = {}
    for n in nodes:
        ssh_hosts.setdefault(_same_address(n.ssh.hostname), set()).add(n.name)
    for node, (name, a) in zip(nodes, addresses, strict=True):
        if a is None:  # a DNS name: its address is not known here
            continue
        key = (
            "cluster_address" if node.settings.cluster_address else "ssh_hostname (no cluster_address: the SSH address)"
        )
        where = f"{inventory_path}: host {v.host_label(name)}: key {key}"
        users = ssh_hosts.get(_same_address(str(a)), set())
        if users and name not in users and not a.is_loopback:
            others = ", ".join(sorted(map(v.host_label, users)))
            what = f"{a} is the SSH address of {others}; /etc/hosts and Slurm would send this host's traffic there"
            problems.append(Problem(where, what, "give each host its own address"))
        if isinstance(a, ipaddress.IPv6Address):
            what = (
                f"{a} is an IPv6 address; the cluster network is IPv4 only (NFS mounts, the backup repository's sftp "
                "URL, Slurm and torchrun's rendezvous write address:port unbracketed)"
            )
            problems.append(Problem(where, what, "give cluster_address the host's IPv4 address (SSH may stay on IPv6)"))
    return problems


def _address(address: str) -> Address | None:
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
                        f"{inventory_path}: host {v.host_label(node.name)}",
                        f"duplicate {label} {v.shown(value)}, also used by host {v.host_label(seen[value])}",
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
                    f"duplicate host {v.host_label(name)}",
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
                f"hosts name different NFS servers ({', '.join(map(v.host_label, servers))}); the cluster has one",
                "set nfs_server once, in group_data/all.py",
            )
        )
    for node in nodes:
        server = node.settings.nfs_server
        if server is not None and server not in names:
            problems.append(
                Problem(
                    f"{inventory_path}: host {v.host_label(node.name)}: key nfs_server",
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
            f"{len(heads)} hosts ({', '.join(v.host_label(h) for h in heads)}); Slurm has one controller",
            "keep one host in the head group",
        )
    ]


def _backup_problems(inventory_path: Path, nodes: list[Node], storage: Node | None) -> list[Problem]:
    """Backups that would hold themselves, or that someone else could change: the default
    repositories live under the storage host's <data_mount>/backups (sshd chroots each
    host's account there, root-owned); a share is the training user's to write; a backup
    of a tree that holds its own repository grows until the volume is full."""
    # The default repositories' tree is made when a host backs up without a repository of
    # its own: the storage host (it always backs up) or a host with backup_paths.
    uses_tree = storage is not None and any(
        n.settings.backup_repository is None and (n.name == storage.name or n.settings.backup_paths) for n in nodes
    )
    found = []
    if storage is not None and uses_tree:
        found = _backups_tree_problems(storage, own=storage.settings.backup_repository is None)
    for node in nodes:
        found += _local_repository_problems(node)
    return [
        Problem(f"{inventory_path}: host {v.host_label(node.name)}: key {key}", what, fix)
        for node, key, what, fix in found
    ]


def _backups_tree_problems(storage: Node, own: bool) -> list[tuple[Node, str, str, str]]:
    """The shares kept off the tree; the storage host's own backup (``own``: its repository
    is there) kept from holding it."""
    s = storage.settings
    backups = f"{s.data_mount.rstrip('/')}/backups"
    found = []
    for share in s.nfs_exports:
        exported = f"{s.nfs_export_root.rstrip('/')}/{share}"
        if v.overlap(exported, backups):
            what = f"the share {exported} is on or holds {backups}, the backups' root-owned tree"
            found.append((storage, "nfs_export_root", what, "keep the export tree apart from <data_mount>/backups"))
    for path in s.backup_paths if own else []:
        if v.overlap(path, backups):
            what = f"{path} is on or holds {backups}, where the backups are kept"
            found.append((storage, "backup_paths", what, "back up the data, not the backups"))
    return found


def _local_repository_problems(node: Node) -> list[tuple[Node, str, str, str]]:
    s, repo = node.settings, node.settings.backup_repository
    if not repo or not repo.startswith(("/", "local:")):
        return []
    local = repo.removeprefix("local:").replace("{host}", node.name)
    found = []
    for name, tree in (("nfs_mount_root", s.nfs_mount_root), ("nfs_export_root", s.nfs_export_root)):
        if v.overlap(local, tree):
            what = f"{local} is on or holds {name} {tree}, which the training user writes to"
            found.append((node, "backup_repository", what, "keep the repository on a root-owned directory"))
    for path in s.backup_paths:
        if v.overlap(path, local):
            found.append((node, "backup_paths", f"{path} is on or holds the repository {local}",
                          "back up the data, not the repository"))  # fmt: skip
    return found


def _slurm_problems(cluster: Cluster) -> list[Problem]:
    """A Slurm cluster needs its controller and a host to run jobs: the slurm step on some
    hosts with the head skipping it would point every slurm.conf at a controller that never
    runs; with no compute host the partition would list no nodes."""
    if not cluster.nodes or all(n.settings.slurm == "skip" for n in cluster.nodes):
        return []
    try:
        head, why = cluster.head_node()
    except KeyError:  # nfs_server names no host: _references says so
        return []
    if head.settings.slurm == "skip":
        return [
            Problem(
                f"{cluster.path}: host {v.host_label(head.name)}: key slurm",
                f"the head ({why}) skips Slurm while other hosts run it: their slurm.conf would name a "
                "controller that never runs",
                "set slurm = 'skip' on every host, or make another host the head (the head group)",
            )
        ]
    if not cluster.compute_nodes():
        return [
            Problem(
                str(cluster.path),
                "no host would run Slurm jobs (the compute group's hosts skip Slurm, or the head alone runs it with "
                "slurm_head_computes false)",
                "add a compute host, or set slurm_head_computes = true",
            )
        ]
    return []
