"""The `backups` step: restic (the distribution's package) on every host that backs up,
a systemd service + timer that backs up and applies retention, and, for the default
SFTP repository, the dedicated account on the storage host. See provision.backup.runs for
which hosts back up, where the repository is, and how the password is kept secret.
"""

from __future__ import annotations

import posixpath
from io import StringIO
from shlex import quote

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.context import ctx_state
from pyinfra.facts.files import Sha1File
from pyinfra.operations import files, server, systemd

from provision.engine import Step, current_cluster, current_node, note, put_secret, refuse
from provision.errors import InputError
from provision.facts.probes import HostKeys
from provision.facts.stack import BACKUP_STAMP
from provision.inventory import Cluster, Node
from provision.operations.apt import install
from provision.operations.stamps import follow_up
from provision.resources import render_template
from provision.rules import backups as backup


def unit_files(node: Node, cluster: Cluster) -> dict[str, str]:
    """Every file the step writes on a backing-up host (path -> text); none holds a secret."""
    s = node.settings
    paths = backup.backup_paths(node)
    sftp = backup.uses_default_repository(node)
    storage = cluster.storage_node()
    address = storage.cluster_address if (sftp and storage) else ""
    return {
        # The env file is sourced by sh and the script run by it, as root: every value is
        # quoted here, the one place these files are built (values are validated too).
        backup.ENV_FILE: render_template(
            "backups/env.j2",
            repository=quote(backup.repository(node, cluster)),
            password_file=quote(backup.PASSWORD_FILE),
            cache_dir=quote(backup.CACHE_DIR),
        ),
        backup.WRAPPER: render_template(
            "backups/provision-restic.j2",
            env_file=quote(backup.ENV_FILE),
            # one restic option, itself a command line: its words quoted, then the whole
            sftp_command=quote(f"sftp.command=ssh -F {quote(backup.SSH_CONFIG)} {quote(address)} -s sftp")
            if sftp
            else "",
        ),
        backup.SCRIPT: render_template(
            "backups/provision-backup.j2",
            wrapper=quote(backup.WRAPPER),
            paths=[quote(p) for p in paths],
            hostname=quote(node.name),
            schedule=" ".join(s.backup_schedule.split()),  # in a comment: one line
            keep_daily=int(s.backup_keep_daily),
            keep_weekly=int(s.backup_keep_weekly),
            keep_monthly=int(s.backup_keep_monthly),
            stamp=quote(BACKUP_STAMP),
            stamp_tmp=quote(f"{BACKUP_STAMP}.tmp"),
            stamp_dir=quote(posixpath.dirname(BACKUP_STAMP)),
        ),
        f"/etc/systemd/system/{backup.UNIT}": render_template(
            "backups/provision-backup.service.j2", paths=paths, script=backup.SCRIPT
        ),
        f"/etc/systemd/system/{backup.TIMER}": render_template(
            "backups/provision-backup.timer.j2", schedule=s.backup_schedule
        ),
    }


def ssh_config_text(address: str, strict: str) -> str:
    return render_template(
        "backups/ssh_config.j2",
        address=address,
        account=backup.ACCOUNT,
        key_file=backup.KEY_FILE,
        known_hosts=backup.KNOWN_HOSTS,
        strict=strict,
    )


def known_hosts_text(address: str, keys: list[str]) -> str:
    return "".join(f"{address} {key}\n" for key in keys)


def _storage_host_keys(storage: Node) -> list[str]:
    """The storage host's SSH host keys, when it is in this pass (it is, by default)."""
    for other in ctx_state.get().inventory:
        if other.name == storage.name and other.connected:
            return list(other.get_fact(HostKeys) or [])
    return []


def sftp_account(node: Node, cluster: Cluster) -> None:
    """On the storage host: the SFTP-only account that holds every default repository."""
    public = backup.key_file(cluster).with_suffix(".pub").read_text().strip()
    server.user(
        name=f"account {backup.ACCOUNT}",
        user=backup.ACCOUNT,
        home=backup.ACCOUNT_HOME,
        shell="/bin/sh",
        system=True,
        create_home=True,
    )
    ssh_dir = f"{backup.ACCOUNT_HOME}/.ssh"
    files.directory(name=f"{ssh_dir}", path=ssh_dir, user=backup.ACCOUNT, group=backup.ACCOUNT, mode="700")
    files.put(
        name="SFTP-only key for backups",
        dest=f"{ssh_dir}/authorized_keys",
        src=StringIO(f'restrict,command="internal-sftp" {public}\n'),
        user=backup.ACCOUNT,
        group=backup.ACCOUNT,
        mode="600",
    )
    root = backup.repository_root(node)
    files.directory(name=f"repositories {root}", path=root, user=backup.ACCOUNT, group=backup.ACCOUNT, mode="700")


def client_secrets(node: Node, cluster: Cluster) -> None:
    """Password, SSH key and SSH settings: root-owned, the secrets mode 0600."""
    files.directory(name=backup.CONFIG_DIR, path=backup.CONFIG_DIR, user="root", group="root", mode="700")
    put_secret("restic password (0600)", str(backup.password_file(cluster, node)), backup.PASSWORD_FILE, "root", "root")
    if not backup.uses_default_repository(node):
        return
    storage = cluster.storage_node()
    assert storage is not None  # backup.repository() refused a default repository without one
    put_secret("SFTP key (0600)", str(backup.key_file(cluster)), backup.KEY_FILE, "root", "root")
    keys = _storage_host_keys(storage)
    if not keys:
        note(f"backups: {storage.name}'s host key was not read in this pass; first use accepts it")
    files.put(
        name="storage host key",
        dest=backup.KNOWN_HOSTS,
        mode="644",
        src=StringIO(known_hosts_text(storage.cluster_address, keys)),
    )
    files.put(
        name="SSH settings for the repository",
        dest=backup.SSH_CONFIG,
        mode="644",
        src=StringIO(ssh_config_text(storage.cluster_address, "yes" if keys else "accept-new")),
    )


def backup_unit(node: Node, cluster: Cluster) -> None:
    changed = []
    units = unit_files(node, cluster)
    for path, text in units.items():
        mode = "755" if path.startswith("/usr/local/sbin/") else "644"
        changed.append(files.put(name=f"{path}", dest=path, src=StringIO(text), mode=mode))
    follow_up(
        "Reload systemd (backup units)",
        "backup-units",
        [f"{path}\n{text}" for path, text in sorted(units.items())],
        ["systemctl daemon-reload"],
        lambda: any(c.did_change() for c in changed),
    )
    systemd.service(name=f"{backup.TIMER} enabled", service=backup.TIMER, running=True, enabled=True)


@deploy("Backups")
def backups() -> None:
    node = current_node()
    cluster = current_cluster()
    try:
        _backups(node, cluster)
    except InputError as e:  # no repository, or a password file that is not there
        refuse("backups", "; ".join(str(p) for p in e.problems))


def _backups(node: Node, cluster: Cluster) -> None:
    storage = cluster.storage_node()
    runs_here = backup.skip_reason(node, cluster) is None
    # Before anything changes: a different password already on the host means its
    # repository was made with that one, and uploading ours would lock the host out of it.
    on_host = host.get_fact(Sha1File, path=backup.PASSWORD_FILE) if runs_here else None
    conflict = backup.password_conflict(node, cluster, on_host)
    if conflict:
        refuse("backups", conflict)
        return
    serves = (
        storage is not None
        and storage.name == node.name
        and any(backup.uses_default_repository(n) and backup.skip_reason(n, cluster) is None for n in cluster.all_nodes)
    )
    if runs_here:
        install("Install restic", ["restic", "openssh-client"], node.settings.apt_lock_wait_s)
    if serves:
        sftp_account(node, cluster)
    if runs_here:
        client_secrets(node, cluster)
        backup_unit(node, cluster)
    elif not serves:
        note(f"backups: none here ({backup.skip_reason(node, cluster)})")


step = Step("backups", backups, "restic backups: a daily timer with retention; SFTP repository on the storage host")
