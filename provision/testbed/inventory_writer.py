"""The pyinfra inventory of a running testbed: group ``nodes`` with every host, group
``storage`` with the first, which the others back up to. SSH goes to loopback forwards with the testbed's own key and
pinned host keys (strict checking stays on); cluster traffic uses the private network."""

from __future__ import annotations

from pathlib import Path

from provision.state import write_atomic
from provision.testbed.guest_files import CLUSTER_CIDR
from provision.testbed.state import NodeRecord

MARKER = "# provision-testbed-inventory"  # `down` removes only files that carry this line
CLUSTER_INTERFACE = "eth1"


def host_data(node: NodeRecord, ssh_key: Path, known_hosts: Path, wheelhouse: Path | None = None) -> dict[str, object]:
    """One host's data: pyinfra SSH keys plus provision settings. With a wheelhouse, the
    frameworks step installs torch from it (the CPU build) instead of asking an index."""
    data: dict[str, object] = {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": node.ssh_port,
        "ssh_user": "root",
        "ssh_key": str(ssh_key),
        "ssh_known_hosts_file": str(known_hosts),
        "ssh_strict_host_key_checking": "yes",
        "cluster_address": node.cluster_address,
        "cluster_cidr": CLUSTER_CIDR,
        "cluster_interface": CLUSTER_INTERFACE,
        "data_disks": node.data_disks,
        # The VM's root disk is 8 GiB, most of it free; real servers keep the 20 GB default.
        "min_root_free_gb": 4,
        # Byte-compiling torch's thousands of files costs minutes per VM under emulation;
        # Python compiles what it imports on first use instead.
        "pip_compile": False,
        # The VMs share one host's CPUs and disks, so a gap between them is the host's
        # scheduling, not a faulty node: on a busy host one VM's emulated random reads came
        # out 3x the other's, and the demo failed. A node fails here only 4x below the fleet
        # median (the throttled-disk drill, 100x, still fails); real fleets keep the defaults.
        "validate_expect": {"fleet.warn_drop": 0.2, "fleet.fail_drop": 0.75},
        # Slurm accounting on, so the shared `up` and its tests cover slurmdbd and MariaDB.
        "slurm_accounting": True,
    }
    if wheelhouse is not None:
        data["wheelhouse"] = str(wheelhouse)
    return data


def render(
    nodes: list[NodeRecord], ssh_key: Path, known_hosts: Path, state_dir: Path, wheelhouse: Path | None = None
) -> str:
    """The inventory file's text."""
    lines = [
        MARKER,
        f"# Written by `provision testbed up` (state: {state_dir}). Do not edit: `up`",
        "# rewrites it and `provision testbed down` removes it.",
        "# SSH goes over loopback port forwards with pinned host keys; the cluster network",
        f"# ({CLUSTER_CIDR}, {CLUSTER_INTERFACE}) exists only between the testbed's VMs.",
        "",
        "nodes = [",
    ]
    for index, node in enumerate(nodes):
        lines.append(f"    ({node.name!r}, {{")
        data = host_data(node, ssh_key, known_hosts, wheelhouse)
        if index:
            # The storage host backs up the checkpoints share by default; the others back
            # up their users' homes, each to a repository of its own on the storage host.
            data["backup_paths"] = ["/home"]
        for key, value in data.items():
            lines.append(f"        {key!r}: {value!r},")
        lines.append("    }),")
    lines += [
        "]",
        "",
        "# The NFS server and backup target.",
        f"storage = [{nodes[0].name!r}]" if nodes else "storage = []",
        "",
    ]
    return "\n".join(lines)


def write(
    path: Path,
    nodes: list[NodeRecord],
    ssh_key: Path,
    known_hosts: Path,
    state_dir: Path,
    wheelhouse: Path | None = None,
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, render(nodes, ssh_key, known_hosts, state_dir, wheelhouse))
    return path


def remove(path: Path) -> bool:
    """Delete the inventory only if the testbed wrote it; True if deleted."""
    try:
        if path.read_text().startswith(MARKER):
            path.unlink()
            return True
    except OSError:
        pass
    return False
