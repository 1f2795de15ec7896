"""`provision up --force-format HOST:DISK`: extend the named hosts' force_format for one run."""

from __future__ import annotations

from dataclasses import replace

from provision.errors import InputError, Problem
from provision.inventory import Cluster, Node
from provision.settings import disk_id_problem


def apply_force_format(cluster: Cluster, specs: list[str]) -> Cluster:
    """Extend each named host's force_format with `--force-format HOST:DISK` values."""
    extra: dict[str, list[str]] = {}
    problems = []
    names = {n.name for n in cluster.nodes}
    for spec in specs:
        name, _, disk = spec.partition(":")
        bad_disk = disk_id_problem(disk) if disk else None
        if not disk or name not in names or bad_disk:
            what = (
                "no disk given"
                if not disk
                else (f"{name!r} is not a host of this inventory" if name not in names else str(bad_disk))
            )
            problems.append(
                Problem(f"--force-format {spec}", what, "write HOST:DISK, e.g. node1:/dev/disk/by-id/nvme-XYZ")
            )
        else:
            extra.setdefault(name, []).append(disk)
    if problems:
        raise InputError(problems)
    return replace(cluster, nodes=tuple(_forced(n, extra.get(n.name, [])) for n in cluster.nodes))


def _forced(node: Node, disks: list[str]) -> Node:
    if not disks:
        return node
    settings = replace(node.settings, force_format=[*node.settings.force_format, *disks])
    return replace(node, settings=settings)
