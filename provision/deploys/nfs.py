"""The `nfs` step: shared storage from the storage host, mounted on every other node.

Server (``Cluster.storage_node()``): nfs-kernel-server exports each of ``nfs_exports``
(datasets, checkpoints, scratch) from ``nfs_export_root`` on the data volume, to
``cluster_cidr`` only (never ``*``), with ``nfs_export_options`` (rw,sync,root_squash by
default). nfsd starts only once the data volume is mounted. The server also sees the
shares at ``nfs_mount_root`` through a bind mount, so a path is the same on every node.

Clients: every other node mounts each share with NFS v4.2, ``hard`` (a write is never
silently lost), ``nosuid,nodev``, and ``_netdev,nofail,x-systemd.automount``: the mount happens on first
access, so a node boots and works while the server is down, and the share appears when
the server is back. Both sides use cluster addresses.

The shared directories belong to the training user (created here, with base's pinned
uid/gid, if the base step has not run, so this step stands alone). NFS maps owners by
number, so the account has the same ids on every node.
"""

from __future__ import annotations

import ipaddress
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.server import Mounts
from pyinfra.operations import files, server, systemd

from provision.engine import Step, current_cluster, current_node, refuse, skip
from provision.inventory import Cluster, Node
from provision.operations.accounts import training_account
from provision.operations.apt import install
from provision.operations.stamps import follow_up
from provision.operations.volumes import fstab_field, fstab_match
from provision.resources import render_template
from provision.rules.shares import export_paths, mount_paths
from provision.settings import Settings

EXPORTS_FILE = "/etc/exports.d/provision.exports"
SERVER_DROPIN = "/etc/systemd/system/nfs-server.service.d/provision.conf"
# nosuid,nodev: the shares are written by the training user (and by any node's root, as
# nobody); a set-uid file or a device node there must not give root on the other nodes.
# lookupcache=positive: a name another node just created is seen at once (by default a
# client trusts its cached "no such file" for up to a minute: a job's env built on node1,
# a checkpoint a peer just wrote, looked missing on node2; nfs(5) advises it for that).
CLIENT_OPTIONS = (
    "vers=4.2,hard,noatime,nosuid,nodev,lookupcache=positive,_netdev,nofail,"
    "x-systemd.automount,x-systemd.mount-timeout=30s"
)
BIND_OPTIONS = "bind,nofail"


def export_problems(settings: Settings, hostname: str) -> list[str]:
    """Reasons not to export: no cluster network set, or one that means everyone."""
    if not settings.cluster_cidr:
        return [
            f"{hostname}: cluster_cidr is not set; NFS exports go to the cluster network only "
            "(set cluster_cidr, e.g. 10.0.0.0/24, in group_data/all.py)"
        ]
    if ipaddress.ip_network(settings.cluster_cidr, strict=False).prefixlen == 0:
        return [f"{hostname}: cluster_cidr {settings.cluster_cidr} means every address; set the cluster network itself"]
    return []


def exports_text(settings: Settings) -> str:
    """/etc/exports.d/provision.exports: every share to the cluster network, nothing else."""
    network = ipaddress.ip_network(str(settings.cluster_cidr), strict=False)
    return render_template(
        "nfs/exports.j2",
        paths=[fstab_field(p) for p in export_paths(settings)],  # exports(5) reads the same octal escapes
        cluster_cidr=str(network),
        options=settings.nfs_export_options,
    )


def client_fstab_line(server_address: str, server: Settings, client: Settings, share: str) -> str:
    """A client's line for one share: the path the server exports (its own nfs_export_root,
    which follows its data_mount) at the client's own mount root."""
    return (
        f"{fstab_field(server_address)}:{fstab_field(server.nfs_export_root)}/{fstab_field(share)} "
        f"{fstab_field(client.nfs_mount_root)}/{fstab_field(share)} nfs {CLIENT_OPTIONS} 0 0"
    )


def bind_fstab_line(settings: Settings) -> str:
    """The server's view of the shares at nfs_mount_root (a bind of the export root)."""
    return f"{fstab_field(settings.nfs_export_root)} {fstab_field(settings.nfs_mount_root)} none {BIND_OPTIONS} 0 0"


def systemd_unit(path: str, suffix: str) -> str:
    """The systemd unit name of a mount path (as `systemd-escape -p --suffix=...`)."""

    def escape(ch: str, first: bool) -> str:
        if ch.isalnum() or ch in ":_" or (ch == "." and not first):
            return ch
        return "".join(f"\\x{b:02x}" for b in ch.encode())

    trimmed = "/".join(p for p in path.split("/") if p)
    escaped = "".join("-" if c == "/" else escape(c, i == 0) for i, c in enumerate(trimmed))
    return f"{escaped or '-'}.{suffix}"


def server_address(cluster: Cluster) -> str | None:
    storage = cluster.storage_node()
    return storage.cluster_address if storage else None


def _mount_now(path: str) -> None:
    if path not in (host.get_fact(Mounts) or {}):
        server.shell(name=f"Mount {path}", commands=[f"mount {shlex.quote(path)}"])


def nfs_server(settings: Settings) -> None:
    """Export the shares to the cluster network and bind them at nfs_mount_root."""
    install("Install nfs-kernel-server", ["nfs-kernel-server"], settings.apt_lock_wait_s)
    training_account(settings)
    user = settings.training_user
    for path in export_paths(settings):
        files.directory(name=f"Share {path}", path=path, user=user, group=user, mode="2775")
    dropin_text = render_template("nfs/nfs-server.conf.j2", export_root=settings.nfs_export_root)
    dropin = files.put(name="nfsd waits for the data volume", dest=SERVER_DROPIN, src=StringIO(dropin_text))
    follow_up(
        "Reload systemd (nfs-server drop-in)",
        "nfs-server-dropin",
        [dropin_text],
        ["systemctl daemon-reload"],
        dropin.did_change,
    )
    exports = files.put(
        name="NFS exports (cluster network only)", dest=EXPORTS_FILE, src=StringIO(exports_text(settings))
    )
    systemd.service(name="nfs-server running", service="nfs-server.service", running=True, enabled=True)
    follow_up("Re-export", "nfs-exports", [exports_text(settings)], ["exportfs -ra"], exports.did_change)
    if settings.nfs_mount_root != settings.nfs_export_root:
        files.directory(name=f"Shares at {settings.nfs_mount_root}", path=settings.nfs_mount_root)
        bind = files.line(
            name=f"fstab: bind {settings.nfs_mount_root}",
            path="/etc/fstab",
            line=fstab_match(settings.nfs_mount_root),
            replace=bind_fstab_line(settings),
            extended_regex=True,
        )
        follow_up(
            "Reload systemd (fstab changed)",
            "nfs-server-fstab",
            [bind_fstab_line(settings)],
            ["systemctl daemon-reload"],
            bind.did_change,
        )
        _mount_now(settings.nfs_mount_root)


def nfs_client(settings: Settings, address: str, server: Settings) -> None:
    """Mount every share from the server (at ``address``, with its ``server`` settings) on
    first access (systemd automount)."""
    install("Install nfs-common", ["nfs-common"], settings.apt_lock_wait_s)
    training_account(settings)
    changes, lines = [], []
    for share, path in zip(settings.nfs_exports, mount_paths(settings), strict=True):
        files.directory(name=f"Mount point {path}", path=path)
        lines.append(client_fstab_line(address, server, settings, share))
        changes.append(
            files.line(
                name=f"fstab: {path}",
                path="/etc/fstab",
                line=fstab_match(path),
                replace=lines[-1],
                extended_regex=True,
            )
        )
    # The automount units are generated from fstab: without this reload they do not exist,
    # and starting them below fails in this run and every later one.
    follow_up(
        "Reload systemd (fstab changed)",
        "nfs-client-fstab",
        lines,
        ["systemctl daemon-reload"],
        lambda: any(c.did_change() for c in changes),
    )
    for path in mount_paths(settings):
        systemd.service(name=f"automount {path}", service=systemd_unit(path, "automount"), running=True)


@deploy("NFS")
def nfs() -> None:
    node = current_node()
    cluster = current_cluster()
    storage = cluster.storage_node()
    if storage is None:
        skip("nfs", "no storage host: put one host in the 'storage' group")
        return
    if node.name == storage.name:
        problems = export_problems(node.settings, node.name)
        if problems:
            refuse("nfs", "; ".join(problems))
            return
        nfs_server(node.settings)
    else:
        nfs_client(node.settings, storage.cluster_address, storage.settings)


def applies(node: Node) -> str | None:
    return None if node.settings.nfs_exports else "no nfs_exports set"


step = Step("nfs", nfs, "NFS: the storage host exports shares to the cluster network; nodes automount them", applies)
