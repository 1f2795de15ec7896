"""Backups with restic: which hosts back up, where each one's repository is, where things live
on the hosts, and the controller's generated secrets. Pure decisions on the inventory, plus the
secrets' files (provision.state); the backups deploy installs this layout and the backup
command's runs use it.

Which hosts back up: a host with ``backup_paths`` set backs those up; the storage host backs up
the checkpoints share by default (it holds the data; the other nodes only mount it). Every other
host has no backup.

Repository: ``backup_repository`` (any restic URL; ``{host}`` becomes the host's name), or by
default one repository per host on the storage host, over SFTP to a dedicated account
``provision-backup`` that may only run internal-sftp (no shell), under
``<data_mount>/backups/restic/<host>``. The default repository sits on the same disks as the
data: it protects against deleted or corrupted files, not against losing the storage host.

Secrets: the restic password comes from ``backup_password_file`` on the controller, or is
generated once in the inventory's state directory (provision.state), mode 0600. On hosts it is
/etc/provision/backup/password, root-owned, mode 0600. No command line, log line or JSON output
ever holds it: restic reads it from the file (RESTIC_PASSWORD_FILE).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from provision.errors import InputError, Problem
from provision.inventory import Cluster, Node
from provision.state import generated_key, generated_secret, inventory_dir, state_dir

ACCOUNT = "provision-backup"  # the SFTP account on the storage host


ACCOUNT_HOME = "/var/lib/provision-backup"


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


def password_problem(node: Node, cluster: Cluster) -> Problem | None:
    """What is wrong with this host's backup_password_file, or None (unset, or usable).
    restic refuses an empty password, so an empty file is as bad as a missing one."""
    configured = node.settings.backup_password_file
    if not configured:
        return None
    path = Path(configured).expanduser()
    where = f"{cluster.path}: host {node.name}: key backup_password_file"
    try:
        empty = not path.read_bytes().strip()
    except OSError as e:
        what = f"{path} does not exist" if not path.exists() else f"{path} cannot be read ({e.strerror})"
        return Problem(where, what, "create it, or unset the key to generate one")
    return Problem(where, f"{path} is empty", "restic refuses an empty password") if empty else None


def generated_password_file(cluster: Cluster) -> Path:
    """Where the generated password lives (or would): keyed by the inventory's path."""
    return cluster_dir(cluster) / "backup-password"


def password_file(cluster: Cluster, node: Node) -> Path:
    """The controller file holding the restic password; generated (0600) when not set."""
    problem = password_problem(node, cluster)
    if problem:
        raise InputError(problem)
    if node.settings.backup_password_file:
        return Path(node.settings.backup_password_file).expanduser()
    return generated_secret(generated_password_file(cluster))


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
    local = Path(configured).expanduser() if configured else generated_password_file(cluster)
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
    candidates = [p for root in roots for p in sorted(root.glob("*/backup-password"))]
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


def key_file(cluster: Cluster) -> Path:
    """The SSH key pair that backing-up hosts use for the SFTP account; generated once."""
    return generated_key(cluster_dir(cluster) / "backup_ed25519", f"{ACCOUNT}@provision")


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
    return f"sftp:{ACCOUNT}@{storage.cluster_address}:{repository_root(storage)}/{node.name}"


def repository_root(storage: Node) -> str:
    return f"{storage.settings.data_mount}/backups/restic"
