"""The slurm step's decisions that need the cluster: which nodes slurm.conf holds (nodes an
earlier run saw keep their line; nodes never seen are left out and named), who the controller
is (the head's own hostname), what restarts the daemons, and when a host is skipped."""

from __future__ import annotations

import re

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


def _fake_cluster(
    tmp_path, monkeypatch, accounting: bool, head_answers: dict | None = None, compute: tuple[dict, str] = ({}, "")
):
    """A head (the storage host) and a compute node on pyinfra's @fake connector, both
    already seen by a pass (their lines kept), with the controller's state in tmp_path.
    ``compute``: the compute node's answers, and its gres.conf from this pass's facts."""
    from dataclasses import replace

    from provision.settings import Settings
    from tests.helpers.pyinfra_fake import fake_node

    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    nodes = []
    for name, address, groups, answers in (
        ("node1", "10.77.0.1", ("storage",), head_answers or {}),
        ("node2", "10.77.0.2", (), compute[0]),
    ):
        settings = Settings(slurm_accounting=accounting, cluster_address=address)  # type: ignore[call-arg]
        nodes.append(replace(fake_node(name, settings, answers, groups=groups, address=address)))
    known = {n.name: step.Known(_known(n.name, n.cluster_address).line, n.name[6:] + "-host", None, 0) for n in nodes}
    known[COMPUTE] = replace(known[COMPUTE], gres=compute[1])
    monkeypatch.setattr(step, "pass_nodes", lambda cluster: known)
    return nodes


def _wave(events: list | None = None):
    """The pipeline's own wave (up/pipeline.py): the step, then its after_step, where the
    head's second pass (deploys/slurm/controller.py) runs after the slurm step."""
    from provision.up import pipeline

    def on_event(host: str, text: str) -> None:
        if events is not None:
            events.append((host, text))

    return lambda cluster, steps: pipeline._up_wave(cluster, steps, on_event, None, None)


def _run(
    tmp_path,
    monkeypatch,
    accounting: bool,
    head_answers: dict | None = None,
    compute: tuple[dict, str] = ({}, ""),
    runner=None,
):
    """The slurm step as `up` runs it (the pipeline's wave, unless ``runner`` says otherwise)."""
    from tests.helpers.pyinfra_fake import run_fake

    nodes = _fake_cluster(tmp_path, monkeypatch, accounting, head_answers, compute)
    run = run_fake(step.step, nodes, monkeypatch, path=tmp_path / "inv.py", runner=runner or _wave())
    for name in (HEAD, COMPUTE):
        assert run.results[name].ok, run.results[name].failures
    return run


def _settled(run) -> dict:
    """The head's stamps once its second pass ran for the files ``run`` wrote: a run after
    it restarts and reconfigures nothing there."""
    from provision.operations.stamps import digest

    text = run.uploads[HEAD]["/etc/slurm/slurm.conf"]
    return {
        "stamps/slurmctld-nodes": [digest(step.restart_inputs(text))],
        "stamps/slurm-conf": [digest([text, rules.cgroup_conf()])],
    }


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
    first = _run(tmp_path, monkeypatch, accounting=True, head_answers=current)
    monkeypatch.undo()
    run = _run(tmp_path, monkeypatch, accounting=True, head_answers={**current, **_settled(first)})
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

    once = {**was_on, "stamps/slurm-accounting": [digest(deploy_accounting.ACCOUNTING_OFF)], **_settled(run)}
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


def test_slurmd_is_restarted_on_failure_on_every_compute_node(tmp_path, monkeypatch):
    """A slurmd that stops at a loaded boot would leave its node not responding for good."""
    run = _run(tmp_path, monkeypatch, accounting=True)
    for host in (HEAD, COMPUTE):
        dropin = run.uploads[host][rules.SLURMD_DROPIN]
        assert "[Service]\nRestart=on-failure\n" in dropin
        assert "TimeoutStartSec=300\n" in dropin
        assert run.ran(host, r"^systemctl daemon-reload$")


def test_an_empty_answer_from_the_head_is_an_empty_roster_not_no_answer():
    """pyinfra gives a fact that printed nothing its default(): the head's SlurmLeaving with
    nobody leaving must still count as an answer, or no pass would ever stop a lost role's
    daemon (found on the testbed: slurmd kept running on a node that had left)."""
    from provision.facts.probes import SlurmLeaving, SlurmRoster

    assert SlurmLeaving().default() == SlurmRoster()
    assert roster.lost_roles(SlurmLeaving().default(), "n3", [rules.COMPUTE_PACKAGE]) == [rules.COMPUTE_PACKAGE]


# --- the head's second pass (deploys/slurm/controller.py) and slurmd's restarts ---------------

GRES_2 = rules.GRES_HEAD + "".join(
    f"NodeName=node2 Name=gpu Type=h200 File=/dev/nvidia{i}\n" for i in (1, 0)
)  # two GPUs in this pass's facts


def _on_host(path: str, text: str) -> dict:
    """Answers for a file the host already has (0644 root:root, with this text, in a folder
    that is there): files.put leaves it be."""
    import hashlib

    folder = path.rsplit("/", 1)[0]
    stat = "user=root group=root mode={} atime=0 mtime=0 ctime=0 size={} '{}'"
    return {
        re.compile(rf"test -L {re.escape(path)} "): [stat.format("-rw-r--r--", len(text), path)],
        re.compile(rf"test -L {re.escape(folder)} \)"): [stat.format("drwxr-xr-x", 4096, folder)],
        re.compile(rf"sha1sum {re.escape(path)}"): [f"{hashlib.sha1(text.encode()).hexdigest()}  {path}"],
    }


def _step_alone(cluster, steps):
    """The step with no after_step, as `provision plan` prepares it."""
    from provision import engine

    return engine.run_steps(cluster, steps)


def test_the_head_reconfigures_in_its_own_pass_after_every_node_wrote_its_files(tmp_path, monkeypatch):
    """The slurm step on the head no longer restarts slurmctld or reconfigures: it clears the
    reconfigure's stamp, and the pipeline's after_step runs the head's second pass once the
    step ended on every host (a host does not wait for the others within a pass)."""
    alone = _run(tmp_path, monkeypatch, accounting=False, runner=_step_alone)
    assert not alone.ran(HEAD, r"scontrol reconfigure|restart slurmctld")
    assert alone.ran(HEAD, r"^rm -f /var/lib/provision/stamps/slurm-conf$")

    monkeypatch.undo()
    events: list[tuple[str, str]] = []
    run = _run(tmp_path, monkeypatch, accounting=False, runner=_wave(events))
    assert run.ran(HEAD, r"^scontrol reconfigure$")
    assert run.ran(HEAD, r"^systemctl restart slurmctld\.service$")  # a first run: no stamp yet
    assert not run.ran(COMPUTE, r"scontrol|restart slurmctld|cat /etc/slurm/slurm\.conf")
    # Every host's slurm step ended before the head's second pass started.
    second = [i for i, e in enumerate(events) if e == (HEAD, "slurm: started")][1]
    assert max(i for i, (h, t) in enumerate(events) if t.startswith("slurm: done") and h == COMPUTE) < second
    assert run.results[HEAD].steps == ["slurm"]  # one step in the summary, not two
    # The reconfigure's stamp is the one the slurm step used to write, over the same inputs.
    from provision.operations.stamps import digest, stamp_command

    text = run.uploads[HEAD]["/etc/slurm/slurm.conf"]
    assert run.ran(HEAD, "^" + re.escape(stamp_command("slurm-conf", digest([text, rules.cgroup_conf()]))) + "$")


def test_the_heads_second_pass_acts_per_stamp_and_a_second_run_changes_nothing(tmp_path, monkeypatch):
    from provision.deploys.slurm import controller
    from provision.operations.stamps import digest
    from tests.helpers.pyinfra_fake import run_fake

    first = _run(tmp_path, monkeypatch, accounting=False)
    text = first.uploads[HEAD]["/etc/slurm/slurm.conf"]
    on_head = {"cat /etc/slurm/slurm.conf": text.splitlines()}

    def second_pass(answers: dict):
        monkeypatch.undo()
        head, _ = _fake_cluster(tmp_path, monkeypatch, False, {**on_head, **answers})
        run = run_fake(controller.CONTROLLER_STEP, [head], monkeypatch, path=tmp_path / "inv.py")
        assert run.results[HEAD].ok, run.results[HEAD].failures
        return run

    settled = second_pass(_settled(first))
    assert not settled.ran(HEAD, r"^(scontrol|systemctl|mkdir)")
    assert settled.results[HEAD].changed == 0
    # The node list changed since slurmctld's last restart: it restarts; the reconfigure's
    # stamp holds this file, so no reconfigure on top.
    moved = second_pass({**_settled(first), "stamps/slurmctld-nodes": [digest(["SlurmctldHost=old(10.0.0.9)"])]})
    assert moved.ran(HEAD, r"^systemctl restart slurmctld\.service$")
    assert not moved.ran(HEAD, r"scontrol reconfigure")
    # slurm.conf changed (or the slurm step cleared the stamp): reconfigured, no restart.
    changed = second_pass({**_settled(first), "stamps/slurm-conf": []})
    assert changed.ran(HEAD, r"^scontrol reconfigure$")
    assert not changed.ran(HEAD, r"restart slurmctld")


def test_a_head_set_up_before_the_second_pass_does_not_restart_slurmctld_for_nothing(tmp_path, monkeypatch):
    """The earlier slurm step restarted slurmctld and slurmd under one stamp (slurm-nodes):
    where it holds this node list, the new slurmctld stamp is written from it."""
    from provision.operations.stamps import digest, stamp_command

    first = _run(tmp_path, monkeypatch, accounting=False)
    text = first.uploads[HEAD]["/etc/slurm/slurm.conf"]
    options = first.uploads[HEAD]["/etc/default/slurmd"]
    old = {
        "stamps/slurm-nodes": [digest([*step.restart_inputs(text), options])],
        "stamps/slurm-conf": [digest([text, rules.cgroup_conf()])],
    }
    monkeypatch.undo()
    run = _run(tmp_path, monkeypatch, accounting=False, head_answers=old)
    adopted = "^" + re.escape(stamp_command("slurmctld-nodes", digest(step.restart_inputs(text)))) + "$"
    # Written in the slurm step, before the second pass reads it. (A fake host's stamps do
    # not read back: that pass restarts here, and writes the stamp again.)
    assert _index(run, HEAD, adopted) < _index(run, HEAD, r"^systemctl restart slurmctld\.service$")
    monkeypatch.undo()
    stale = {**old, "stamps/slurm-nodes": [digest(["SlurmctldHost=old(10.0.0.9)", options])]}
    run = _run(tmp_path, monkeypatch, accounting=False, head_answers=stale)
    # Not proven by the old stamp: slurmctld restarts in the second pass, then its stamp.
    assert _index(run, HEAD, adopted) > _index(run, HEAD, r"^systemctl restart slurmctld\.service$")
    assert len(run.ran(HEAD, adopted)) == 1


def test_a_node_whose_gres_changed_restarts_its_slurmd_and_other_changes_reload_it(tmp_path, monkeypatch):
    """slurmd counts its GPUs at start only: a reload left it reporting the old count, and
    slurmctld drained the node ("gres/gpu count reported lower than configured")."""
    from provision.operations.stamps import digest

    def settled_compute(first, gres: str) -> dict:
        text = first.uploads[COMPUTE]["/etc/slurm/slurm.conf"]
        options = first.uploads[COMPUTE]["/etc/default/slurmd"]
        return {
            "stamps/slurm-nodes": [digest([*step.restart_inputs(text), options])],
            "stamps/slurmd-files": [digest([text, gres, rules.cgroup_conf()])],
            "stamps/slurmd-gres": [digest([gres])],
        }

    first = _run(tmp_path, monkeypatch, accounting=False, compute=({}, GRES_2))
    assert first.uploads[COMPUTE]["/etc/slurm/gres.conf"] == GRES_2
    stamps = settled_compute(first, GRES_2)

    # Its gres.conf already holds these GPUs; slurm.conf changes: a reload, no restart.
    monkeypatch.undo()
    same = _run(tmp_path, monkeypatch, False, compute=({**stamps, **_on_host("/etc/slurm/gres.conf", GRES_2)}, GRES_2))
    assert "/etc/slurm/gres.conf" not in same.uploads[COMPUTE]
    assert same.ran(COMPUTE, r"^systemctl reload slurmd\.service$")
    assert not same.ran(COMPUTE, r"^systemctl restart slurmd\.service$")

    # Its gres.conf had no GPUs (the driver just came, or the stand-ins): slurmd restarts,
    # even where the stamp already holds the new file (written by hand, say).
    monkeypatch.undo()
    grew = _run(
        tmp_path, monkeypatch, False, compute=({**stamps, **_on_host("/etc/slurm/gres.conf", rules.GRES_HEAD)}, GRES_2)
    )
    assert grew.uploads[COMPUTE]["/etc/slurm/gres.conf"] == GRES_2
    restart = _index(grew, COMPUTE, r"^systemctl restart slurmd\.service$")
    assert _index(grew, COMPUTE, r"^systemctl reload slurmd\.service$") < restart
    assert _index(grew, COMPUTE, r"> /var/lib/provision/stamps/slurmd-gres\.tmp") > restart


def test_a_plan_shows_the_heads_reconfigure_as_due_and_not_its_second_pass(tmp_path, monkeypatch):
    """`provision plan` runs no after_step (up/pipeline.py plan): the head's reconfigure shows
    as the slurm step's "scontrol reconfigure due"; slurmctld's restarts do not show."""
    from provision import engine
    from provision.inventory import Cluster

    nodes = _fake_cluster(tmp_path, monkeypatch, accounting=True)
    plans = engine.plan_steps(Cluster(path=tmp_path / "inv.py", nodes=tuple(nodes)), [step.step])
    names = [op.name for op in plans[HEAD].steps["slurm"]]
    assert [n for n in names if "reconfigure" in n] == [
        "Slurm | scontrol reconfigure due (the head runs it once every node has written its files)"
    ]
    assert not [n for n in names if "slurmctld" in n and "restart" in n.lower() and "drop-in" not in n]
    assert not [n for n in (op.name for op in plans[COMPUTE].steps["slurm"]) if "reconfigure" in n]


def test_a_nodes_gpu_count_restarts_slurmctld_and_a_memory_change_only_reconfigures():
    """slurmctld 22.05's reconfigure refuses a GPU count that changes to anything but 0 where
    gres.conf names files (seen on the testbed: 0 -> 2 left the node with no GPUs): the
    count is among what restarts it. Other nodes' slurmd keep running (restart_inputs)."""
    from provision.deploys.slurm import controller_restart_inputs, restart_inputs

    base = "SlurmctldHost=node1(10.77.0.11)\nNodeName=node2 NodeAddr=10.77.0.12 CPUs=2 RealMemory=1710{}\n"
    none, two, more_memory = base.format(""), base.format(" Gres=gpu:h200:2"), base.format("0")
    assert controller_restart_inputs(none) != controller_restart_inputs(two)
    assert controller_restart_inputs(none) == controller_restart_inputs(more_memory)
    assert restart_inputs(none) == restart_inputs(two)
