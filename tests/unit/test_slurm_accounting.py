"""Slurm accounting's pure rules (provision.rules.slurm_accounting and slurm.conf's lines):
slurmdbd.conf, MariaDB's drop-in and account SQL, the cluster's registration, the setting."""

from __future__ import annotations

import shlex

import pytest

from provision.rules import slurm
from provision.rules import slurm_accounting as accounting
from provision.settings import Settings, parse_settings

PASSWORD = "q3Jx_Z8-aVb1Kc0LmNoPqRsTuVwXyZ012345678901"  # secrets.token_urlsafe(32)'s shape


def test_slurmdbd_conf_stores_into_local_mariadb_as_slurm_on_the_heads_own_name():
    lines = accounting.slurmdbd_conf("head1", PASSWORD).splitlines()
    for wanted in (
        "AuthType=auth/munge",
        "DbdHost=head1",
        "SlurmUser=slurm",
        "LogFile=/var/log/slurm/slurmdbd.log",
        "PidFile=/run/slurmdbd.pid",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        "StorageLoc=slurm_acct_db",
        "StorageUser=slurm",
        f"StoragePass={PASSWORD}",
    ):
        assert wanted in lines
    assert lines[0].startswith("# Managed by provision")


@pytest.mark.parametrize(
    "bad", ["", "short", "has space in it 123", "quote'inside0123456", "hash#inside0123456", "a\nb" * 9]
)
def test_a_password_that_could_escape_the_sql_or_the_conf_is_refused(bad):
    with pytest.raises(ValueError, match="url-safe"):
        accounting.check_password(bad)
    with pytest.raises(ValueError, match="url-safe"):
        accounting.slurmdbd_conf("head1", bad)
    with pytest.raises(ValueError, match="url-safe"):
        accounting.grants_sql(bad)


@pytest.mark.parametrize("bad", ["head1.example.org", "-head", "head 1", "head1\nStoragePass=x", ""])
def test_dbd_host_must_be_a_short_host_name(bad):
    with pytest.raises(ValueError, match="DbdHost"):
        accounting.slurmdbd_conf(bad, PASSWORD)


def test_the_account_sql_can_run_again_and_reaches_only_the_accounting_database_from_localhost():
    sql = accounting.grants_sql(PASSWORD)
    assert sql.splitlines() == [
        "CREATE DATABASE IF NOT EXISTS slurm_acct_db;",
        f"CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '{PASSWORD}';",
        f"ALTER USER 'slurm'@'localhost' IDENTIFIED BY '{PASSWORD}';",
        "GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'localhost';",
    ]
    # The SQL goes in on stdin from the root-only file: the command carries no secret.
    assert accounting.grants_command() == f"mysql --batch < {accounting.GRANTS_SQL}"


def test_mariadb_listens_on_loopback_only():
    text = accounting.mariadb_conf()
    assert "[mysqld]\n" in text
    assert "bind-address = 127.0.0.1\n" in text
    assert accounting.MARIADB_CONF.startswith("/etc/mysql/mariadb.conf.d/6")  # after the package's 50-server.cnf


def test_registering_adds_the_cluster_only_when_sacctmgr_does_not_list_it_and_quotes_the_name():
    script = accounting.register_cluster_command("lab")
    listed = script.index("sacctmgr -n -P list cluster format=cluster")
    added = script.index('sacctmgr -i add cluster "$name"')
    assert listed < added
    assert 'grep -qx -- "$name"; then\n    exit 0' in script
    assert f"+ {accounting.REGISTER_WAIT_S} ))" in script
    assert script.rstrip().endswith("exit 1")
    odd = "it's"  # not a valid name (settings refuse it), quoted all the same
    assert f"name={shlex.quote(odd)}\n" in accounting.register_cluster_command(odd)


def _conf(accounting_host: str | None) -> slurm.ClusterConf:
    return slurm.ClusterConf("lab", "head1", "10.0.0.1", "main", "01:00:00", slurm.HEALTH_PROGRAM, 60, accounting_host)


def test_slurm_conf_names_slurmdbd_only_with_accounting_and_is_otherwise_unchanged():
    lines = ["NodeName=n1 NodeAddr=10.0.0.2 CPUs=8 Weight=1 State=UNKNOWN"]
    off = slurm.slurm_conf_with_lines(_conf(None), lines, ["n1"])
    on = slurm.slurm_conf_with_lines(_conf("10.0.0.1"), lines, ["n1"])
    added = [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=10.0.0.1",
        "AccountingStorageTRES=gres/gpu",
    ]
    assert [line for line in on.splitlines() if line not in off.splitlines()] == added
    assert [line for line in on.splitlines() if line not in added] == off.splitlines()
    assert "Accounting" not in off
    # The field's default is no accounting: a ClusterConf built as before gives the same bytes.
    assert slurm.slurm_conf_with_lines(
        slurm.ClusterConf("lab", "head1", "10.0.0.1", "main", "01:00:00"), lines, ["n1"]
    ) == (
        slurm.slurm_conf_with_lines(
            slurm.ClusterConf("lab", "head1", "10.0.0.1", "main", "01:00:00", None, 60, None), lines, ["n1"]
        )
    )


def test_the_setting_is_off_by_default_and_takes_only_a_bool():
    assert Settings().slurm_accounting is False
    assert parse_settings({"slurm_accounting": True}, "x") == (Settings(slurm_accounting=True), [])
    _, problems = parse_settings({"slurm_accounting": "yes"}, "inv.py: host n1")
    assert len(problems) == 1
    assert "slurm_accounting" in str(problems[0])
