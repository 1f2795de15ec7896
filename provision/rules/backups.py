"""Backups with restic: which hosts back up, where each one's repository is, where things live
on the hosts, and the controller's generated secrets. Pure decisions on the inventory, plus the
secrets' files (provision.state); the backups deploy installs this layout and the backup
command's runs use it.

Which hosts back up: a host with ``backup_paths`` set backs those up; the storage host backs up
the checkpoints share by default (it holds the data; the other nodes only mount it). Every other
host has no backup.

Repository: ``backup_repository`` (any restic URL; ``{host}`` becomes the host's name), or by
default one repository per host on the storage host, over SFTP. Each backing-up host has an
account of its own there (``account_name``), confined by sshd to its own directory
``<data_mount>/backups/restic/<host>`` (``ChrootDirectory``, ``ForceCommand internal-sftp``:
no shell, no forwarding, nothing outside that directory), with the repository at ``/repo``
inside it. So root on one node, who holds that node's key and password, reaches that node's
backups and nothing else. The default repository sits on the same disks as the data: it
protects against deleted or corrupted files, not against losing the storage host.

Secrets: each host's restic password comes from ``backup_password_file`` on the controller, or
is generated once per host in the inventory's state directory (provision.state), mode 0600;
each host's SSH key likewise. On hosts the password is /etc/provision/backup/password,
root-owned, mode 0600. No command line, log line or JSON output ever holds it: restic reads it
from the file (RESTIC_PASSWORD_FILE).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from provision import controller_files
from provision.errors import InputError, Problem
from provision.inventory import Cluster, Node
from provision.state import SECRET_MODE, generated_key, generated_secret, inventory_dir, state_dir, write_atomic

ACCOUNT_PREFIX = "provision-backup-"  # + the host: its SFTP account on the storage host


LEGACY_ACCOUNT = "provision-backup"  # the one account every host shared before per-host ones


LEGACY_HOME = "/var/lib/provision-backup"


ACCOUNTS_HOME = "/var/lib/provision-backup-accounts"  # <host>/.ssh/authorized_keys, root-owned


SSHD_DROP_IN = "/etc/ssh/sshd_config.d/provision-backup.conf"  # the accounts' Match blocks


REPOSITORY_IN_CHROOT = "/repo"  # the repository as the confined account sees it


CONFIG_DIR = "/etc/provision/backup"


PASSWORD_FILE = f"{CONFIG_DIR}/password"  # on hosts: root, 0600


ENV_FILE = f"{CONFIG_DIR}/env"


KEY_FILE = f"{CONFIG_DIR}/id_ed25519"


SSH_CONFIG = f"{CONFIG_DIR}/ssh_config"


KNOWN_HOSTS = f"{CONFIG_DIR}/known_hosts"


CACHE_DIR = "/var/cache/provision-backup"


WRAPPER = "/usr/local/sbin/provision-restic"  # restic with this host's repository and password


SCRIPT = "/usr/local/sbin/provision-backup"  # backup + retention


UNIT = "provision-backup.service"


TIMER = "provision-backup.timer"


def cluster_dir(cluster: Cluster) -> Path:
    """The controller's directory for this inventory's generated secrets (mode 0700)."""
    return inventory_dir(cluster.path)


PASSWORD_MAX_BYTES = 4096  # restic reads the first line; a larger file is not a password


def password_problem(node: Node, cluster: Cluster) -> Problem | None:
    """What is wrong with this host's backup_password_file, or None (unset, or usable).
    restic refuses an empty password, so an empty file is as bad as a missing one."""
    configured = node.settings.backup_password_file
    if not configured:
        return None
    path = Path(configured).expanduser()
    where = f"{cluster.path}: host {node.name}: key backup_password_file"
    try:
        empty = not controller_files.read_small(path, PASSWORD_MAX_BYTES).strip()
    except controller_files.Unreadable as e:
        return Problem(where, str(e), "create it, or unset the key to generate one")
    return Problem(where, f"{path} is empty", "restic refuses an empty password") if empty else None


def generated_password_file(cluster: Cluster, node: Node) -> Path:
    """Where this host's generated password lives (or would): keyed by the inventory's path
    and the host, so no two hosts share one."""
    return cluster_dir(cluster) / "backup-passwords" / node.name


def legacy_password_file(cluster: Cluster) -> Path:
    """The one generated password every host shared before passwords were per host."""
    return cluster_dir(cluster) / "backup-password"


def password_file(cluster: Cluster, node: Node) -> Path:
    """The controller file holding this host's restic password; generated (0600) when not set."""
    problem = password_problem(node, cluster)
    if problem:
        raise InputError(problem)
    if node.settings.backup_password_file:
        return Path(node.settings.backup_password_file).expanduser()
    path = generated_password_file(cluster, node)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return generated_secret(path)


def adopt_legacy_password(node: Node, cluster: Cluster, on_host_sha1: str | None) -> bool:
    """A host provisioned before passwords were per host holds the shared one, and its
    repository is encrypted with it: that host's own password file starts as a copy of it
    (a new password would lock it out, see password_conflict). True when copied."""
    if node.settings.backup_password_file or on_host_sha1 is None:
        return False
    own, legacy = generated_password_file(cluster, node), legacy_password_file(cluster)
    if own.exists() or not legacy.is_file() or sha1_of(legacy) != on_host_sha1.lower():
        return False
    own.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(own, legacy.read_bytes(), mode=SECRET_MODE)
    return True


def sha1_of(path: Path) -> str:
    """The digest pyinfra's Sha1File fact reports for the same bytes on a host."""
    return hashlib.sha1(path.read_bytes()).hexdigest()


def password_conflict(node: Node, cluster: Cluster, on_host_sha1: str | None) -> str | None:
    """Why uploading the controller's password would replace a different one that the host
    already holds, or None (the host has none yet, or the same one).

    restic encrypts the repository's key with this password, so a host given a new one can
    no longer open the repository its backups went to: backups, restores and checks all
    fail. Keying the generated password by something "stable" cannot prevent that (paths,
    names and addresses all change, and a second controller has no state at all), so the
    deploy compares with what the host holds and refuses rather than replaces.
    """
    if on_host_sha1 is None:
        return None
    problem = password_problem(node, cluster)
    if problem:  # a missing file is that problem, not a different password
        raise InputError(problem)
    configured = node.settings.backup_password_file
    local = Path(configured).expanduser() if configured else generated_password_file(cluster, node)
    on_host_sha1 = on_host_sha1.lower()
    if local.is_file() and sha1_of(local) == on_host_sha1:
        return None
    if configured:
        ours = f"backup_password_file {local}"
    else:
        ours = f"the password generated at {local}" if local.exists() else f"a new password for {local}"
    # The usual cause is a moved or renamed inventory: its old state dir holds the original.
    # ~/.local/state/provision held every generated secret before XDG_STATE_HOME was honoured.
    roots = dict.fromkeys([state_dir(), Path("~/.local/state/provision").expanduser()])
    candidates = [
        p
        for root in roots
        for pattern in ("*/backup-password", "*/backup-passwords/*")
        for p in sorted(root.glob(pattern))
    ]
    found = [p for p in candidates if p != local and sha1_of(p) == on_host_sha1]
    fix = (
        f'{found[0]} holds the host\'s password: set backup_password_file = "{found[0]}"'
        if found
        else "set backup_password_file to the original password file, or to a 0600 copy of the host's"
    )
    return (
        f"{node.name}:{PASSWORD_FILE} holds a different restic password than {ours}; replacing it "
        f"would lock this host out of its backup repository ({fix})"
    )


def key_path(cluster: Cluster, node: Node) -> Path:
    """Where this host's SSH key pair for its SFTP account lives on the controller."""
    return cluster_dir(cluster) / "backup-keys" / f"{node.name}_ed25519"


def key_file(cluster: Cluster, node: Node) -> Path:
    """This host's SSH key pair for its SFTP account; generated once, one per host."""
    return generated_key(key_path(cluster, node), f"{account_name(node.name)}@provision")


_PORTABLE_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def account_name(host: str) -> str:
    """The storage host's SFTP account for one backing-up host: the host's name when it makes
    a user name that every useradd accepts (lowercase, at most 32 characters), else a digest
    of it (host names may be longer, or hold upper case and dots)."""
    name = f"{ACCOUNT_PREFIX}{host}"
    if _PORTABLE_NAME.fullmatch(host) and len(name) <= 32:
        return name
    return f"{ACCOUNT_PREFIX}{hashlib.sha256(host.encode()).hexdigest()[:12]}"


def backup_paths(node: Node) -> list[str]:
    """What this host backs up: backup_paths, else (storage host) the checkpoints share."""
    s = node.settings
    return s.backup_paths or [f"{s.nfs_mount_root}/checkpoints"]


def skip_reason(node: Node, cluster: Cluster) -> str | None:
    """Why this host has no backup, or None when it backs up."""
    if node.settings.backup_paths:
        return None
    storage = cluster.storage_node()
    if storage is not None and storage.name == node.name:
        return None
    return "the checkpoints share is backed up on the storage host; set backup_paths to back up this host"


def uses_default_repository(node: Node) -> bool:
    return node.settings.backup_repository is None


def repository(node: Node, cluster: Cluster) -> str:
    """The restic repository URL for this host (never holds a secret)."""
    if node.settings.backup_repository:
        return node.settings.backup_repository.replace("{host}", node.name)
    storage = cluster.storage_node()
    if storage is None:
        raise InputError(
            Problem(
                f"{cluster.path}: host {node.name}: key backup_repository",
                "no repository: not set, and no storage host to hold the default one",
                "put a host in the 'storage' group, or set backup_repository",
            )
        )
    return f"sftp:{account_name(node.name)}@{storage.cluster_address}:{REPOSITORY_IN_CHROOT}"


def repository_root(storage: Node) -> str:
    return f"{storage.settings.data_mount}/backups/restic"


def chroot_dir(storage: Node, host: str) -> str:
    """One host's directory on the storage host: its account's whole view (root-owned, as
    sshd's ChrootDirectory requires); the repository is ``repo`` inside it."""
    return f"{repository_root(storage)}/{host}"


def sshd_drop_in(storage: Node, hosts: list[str]) -> str:
    """sshd settings confining each backing-up host's account to its own directory. Every
    value comes from a validated host name or setting (absolute normalised paths, RFC 1123
    names); the paths are quoted for sshd, whose ChrootDirectory also expands %-tokens."""
    lines = [
        "# Managed by provision (backups step): one SFTP-only account per backing-up host,",
        "# each confined to its own repository directory.",
    ]
    for host in sorted(hosts):
        chroot = chroot_dir(storage, host).replace("%", "%%")
        lines += [
            f"Match User {account_name(host)}",
            f'    ChrootDirectory "{chroot}"',
            "    ForceCommand internal-sftp",
            "    AllowTcpForwarding no",
            "    AllowStreamLocalForwarding no",
            "    AllowAgentForwarding no",
            "    X11Forwarding no",
            "    PermitTTY no",
            "    PermitTunnel no",
        ]
    return "\n".join(lines) + "\n"
