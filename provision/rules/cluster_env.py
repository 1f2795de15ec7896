"""The cluster network every job sees, not only provision's own: NCCL and gloo pick their
NIC by name, and left alone they take the first interface that is up (the management NIC
on real servers, the user-network NIC on the testbed), so a plain `srun torchrun` of two
nodes dialled the wrong network. The base step writes the node's cluster interface into
/etc/environment (pam_env: every SSH session and `su -`); Slurm's TaskProlog sets it in
every task on the node it runs on (an sbatch carries the submitting node's environment,
whose interface may be named otherwise)."""

from __future__ import annotations

import ipaddress

from provision import values as v
from provision.facts.nics import Nic

ENVIRONMENT_FILE = "/etc/environment"
IFNAME_KEY = "PROVISION_CLUSTER_IFNAME"  # the node's own cluster interface, as provision found it
SOCKET_KEYS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
TASK_PROLOG = "/etc/slurm/provision-task-prolog.sh"


def interface_of(address: str, nics: list[Nic]) -> str | None:
    """The interface holding ``address`` (an IP), or None: a DNS-named cluster address, an
    address no interface holds, or a name that is not an interface name (host output is
    checked before it is written into a file every login reads)."""
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for nic in nics:
        for cidr in nic.addresses:
            try:
                held = ipaddress.ip_interface(cidr).ip
            except ValueError:
                continue
            if held == wanted and v.interface(nic.name) is None:
                return nic.name
    return None


def environment_lines(interface: str) -> dict[str, str]:
    """key -> its /etc/environment line: the socket variables, and provision's own record
    of the interface (the task prolog reads it)."""
    if v.interface(interface) is not None:
        raise ValueError(f"not an interface name: {interface!r}")
    return {key: f"{key}={interface}" for key in (*SOCKET_KEYS, IFNAME_KEY)}


def task_prolog() -> str:
    """Slurm's TaskProlog (the same file on every node): each ``export`` line it prints is
    set in the task. A socket variable the user set is kept; one that is unset, or that
    holds the submitting node's cluster interface (carried by sbatch from there), becomes
    this node's. It reads the interface from /etc/environment, written by root alone."""
    keys = " ".join(SOCKET_KEYS)
    return f"""#!/bin/sh
# Managed by provision (slurm step): the cluster interface for NCCL and gloo in every task.
own=$(sed -n 's/^{IFNAME_KEY}=\\([A-Za-z0-9_.-]*\\)$/\\1/p' {ENVIRONMENT_FILE} | tail -n 1)
[ -n "$own" ] || exit 0
for key in {keys}; do
  eval "now=\\${{$key:-}}"
  if [ -z "$now" ] || [ "$now" = "${{{IFNAME_KEY}:-}}" ]; then echo "export $key=$own"; fi
done
echo "export {IFNAME_KEY}=$own"
"""
