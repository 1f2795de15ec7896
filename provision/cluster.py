"""The typed cluster an inventory loads into: how the controller reaches each host
(``SshTarget``), each host with its validated settings (``Node``), and the hosts together
with the roles and shared places that come from them (``Cluster``). Records only: loading
and checking are ``inventory``'s and ``inventory_checks``'."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provision.settings import Settings


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
