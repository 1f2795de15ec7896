"""`--limit`: which hosts of an inventory a command contacts.

A limit is a comma-separated list of patterns, each a host name, a shell-style glob over
host names (``gpu-0[1-4]``, ``rack2-*``) or a group of the inventory (``storage``). The
hosts it selects keep inventory order. A pattern that selects no host is bad input: a typo
in a limit must not quietly shrink the run to the hosts the other patterns matched.

The limited cluster still knows every host (``Cluster.all_nodes``): /etc/hosts, the
training user's keys and the storage host are the whole cluster's on a limited run too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fnmatch import fnmatchcase

from provision.errors import InputError, Problem
from provision.inventory import Cluster, Node

# Host names and groups are checked at load (provision.values); a pattern may add the glob
# characters. Anything else (spaces, quotes, slashes) cannot match and is refused as typed.
_PATTERN = re.compile(r"^[A-Za-z0-9_.*?\[\]!-]{1,253}$")


def patterns(text: str | None) -> list[str]:
    """The patterns of a --limit value, in order; empty when there is no limit."""
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def select(cluster: Cluster, text: str | None, option: str = "--limit") -> list[Node]:
    """The hosts a limit selects, in inventory order (every host without one)."""
    wanted = patterns(text)
    if text is not None and not wanted:
        # A limit given empty (",", "" from a script's unset variable) would mean every host.
        raise InputError(Problem(f"{option} {text!r}", "names no host, glob or group", "e.g. --limit node1,storage"))
    if not wanted:
        return list(cluster.nodes)
    problems = []
    chosen: set[str] = set()
    groups = sorted({g for n in cluster.nodes for g in n.groups})
    for pattern in wanted:
        if not _PATTERN.match(pattern):
            problems.append(
                Problem(f"{option} {pattern!r}", "not a host name, glob or group", "e.g. --limit node1,gpu-0*,storage")
            )
            continue
        hits = {n.name for n in cluster.nodes if fnmatchcase(n.name, pattern) or pattern in n.groups}
        if not hits:
            problems.append(
                Problem(
                    f"{option} {pattern}",
                    "matches no host or group of the inventory",
                    f"hosts: {_some(n.name for n in cluster.nodes)}; groups: {_some(groups)}",
                )
            )
        chosen |= hits
    if problems:
        raise InputError(problems)
    return [n for n in cluster.nodes if n.name in chosen]


def apply(cluster: Cluster, text: str | None) -> Cluster:
    """The cluster with only the limited hosts to contact (the cluster unchanged without a
    limit); every host stays known for what the cluster shares."""
    if not patterns(text):
        return cluster
    return cluster.part(select(cluster, text))


def _some(names: Iterable[str], most: int = 8) -> str:
    """A few names for a message: a fleet's thousand would drown the error."""
    items = list(names)
    shown = ", ".join(items[:most])
    return shown + (f" ... ({len(items)} in all)" if len(items) > most else "")
