"""Pure decisions of Slurm accounting (``slurm_accounting``): slurmdbd on the head, storing
into a MariaDB that listens on loopback only, so that ``sacct`` shows finished jobs.

Debian 12's and Ubuntu's packages: ``mariadb-server`` (unit mariadb.service, drop-ins read
from /etc/mysql/mariadb.conf.d/, root connects through its unix socket) and ``slurmdbd``
(unit slurmdbd.service, which starts only once /etc/slurm/slurmdbd.conf exists; it pulls in
slurm-wlm-mysql-plugin). The database password is made once on the controller, like the
munge key, and reaches the head only inside root- or slurm-only files: never a command line.
"""

from __future__ import annotations

import re
import shlex

DATABASE_PACKAGE = "mariadb-server"
DBD_PACKAGE = "slurmdbd"
PACKAGES = (DATABASE_PACKAGE, DBD_PACKAGE)
DATABASE_UNIT = "mariadb.service"
DBD_UNIT = "slurmdbd.service"

SLURMDBD_CONF = "/etc/slurm/slurmdbd.conf"  # slurm:slurm 0600: slurmdbd refuses a file others can read
# Sorts after the package's 50-server.cnf, so its settings win.
MARIADB_CONF = "/etc/mysql/mariadb.conf.d/60-provision-slurm.cnf"
GRANTS_SQL = "/etc/mysql/provision-slurm-grants.sql"  # root:root 0600: it holds the password
DATABASE = "slurm_acct_db"  # StorageLoc: slurmdbd's default name
DB_USER = "slurm"  # StorageUser, a MariaDB account at localhost only

# sacctmgr's deadline per call, and how long registering waits for slurmdbd to answer (its
# first start creates the tables: seconds natively, longer under emulation).
SACCTMGR_S = 20
REGISTER_WAIT_S = 180
REGISTER_PAUSE_S = 5

_PASSWORD = re.compile(r"[A-Za-z0-9_-]{16,128}")  # what state.generated_secret makes (url-safe)
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,31}")


def check_password(password: str) -> str:
    """The database password, refused unless it is url-safe text (no quote, '#' or newline
    can reach the SQL or slurmdbd.conf). The password is generated; this guards its file."""
    if not _PASSWORD.fullmatch(password):
        raise ValueError(
            "the slurmdbd database password is not 16-128 url-safe characters; delete its file to renew it"
        )
    return password


def _hostname(name: str) -> str:
    if not _HOSTNAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a short host name slurmdbd can run as (DbdHost)")
    return name


def _identifier(name: str) -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise ValueError(f"{name!r} is not a plain SQL identifier")
    return name


def mariadb_conf() -> str:
    """The MariaDB drop-in: loopback only (slurmdbd on the same host is its one client), and
    the lock wait Slurm's accounting documentation asks for (its purges hold long locks)."""
    return (
        "# Managed by provision (slurm step, slurm_accounting): slurmdbd's database.\n"
        "[mysqld]\n"
        "bind-address = 127.0.0.1\n"
        "innodb_lock_wait_timeout = 900\n"
    )


def grants_sql(password: str) -> str:
    """SQL that makes the accounting database and slurmdbd's account, run as MariaDB's root
    from a root-only file; safe to run again (a changed password is set anew)."""
    db, user, pw = _identifier(DATABASE), _identifier(DB_USER), check_password(password)
    return (
        f"CREATE DATABASE IF NOT EXISTS {db};\n"
        f"CREATE USER IF NOT EXISTS '{user}'@'localhost' IDENTIFIED BY '{pw}';\n"
        f"ALTER USER '{user}'@'localhost' IDENTIFIED BY '{pw}';\n"
        f"GRANT ALL PRIVILEGES ON {db}.* TO '{user}'@'localhost';\n"
    )


def grants_command() -> str:
    """Run the grants file as MariaDB's root (unix-socket login): the SQL goes in on stdin."""
    return f"mysql --batch < {shlex.quote(GRANTS_SQL)}"


def slurmdbd_conf(dbd_host: str, password: str) -> str:
    """/etc/slurm/slurmdbd.conf. ``dbd_host``: the head's own short hostname (slurmdbd exits
    when DbdHost is not the name of the host it runs on)."""
    return (
        "\n".join(
            [
                "# Managed by provision (slurm step, slurm_accounting). Do not edit; run `provision up`.",
                "AuthType=auth/munge",
                f"DbdHost={_hostname(dbd_host)}",
                "SlurmUser=slurm",
                "LogFile=/var/log/slurm/slurmdbd.log",
                "PidFile=/run/slurmdbd.pid",  # the unit's PIDFile
                "StorageType=accounting_storage/mysql",
                "StorageHost=localhost",
                f"StorageLoc={_identifier(DATABASE)}",
                f"StorageUser={_identifier(DB_USER)}",
                f"StoragePass={check_password(password)}",
            ]
        )
        + "\n"
    )


_REGISTER = """\
name=@NAME@
end=$(( $(date +%s) + @WAIT@ ))
while :; do
  if timeout @T@ sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx -- "$name"; then
    exit 0
  fi
  [ "$(date +%s)" -lt "$end" ] || break
  timeout @T@ sacctmgr -i add cluster "$name" >/dev/null 2>&1 || sleep @PAUSE@
done
echo "slurmdbd did not list cluster $name within @WAIT@ s: see /var/log/slurm/slurmdbd.log" >&2
exit 1
"""


def register_cluster_command(name: str) -> str:
    """Shell (POSIX sh) on the head: add the cluster to slurmdbd unless
    ``sacctmgr list cluster`` already has it, trying again while slurmdbd is still starting
    (its first start creates the tables); fails, saying where to look, if slurmdbd has not
    listed it within REGISTER_WAIT_S."""
    return (
        _REGISTER.replace("@NAME@", shlex.quote(name))
        .replace("@T@", str(int(SACCTMGR_S)))
        .replace("@PAUSE@", str(int(REGISTER_PAUSE_S)))
        .replace("@WAIT@", str(int(REGISTER_WAIT_S)))
    )
