"""The slurm step's accounting (``slurm_accounting``): slurmdbd over a MariaDB bound to
loopback on the head (provision.rules.slurm_accounting), the cluster registered in it before
slurmctld restarts once. Its database password is made once on the controller, like the munge
key. Turned off, slurmdbd stops, slurmctld restarts once without it; MariaDB and the data
stay. Called on the head only: from the slurm step (deploys/slurm/__init__.py), and
controller_accounting from its second pass there (controller.py), after every host's files.
"""

from __future__ import annotations

import hashlib
from io import StringIO

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import files, systemd

from provision import state
from provision.engine import note, put_secret
from provision.facts.stamps import Stamp
from provision.inventory import Cluster, Node
from provision.operations.stamps import digest, follow_up
from provision.rules import slurm as rules
from provision.rules import slurm_accounting as accounting

ACCOUNTING_STAMP = "slurm-accounting"  # the head's stamp: slurmctld restarted for accounting on (or off)
ACCOUNTING_OFF = ["off"]  # that stamp's inputs once accounting was turned off


def db_password(cluster: Cluster) -> str:
    """slurmdbd's MariaDB password on the controller, made once per inventory."""
    path = state.generated_secret(state.inventory_dir(cluster.path) / "slurmdbd-db.password")
    return accounting.check_password(path.read_text().strip())


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def head_daemons(cluster: Cluster, head: Node, dbd_host: str, on: bool) -> None:
    """On the head, before its Slurm daemons (re)start: slurmdbd and MariaDB where accounting
    is on, slurmdbd stopped where it is off."""
    if on:
        accounting_daemons(cluster, head, dbd_host)
    else:
        accounting_stopped()


def accounting_daemons(cluster: Cluster, head: Node, dbd_host: str) -> None:
    """The head's slurmdbd over MariaDB (slurm_accounting), answering before slurmctld
    starts or restarts: the database on loopback, its account made from a root-only SQL file
    (the password never on a command line), slurmdbd.conf readable by slurm alone, and the
    cluster registered in it (sacctmgr reads slurm.conf, already in place)."""
    password = db_password(cluster)
    db_conf = accounting.mariadb_conf()
    db_op = files.put(name="MariaDB on loopback", src=StringIO(db_conf), dest=accounting.MARIADB_CONF, mode="644")
    unit = accounting.DATABASE_UNIT
    # Debian's MariaDB 10.11 starts by systemd socket activation, and mariadb.socket listens
    # on every address whatever bind-address says (found on the testbed: *:3306). Masked, so
    # MariaDB binds as its settings say; done once (the stamp), then MariaDB restarted.
    follow_up(
        "MariaDB without socket activation (it listens on every address)",
        "mariadb-socket",
        ["masked"],
        [
            "systemctl disable --now mariadb.socket mariadb-extra.socket 2>/dev/null || true",
            "systemctl mask mariadb.socket mariadb-extra.socket",
            f"systemctl restart {unit}",
        ],
        lambda: False,
    )
    follow_up(
        "Restart MariaDB (its settings changed)",
        "mariadb-conf",
        [db_conf],
        [f"systemctl restart {unit}"],
        db_op.did_change,
    )
    systemd.service(name="MariaDB running", service=unit, running=True, enabled=True)
    sql = accounting.grants_sql(password)
    sql_op = put_secret(
        "slurmdbd's account (SQL)", StringIO(sql), accounting.GRANTS_SQL, "root", "root", owns_dir=False
    )
    # The stamps hold a hash of a hash: no part of the password.
    follow_up(
        "Create slurmdbd's database and account",
        "slurmdbd-grants",
        [_sha256(sql)],
        [accounting.grants_command()],
        sql_op.did_change,
    )
    conf = accounting.slurmdbd_conf(dbd_host, password)
    conf_op = put_secret(
        "slurmdbd.conf (0600, slurm)", StringIO(conf), accounting.SLURMDBD_CONF, "slurm", "slurm", owns_dir=False
    )
    dbd = accounting.DBD_UNIT
    follow_up(
        "Restart slurmdbd (slurmdbd.conf changed)",
        "slurmdbd-conf",
        [_sha256(conf)],
        [f"systemctl restart {dbd}"],
        conf_op.did_change,
    )
    systemd.service(name="slurmdbd running", service=dbd, running=True, enabled=True)
    # Registering waits until slurmdbd answers (its first start creates the tables). It must
    # answer before slurmctld's first start with accounting: with neither slurmdbd nor state
    # files of its own, slurmctld has no TRES list and exits.
    name = head.settings.slurm_cluster_name
    register = [accounting.register_cluster_command(name)]
    follow_up("Register the cluster in slurmdbd", "slurmdbd-cluster", [name], register, lambda: False)


def accounting_stopped() -> None:
    """slurm_accounting off on a head where slurmdbd is installed: it is stopped and kept
    from starting at boot; MariaDB and the data are left as they are."""
    if accounting.DBD_PACKAGE in (host.get_fact(DebPackages) or {}):
        systemd.service(
            name="slurmdbd stopped (slurm_accounting off)", service=accounting.DBD_UNIT, running=False, enabled=False
        )


def controller_accounting(cluster: Cluster, on: bool) -> None:
    """After slurm.conf is in place and slurmdbd answers: slurmctld restarted once for
    accounting (it reads AccountingStorageType at start only), and once when accounting is
    turned off after it was on. A run stopped before it restarts on the next run (the
    stamp); a cluster that never kept accounting sees nothing here."""
    head, _ = cluster.head_node()
    ctld = f"{rules.CONTROLLER_PACKAGE}.service"
    if on:
        inputs = [head.settings.slurm_cluster_name, head.cluster_address]
        follow_up(
            "Restart slurmctld (accounting on)", ACCOUNTING_STAMP, inputs, [f"systemctl restart {ctld}"], lambda: False
        )
        return
    was = host.get_fact(Stamp, stamp=ACCOUNTING_STAMP)
    if was is not None and was != digest(ACCOUNTING_OFF):
        note("slurm: accounting off: slurmdbd stopped and disabled; MariaDB and its slurm_acct_db are left in place")
        follow_up(
            "Restart slurmctld (accounting off)",
            ACCOUNTING_STAMP,
            ACCOUNTING_OFF,
            [f"systemctl restart {ctld}"],
            lambda: False,
        )
