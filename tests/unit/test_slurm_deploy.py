"""The slurm step's decisions that need the cluster: which nodes slurm.conf holds (nodes an
earlier run saw keep their line; nodes never seen are left out and named), who the controller
is (the head's own hostname), what restarts the daemons, and when a host is skipped."""

from __future__ import annotations

from provision.deploys import slurm as step
from provision.deploys.slurm import accounting as deploy_accounting
from provision.deploys.slurm import roster
from provision.inventory import load
from provision.rules import slurm as rules
from tests.unit.test_inventory import write

INVENTORY = """
nodes = [("n1", {"ssh_hostname": "192.0.2.1", "cluster_address": "10.0.0.1"}),
         ("n2", {"ssh_hostname": "192.0.2.2", "cluster_address": "10.0.0.2"}),
         ("n3", {"ssh_hostname": "192.0.2.3", "cluster_address": "10.0.0.3"})]
storage = ["n1"]
"""


def _known(name: str, address: str, gpus: int = 0, unsupported: str | None = None) -> step.Known:
    gres = f" Gres=gpu:h100:{gpus}" if gpus else ""
    topology = "CPUs=8 Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000"
    line = f"NodeName={name} NodeAddr={address} {topology}{gres} Weight=1 State=UNKNOWN"
    return step.Known(line, f"{name}-host", unsupported, 0)


def test_nodes_seen_by_any_run_are_in_the_file_and_the_others_are_named(tmp_path):
    cluster = load(write(tmp_path / "inv.py", INVENTORY))
    nodes = {"n1": _known("n1", "10.0.0.1"), "n3": _known("n3", "10.0.0.3", gpus=2)}
    text, unseen = step.slurm_conf(cluster, nodes)
    assert unseen == ["n2"]
    assert [line.split()[0] for line in text.splitlines() if line.startswith("NodeName=")] == [
        "NodeName=n1",
        "NodeName=n3",
    ]
    assert "PartitionName=main Nodes=n1,n3 " in text
    # The controller is the head's own hostname (slurmctld refuses to run under another name).
    assert "SlurmctldHost=n1-host(10.0.0.1)" in text.splitlines()
    assert step.restart_inputs(text) == [
        "SlurmctldHost=n1-host(10.0.0.1)",
        "NodeName=n1 NodeAddr=10.0.0.1",
        "NodeName=n3 NodeAddr=10.0.0.3",
    ]


def test_an_unsupported_node_is_skipped_and_left_out_and_an_unsupported_head_stops_every_host(tmp_path):
    cluster = load(write(tmp_path / "inv.py", INVENTORY))
    old = rules.unsupported("ubuntu", "22.04")
    nodes = {
        "n1": _known("n1", "10.0.0.1"),
        "n2": _known("n2", "10.0.0.2", unsupported=old),
        "n3": _known("n3", "10.0.0.3"),
    }
    text, _ = step.slurm_conf(cluster, nodes)
    assert "NodeName=n2 " not in text
    head = cluster.node("n1")
    assert step.skip_reason(cluster.node("n2"), head, nodes).startswith(old)
    assert step.skip_reason(cluster.node("n3"), head, nodes) is None
    nodes["n1"] = _known("n1", "10.0.0.1", unsupported=old)
    assert step.skip_reason(cluster.node("n3"), head, nodes) == f"the head n1: {old}"
    del nodes["n1"]
    assert "has not been reached by any run yet" in step.skip_reason(cluster.node("n3"), head, nodes)


def test_the_controller_keeps_what_runs_saw_between_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    cluster = load(write(tmp_path / "inv.py", INVENTORY))
    assert step.known_nodes(cluster) == {}
    step._known_file(cluster).write_text("not json")
    assert step.known_nodes(cluster) == {}  # a damaged file is as good as none: the next run rewrites it
    step._known_file(cluster).write_text(
        '{"n1": {"line": "NodeName=n1", "hostname": "h", "unsupported": null, "gpus_without_driver": 0}}'
    )
    assert step.known_nodes(cluster) == {"n1": step.Known("NodeName=n1", "h", None, 0)}


def test_a_node_whose_last_validate_warned_keeps_its_warn_weight_in_slurm_conf(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    path = write(
        tmp_path / "inv.py",
        INVENTORY.replace('"cluster_address": "10.0.0.2"}', '"cluster_address": "10.0.0.2", "slurm_warn_weight": 50}'),
    )
    cluster = load(path)
    from provision.validate import history
    from provision.validate.records import NodeResult

    assert step.warn_weight(cluster.node("n2")) == 1  # no verdict yet
    history.append([NodeResult("n2", "warn"), NodeResult("n3", "warn")], "2026-12-04T00:00:00+00:00", "quick")
    assert step.warn_weight(cluster.node("n2")) == 50
    assert step.warn_weight(cluster.node("n3")) == 1  # its own setting: the default 1
    history.append([NodeResult("n2", "pass")], "2026-12-04T01:00:00+00:00", "quick")
    assert step.warn_weight(cluster.node("n2")) == 1


def test_a_leaving_node_with_jobs_or_unknown_jobs_stays_in_the_file_and_an_empty_one_leaves(tmp_path):
    from provision.facts.probes import LeavingNode

    cluster = load(write(tmp_path / "inv.py", INVENTORY))
    nodes = {n: _known(n, f"10.0.0.{i}") for i, n in enumerate(("n1", "n2", "n3"), start=1)}
    gone = {
        "old4": LeavingNode("NodeName=old4 NodeAddr=10.0.0.4 CPUs=8", ["4711", "4712_[1-3]"]),
        "old5": LeavingNode("NodeName=old5 NodeAddr=10.0.0.5 CPUs=8", None),  # squeue did not answer
        "old6": LeavingNode("NodeName=old6 NodeAddr=10.0.0.6 CPUs=8", []),
    }
    kept = roster.kept_lines(gone)
    assert list(kept) == ["old4", "old5"]
    text, _ = step.slurm_conf(cluster, nodes, kept)
    names = [line.split()[0] for line in text.splitlines() if line.startswith("NodeName=")]
    assert names == ["NodeName=n1", "NodeName=n2", "NodeName=n3", "NodeName=old4", "NodeName=old5"]
    # Its running jobs keep their partition; the node itself is drained (rules.drain_leaving).
    assert "PartitionName=main Nodes=n1,n2,n3,old4,old5 " in text
    # Without leaving nodes the file is as it always was.
    assert step.slurm_conf(cluster, nodes, {})[0] == step.slurm_conf(cluster, nodes)[0]


def test_the_head_is_asked_only_for_nodes_beyond_the_files_compute_nodes_and_names_enter_quoted():
    from provision.facts.probes import SlurmLeaving

    command = SlurmLeaving().command(("n1", "n-2.x"), removed=rules.REMOVED_PREFIX)
    assert 'case "$n" in n1|n-2.x) continue ;; esac' in command
    assert "grep -F '|provision: removed:'" in command
    # Names that would need quoting are quoted (the inventory refuses them before this).
    assert "'a b'" in SlurmLeaving().command(("a b",))


# --- accounting (slurm_accounting): the step's operations on fake hosts ----------------------

HEAD, COMPUTE = "@fake/node1", "@fake/node2"
ACCOUNTING = r"mariadb|mysql|slurmdbd|sacctmgr"


def _fake_cluster(tmp_path, monkeypatch, accounting: bool, head_answers: dict | None = None):
    """A head (the storage host) and a compute node on pyinfra's @fake connector, both
    already seen by a pass (their lines kept), with the controller's state in tmp_path."""
    from dataclasses import replace

    from provision.settings import Settings
    from tests.helpers.pyinfra_fake import fake_node

    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    nodes = []
    for name, address, groups, answers in (
        ("node1", "10.77.0.1", ("storage",), head_answers or {}),
        ("node2", "10.77.0.2", (), {}),
    ):
        settings = Settings(slurm_accounting=accounting, cluster_address=address)  # type: ignore[call-arg]
        nodes.append(replace(fake_node(name, settings, answers, groups=groups, address=address)))
    known = {n.name: step.Known(_known(n.name, n.cluster_address).line, n.name[6:] + "-host", None, 0) for n in nodes}
    monkeypatch.setattr(step, "pass_nodes", lambda cluster: known)
    return nodes


def _run(tmp_path, monkeypatch, accounting: bool, head_answers: dict | None = None):
    from tests.helpers.pyinfra_fake import run_fake

    nodes = _fake_cluster(tmp_path, monkeypatch, accounting, head_answers)
    run = run_fake(step.step, nodes, monkeypatch, path=tmp_path / "inv.py")
    for name in (HEAD, COMPUTE):
        assert run.results[name].ok, run.results[name].failures
    return run


def _index(run, host: str, pattern: str) -> int:
    import re

    return next(i for i, c in enumerate(run.commands[host]) if re.search(pattern, c))


def test_accounting_puts_slurmdbd_and_mariadb_on_the_head_alone_and_registers_the_cluster(tmp_path, monkeypatch):
    run = _run(tmp_path, monkeypatch, accounting=True)
    assert run.ran(HEAD, r"apt-get .*install.* mariadb-server slurmdbd")
    assert run.ran(HEAD, r"^mysql --batch < /etc/mysql/provision-slurm-grants\.sql$")
    assert run.ran(HEAD, r"chown slurm:slurm /etc/slurm/slurmdbd\.conf")
    assert run.ran(HEAD, r"chmod 600 /etc/slurm/slurmdbd\.conf")
    assert run.ran(HEAD, r"chmod 600 /etc/mysql/provision-slurm-grants\.sql")
    assert not run.ran(HEAD, r"chown \S+ /etc/(slurm|mysql)$")  # root's directories stay root's
    assert run.ran(HEAD, r"sacctmgr -i add cluster \"\$name\"")
    assert run.ran(HEAD, r"^name=provision\n")
    # MariaDB, then slurmdbd, then the cluster registered in it (which waits until slurmdbd
    # answers), all before slurmctld starts; then slurmctld's one restart for accounting.
    assert _index(run, HEAD, "restart mariadb.service") < _index(run, HEAD, "mysql --batch")
    assert _index(run, HEAD, "mysql --batch") < _index(run, HEAD, "restart slurmdbd.service")
    assert _index(run, HEAD, "restart slurmdbd.service") < _index(run, HEAD, "sacctmgr -i add cluster")
    assert _index(run, HEAD, "sacctmgr -i add cluster") < _index(run, HEAD, "start slurmctld.service")
    assert _index(run, HEAD, "start slurmctld.service") < _index(run, HEAD, "^systemctl restart slurmctld.service$")
    assert run.ran(HEAD, "stamps/slurmdbd-cluster")
    assert run.ran(HEAD, "stamps/slurm-accounting")
    assert not run.ran(COMPUTE, ACCOUNTING)

    password = (step.state.inventory_dir(tmp_path / "inv.py") / "slurmdbd-db.password").read_text().strip()
    assert not [c for c in run.commands[HEAD] if password in c]  # never on a command line
    uploaded = run.uploads[HEAD]
    conf = next(text for dest, text in uploaded.items() if dest.endswith("slurmdbd.conf"))
    assert f"StoragePass={password}\n" in conf
    assert "DbdHost=node1-host\n" in conf
    assert "bind-address = 127.0.0.1\n" in uploaded["/etc/mysql/mariadb.conf.d/60-provision-slurm.cnf"]
    for host in (HEAD, COMPUTE):
        assert "AccountingStorageHost=10.77.0.1\n" in run.uploads[host]["/etc/slurm/slurm.conf"]
    assert run.uploads[HEAD]["/etc/slurm/slurm.conf"] == run.uploads[COMPUTE]["/etc/slurm/slurm.conf"]


def test_without_accounting_no_host_gets_any_of_it(tmp_path, monkeypatch):
    run = _run(tmp_path, monkeypatch, accounting=False)
    for host in (HEAD, COMPUTE):
        assert not run.ran(host, ACCOUNTING)
        assert "Accounting" not in run.uploads[host]["/etc/slurm/slurm.conf"]
    assert not (step.state.inventory_dir(tmp_path / "inv.py") / "slurmdbd-db.password").exists()
    assert not [n for n in run.results[HEAD].notes if "accounting" in n]


def test_a_second_run_with_accounting_in_place_registers_and_restarts_nothing(tmp_path, monkeypatch):
    from provision.operations.stamps import digest

    current = {
        "stamps/slurm-accounting": [digest(["provision", "10.77.0.1"])],
        "stamps/slurmdbd-cluster": [digest(["provision"])],
        "dpkg -l": ["ii  mariadb-server 1:10.11.6-0+deb12u1 all x", "ii  slurmdbd 22.05.8-4+deb12u3 amd64 x"],
    }
    run = _run(tmp_path, monkeypatch, accounting=True, head_answers=current)
    assert not run.ran(HEAD, r"sacctmgr|^systemctl restart slurmctld\.service$|install.*(mariadb|slurmdbd)")


def test_turning_accounting_off_stops_slurmdbd_once_and_leaves_the_data(tmp_path, monkeypatch):
    import re

    from provision.operations.stamps import digest

    was_on = {
        "stamps/slurm-accounting": [digest(["provision", "10.77.0.1"])],
        "dpkg -l": ["ii  slurmdbd 22.05.8-4+deb12u3 amd64 x"],
        re.compile(r"--property SubState slurmdbd\.service"): ["Id=slurmdbd.service", "SubState=running"],
        re.compile(r"--property UnitFileState slurmdbd\.service"): ["Id=slurmdbd.service", "UnitFileState=enabled"],
    }
    run = _run(tmp_path, monkeypatch, accounting=False, head_answers=was_on)
    assert run.ran(HEAD, r"systemctl stop slurmdbd\.service")
    assert run.ran(HEAD, r"systemctl disable slurmdbd\.service")
    assert run.ran(HEAD, r"^systemctl restart slurmctld\.service$")
    assert not run.ran(HEAD, r"mariadb\.service|mysql|sacctmgr|DROP")
    assert "Accounting" not in run.uploads[HEAD]["/etc/slurm/slurm.conf"]
    assert [n for n in run.results[HEAD].notes if "left in place" in n]
    assert not run.ran(COMPUTE, ACCOUNTING)

    once = {**was_on, "stamps/slurm-accounting": [digest(deploy_accounting.ACCOUNTING_OFF)]}
    monkeypatch.undo()
    again = _run(tmp_path, monkeypatch, accounting=False, head_answers=once)
    assert not again.ran(HEAD, r"^systemctl restart slurmctld\.service$")
    assert not [n for n in again.results[HEAD].notes if "accounting" in n]


def test_lost_roles_stop_only_once_the_head_has_answered_and_a_leaving_node_keeps_slurmd_for_its_drain():
    from provision.facts.probes import LeavingNode, SlurmRoster

    both = [rules.CONTROLLER_PACKAGE, rules.COMPUTE_PACKAGE]
    # The head did not answer (not in the pass): who leaves is unknown, nothing stops.
    assert roster.lost_roles(None, "n3", both) == []
    leaving = SlurmRoster({"n3": LeavingNode("NodeName=n3 NodeAddr=10.0.0.3", [])})
    # n3 leaves in this pass: the head drains it and checks its jobs first; its slurmd stops
    # on the next pass, when the head's file no longer holds it.
    assert roster.lost_roles(leaving, "n3", both) == [rules.CONTROLLER_PACKAGE]
    assert roster.lost_roles(SlurmRoster(), "n3", both) == both


def test_a_pass_without_the_head_writes_the_kept_nodes_the_head_last_answered(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    cluster = load(write(tmp_path / "inv.py", INVENTORY))
    assert roster.last_kept(cluster) == {}
    roster._kept_file(cluster).write_text('{"old4": "NodeName=old4 NodeAddr=10.0.0.4 CPUs=8"}')
    assert roster.last_kept(cluster) == {"old4": "NodeName=old4 NodeAddr=10.0.0.4 CPUs=8"}
    roster._kept_file(cluster).write_text("[1, 2]")  # not what it writes: as good as none
    assert roster.last_kept(cluster) == {}


def test_slurmctld_is_restarted_on_failure_and_after_slurmdbd_where_accounting_runs(tmp_path, monkeypatch):
    """At boot slurmctld may start before its address or slurmdbd is up, and 22.05 then exits
    for good: the head's drop-in restarts it, and orders it after slurmdbd with accounting."""
    run = _run(tmp_path, monkeypatch, accounting=True)
    dropin = run.uploads[HEAD][rules.CONTROLLER_DROPIN]
    assert "Restart=on-failure\n" in dropin
    assert "After=slurmdbd.service\n" in dropin
    assert run.ran(HEAD, r"^systemctl daemon-reload$")
    assert rules.CONTROLLER_DROPIN not in run.uploads[COMPUTE]
    # MariaDB's socket activation listens on every address: masked, once, on the head.
    assert run.ran(HEAD, r"^systemctl mask mariadb\.socket mariadb-extra\.socket$")
    assert not run.ran(COMPUTE, "mariadb")
    assert "slurmdbd" not in rules.controller_dropin(accounting=False)
    assert "Restart=on-failure\n" in rules.controller_dropin(accounting=False)


def test_an_empty_answer_from_the_head_is_an_empty_roster_not_no_answer():
    """pyinfra gives a fact that printed nothing its default(): the head's SlurmLeaving with
    nobody leaving must still count as an answer, or no pass would ever stop a lost role's
    daemon (found on the testbed: slurmd kept running on a node that had left)."""
    from provision.facts.probes import SlurmLeaving, SlurmRoster

    assert SlurmLeaving().default() == SlurmRoster()
    assert roster.lost_roles(SlurmLeaving().default(), "n3", [rules.COMPUTE_PACKAGE]) == [rules.COMPUTE_PACKAGE]
