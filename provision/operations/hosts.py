"""/etc/hosts with the cluster's names: provision's block first, above any line that shadows it.

The resolver answers with the first match, so an installer's "127.0.1.1 node1" above the block
makes a node's own name loopback to itself; hosts_first moves the block above such lines."""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api import operation

HOSTS_MARKER = "# {mark} provision cluster nodes"


def shadowing_lines(lines: list[str] | None, addresses: dict[str, str]) -> list[str]:
    """Lines of /etc/hosts above provision's block that give a cluster node's name another
    address, such as the installer's "127.0.1.1 node1". The resolver answers with the first
    match, so without this the node's own name is loopback to itself: gloo, which resolves
    the hostname to pick its address, then tells its peers to dial 127.0.1.1."""
    begin = HOSTS_MARKER.format(mark="BEGIN")
    found = []
    for line in lines or []:
        if line.strip() == begin:
            break
        fields = line.split("#", 1)[0].split()
        if len(fields) > 1 and any(addresses.get(name, fields[0]) != fields[0] for name in fields[1:]):
            found.append(line)
    return found


def hosts_first_command(block: str) -> str:
    """Rewrite /etc/hosts with provision's block first and every other line kept (an old
    block of ours dropped from where it was). Written in place (cat >), so the file keeps
    its inode, owner and mode."""
    begin, end = HOSTS_MARKER.format(mark="BEGIN"), HOSTS_MARKER.format(mark="END")
    drop_old = (
        f"awk -v b={shlex.quote(begin)} -v e={shlex.quote(end)} "
        "'$0 == b {skip=1} !skip {print} $0 == e {skip=0}' /etc/hosts"
    )
    new = "/etc/hosts.provision-new"
    return (
        f"{{ printf '%s\\n' {shlex.quote(begin)} {shlex.quote(block)} {shlex.quote(end)}; {drop_old}; }} > {new} "
        f"&& cat {new} > /etc/hosts && rm -f {new}"
    )


@operation()
def hosts_first(block: str, shadowed: list[str]) -> Generator[Any, None, None]:
    """Move provision's block above the lines that shadow it."""
    if shadowed:
        yield hosts_first_command(block)
