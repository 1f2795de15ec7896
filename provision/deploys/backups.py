"""The `backups` step: restic (the distribution's package) on every host that backs up,
a systemd service + timer that backs up and applies retention, and, for the default
SFTP repository, one confined account per backing-up host on the storage host. See provision.backup.runs for
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
from provision.facts.probes import HostKeys, UnconfinedRepositories
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


def ssh_config_text(address: str, account: str, strict: str) -> str:
    return render_template(
        "backups/ssh_config.j2",
        address=address,
        account=account,
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


def sftp_accounts(storage: Node, cluster: Cluster, clients: list[Node]) -> None:
    """On the storage host: an SFTP-only account per backing-up host, each confined by sshd
    to its own directory (see provision.rules.backups), and the shared account of earlier
    versions shut (its key was on every host)."""
    root = backup.repository_root(storage)
    files.directory(name=posixpath.dirname(root), path=posixpath.dirname(root), user="root", group="root", mode="755")
    # sshd's ChrootDirectory wants every directory above a chroot owned by root and
    # writable by no one else; 711: the accounts pass through, no one lists the hosts.
    files.directory(name=f"repositories {root}", path=root, user="root", group="root", mode="711")
    files.directory(name=backup.ACCOUNTS_HOME, path=backup.ACCOUNTS_HOME, user="root", group="root", mode="755")
    unconfined: list[str] = host.get_fact(UnconfinedRepositories, root=root) or []
    for client in clients:
        sftp_account(storage, cluster, client, moved=client.name in unconfined)
    text = backup.sshd_drop_in(storage, [c.name for c in clients])
    put = files.put(name="sshd: the accounts' confinement", dest=backup.SSHD_DROP_IN, src=StringIO(text), mode="644")
    follow_up(
        "sshd: check the confinement, reload",
        "backup-sshd",
        [text],
        sshd_commands([(backup.account_name(c.name), backup.chroot_dir(storage, c.name)) for c in clients]),
        put.did_change,
    )
    files.file(
        name=f"shared account {backup.LEGACY_ACCOUNT}: no key",
        path=f"{backup.LEGACY_HOME}/.ssh/authorized_keys",
        present=False,
    )


def sftp_account(storage: Node, cluster: Cluster, client: Node, moved: bool) -> None:
    account = backup.account_name(client.name)
    public = backup.key_file(cluster, client).with_suffix(".pub").read_text().strip()
    home = f"{backup.ACCOUNTS_HOME}/{client.name}"
    # ensure_home=False: pyinfra would give the home to the account, and the directory
    # operation below would give it back to root, on every run.
    server.user(
        name=f"account {account}", user=account, home=home, shell="/usr/sbin/nologin", system=True, ensure_home=False
    )
    # Root owns the key file and its directories, so the account could not change them even
    # if it ever had a shell; sshd reads them as the account, hence 755/644.
    files.directory(name=home, path=home, user="root", group="root", mode="755")
    files.directory(name=f"{home}/.ssh", path=f"{home}/.ssh", user="root", group="root", mode="755")
    files.put(
        name=f"{client.name}'s SFTP-only key",
        dest=f"{home}/.ssh/authorized_keys",
        src=StringIO(f'restrict,command="internal-sftp" {public}\n'),
        user="root",
        group="root",
        mode="644",
    )
    chroot = backup.chroot_dir(storage, client.name)
    if moved:
        server.shell(name=f"{client.name}'s repository into {chroot}/repo", commands=[move_command(chroot, account)])
    files.directory(name=f"{client.name}'s directory {chroot}", path=chroot, user="root", group="root", mode="755")
    files.directory(name=f"{chroot}/repo", path=f"{chroot}/repo", user=account, group=account, mode="700")


def move_command(chroot: str, account: str) -> str:
    """Move a repository of the shared-account layout (its files directly in ``chroot``) to
    ``chroot/repo`` and give it to the host's own account. Two renames, each atomic: a run
    killed between them leaves ``chroot.moving``, which the next run finishes moving."""
    d, moving, repo, who = (
        quote(chroot),
        quote(f"{chroot}.moving"),
        quote(f"{chroot}/repo"),
        quote(f"{account}:{account}"),
    )
    return (
        f"set -e; if [ -f {d}/config ]; then "
        f"if [ -e {moving} ]; then echo {quote(f'{chroot} and {chroot}.moving both hold one')} >&2; exit 1; fi; "
        f"mv {d} {moving}; fi; "
        f"if [ -e {moving} ]; then mkdir -p {d}; "
        f"if [ -e {repo} ]; then echo {quote(f'{chroot}/repo already exists beside {chroot}.moving')} >&2; exit 1; fi; "
        f"mv {moving} {repo}; fi; "
        f"chown -R {who} {repo}"
    )


def sshd_commands(accounts: list[tuple[str, str]]) -> list[str]:
    """Check sshd accepts its settings with the drop-in (else remove it: an sshd that reads a
    bad file on its next restart stops, and the host is lost to SSH), reload, then check that
    sshd applies the chroot to each account (a sshd_config without the drop-in directory's
    Include would silently leave the accounts unconfined)."""
    drop_in = quote(backup.SSHD_DROP_IN)
    refused = quote(f"sshd refused {backup.SSHD_DROP_IN}; removed it")
    commands = [
        f"/usr/sbin/sshd -t || {{ rm -f {drop_in}; echo {refused} >&2; exit 1; }}",
        "systemctl try-reload-or-restart ssh.service",
    ]
    for account, chroot in accounts:
        unread = quote(f"sshd does not confine {account} to {chroot}: is /etc/ssh/sshd_config.d/*.conf included?")
        commands.append(
            f"/usr/sbin/sshd -T -C user={quote(account)},host=localhost,addr=127.0.0.1 "
            f"| grep -qxF {quote(f'chrootdirectory {chroot}')} || {{ echo {unread} >&2; exit 1; }}"
        )
    return commands


def client_secrets(node: Node, cluster: Cluster) -> None:
    """Password, SSH key and SSH settings: root-owned, the secrets mode 0600."""
    files.directory(name=backup.CONFIG_DIR, path=backup.CONFIG_DIR, user="root", group="root", mode="700")
    put_secret("restic password (0600)", str(backup.password_file(cluster, node)), backup.PASSWORD_FILE, "root", "root")
    if not backup.uses_default_repository(node):
        return
    storage = cluster.storage_node()
    assert storage is not None  # backup.repository() refused a default repository without one
    put_secret("SFTP key (0600)", str(backup.key_file(cluster, node)), backup.KEY_FILE, "root", "root")
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
        src=StringIO(
            ssh_config_text(storage.cluster_address, backup.account_name(node.name), "yes" if keys else "accept-new")
        ),
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
    if backup.adopt_legacy_password(node, cluster, on_host):
        note(f"backups: {node.name} keeps the password all hosts shared before passwords were per host")
    conflict = backup.password_conflict(node, cluster, on_host)
    if conflict:
        refuse("backups", conflict)
        return
    clients = [
        n for n in cluster.all_nodes if backup.uses_default_repository(n) and backup.skip_reason(n, cluster) is None
    ]
    serves = storage is not None and storage.name == node.name and bool(clients)
    if runs_here:
        install("Install restic", ["restic", "openssh-client"], node.settings.apt_lock_wait_s)
    if serves:
        sftp_accounts(node, cluster, clients)
    if runs_here:
        client_secrets(node, cluster)
        backup_unit(node, cluster)
    elif not serves:
        note(f"backups: none here ({backup.skip_reason(node, cluster)})")


step = Step(
    "backups",
    backups,
    "restic backups: a daily timer with retention; per-host SFTP repositories, chrooted, on the storage host",
)
