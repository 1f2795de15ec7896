"""The slurm step on the shared testbed (part of the session's one `up`): one controller, both
nodes registered and idle, one munge key, the same slurm.conf everywhere, a job across both
nodes, a second run of the step that changes nothing, the health check draining a node
whose disk is full, resuming it once fixed, and leaving an admin's drain alone, and accounting
(the testbed keeps slurm_accounting): the finished job in sacct."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest

from provision import inventory, remote
from provision.rules import slurm as rules
from provision.up import pipeline
from tests.e2e.storage_helpers import sh
from tests.standins import gpu_devices

IDLE_WITHIN_S = 120  # slurmd registers within seconds of its start; a TCG guest is slow
ACCOUNTED_WITHIN_S = 60  # slurmctld hands a finished job to slurmdbd asynchronously


# What the head knows of a node not idle: its state and reason, and slurmctld's own log of
# state changes (a CI run once found the head drained with no reason; this says by whom).
WHO_DRAINED = (
    "sinfo -R; scontrol show nodes | head -60; "
    "grep -E 'drain|DRAIN|reason|Reason|state set|not responding|unexpectedly|rebooted' "
    "/var/log/slurm/slurmctld.log | tail -40; journalctl -b -u slurmctld --no-pager | tail -15"
)


# What a node's own slurmd says: a node "not responding" may have no slurmd at all (CI once
# found the head's never registered after a boot, and its log was not kept).
SLURMD_SIDE = (
    "systemctl status slurmd --no-pager 2>&1 | head -12; "
    "journalctl -b -u slurmd --no-pager 2>&1 | tail -20; tail -20 /var/log/slurm/slurmd.log"
)


def _why_not_idle(head, nodes) -> str:
    own = "\n".join(f"--- {n.name}'s slurmd ---\n{remote.run(n, SLURMD_SIDE, timeout=60).stdout}" for n in nodes)
    return f"{sh(head, WHO_DRAINED)}\n{own}"


def _sinfo(node) -> dict[str, str]:
    out = sh(node, "sinfo --noheader --Node --format='%N %t'")
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_every_node_registers_with_the_controller_and_is_idle(provisioned, testbed) -> None:
    assert all("slurm" in h.steps for h in provisioned.hosts.values()), provisioned.as_json()
    cluster = inventory.load(testbed.inventory_path)
    head = cluster.head_node()[0]
    deadline = time.monotonic() + IDLE_WITHIN_S
    states = _sinfo(head)
    while set(states.values()) != {"idle"} and time.monotonic() < deadline:
        time.sleep(3)
        states = _sinfo(head)
    assert states == {n.name: "idle" for n in cluster.nodes}, _why_not_idle(head, cluster.nodes)


def test_one_munge_key_and_one_slurm_conf_on_every_node(provisioned, testbed) -> None:
    cluster = inventory.load(testbed.inventory_path)
    sums = {n.name: sh(n, "sha256sum /etc/slurm/slurm.conf /etc/munge/munge.key") for n in cluster.nodes}
    assert len(set(sums.values())) == 1, sums
    # A credential made on one node is read on the other: the same key, munged running on both.
    first, second = cluster.nodes[0], cluster.nodes[1]
    credential = sh(first, "munge -n").strip()
    assert "STATUS:          Success (0)" in sh(second, f"echo {credential} | unmunge")
    assert sh(first, "stat -c '%a %U:%G' /etc/munge/munge.key").strip() == "400 munge:munge"


def test_a_job_runs_on_both_nodes_and_a_second_run_changes_nothing(provisioned, testbed) -> None:
    cluster = inventory.load(testbed.inventory_path)
    head = cluster.head_node()[0]
    ran = sh(head, "srun --nodes=2 --ntasks-per-node=1 --time=2 hostname | sort")
    assert ran.split() == sorted(sh(n, "hostname").strip() for n in cluster.nodes)
    report = pipeline.up(cluster, pipeline.select(only="slurm"))
    for name, host in report.hosts.items():
        assert (host.changed, host.failures) == (0, []), (name, host.changed_by_step, host.failures)


def _state(head, name: str) -> tuple[str, str]:
    """A node's state (sinfo's %T) and drain reason, as the controller has them."""
    state, _, reason = sh(head, f"sinfo --noheader --Node --nodes={name} --format='%T|%E'").strip().partition("|")
    return state, reason


def _answering_state(head, name: str, timeout_s: float = 120) -> tuple[str, str]:
    """_state once the controller has heard from the node's slurmd: sinfo marks a node it
    has not reached lately with "*" (idle*), which a loaded host shows for a while (seen
    in a clean-clone run beside the other tiers); that says nothing about its drain."""
    deadline = time.monotonic() + timeout_s
    state, reason = _state(head, name)
    while state.endswith("*") and time.monotonic() < deadline:
        time.sleep(5)
        state, reason = _state(head, name)
    return state, reason


def _health(node) -> tuple[int, str]:
    """Run the node's health check program by hand, as slurmd does every interval."""
    result = remote.run(node, rules.HEALTH_PROGRAM, timeout=90)
    return result.exited, result.stdout


def _passes(node) -> None:
    """The check passes (it may say it resumed its own drain, unless slurmd's run did first)."""
    code, out = _health(node)
    assert code == 0, out
    assert out == "" or "every check passes; resuming (was: provision: health: " in out, out


def test_the_health_check_drains_a_full_node_resumes_it_and_leaves_an_admins_drain_alone(provisioned, testbed) -> None:
    cluster = inventory.load(testbed.inventory_path)
    head = cluster.head_node()[0]
    node = cluster.nodes[-1]
    assert f"HealthCheckProgram={rules.HEALTH_PROGRAM}\n" in sh(node, "cat /etc/slurm/slurm.conf")
    assert _health(node) == (0, ""), sh(node, f"bash -x {rules.HEALTH_PROGRAM} 2>&1 | tail -40")
    fill = "/var/tmp/provision-health-test-fill"
    try:
        # The root filesystem past FULL_AT_PERCENT: allocate all but 1 % of it.
        size, avail = (int(x) for x in sh(node, "df -k --output=size,avail / | tail -n 1").split())
        sh(node, f"fallocate -l {max(avail - size // 100, 1)}K {fill}")
        code, out = _health(node)
        assert code == 1
        assert re.search(r"provision: health: / (\d+)% full", out), out
        state, reason = _state(head, node.name)
        assert ("drain" in state, reason.startswith("provision: health: / ")) == (True, True), (state, reason)
    finally:
        sh(node, f"rm -f {fill}")
    _passes(node)
    assert _answering_state(head, node.name)[0] == "idle"
    # An admin's drain is theirs: a passing check does not resume it.
    sh(head, f"scontrol update NodeName={node.name} State=DRAIN Reason='admin: bad fan ticket 42'")
    try:
        assert _health(node) == (0, "")
        assert _state(head, node.name) == ("drained", "admin: bad fan ticket 42")
    finally:
        sh(head, f"scontrol update NodeName={node.name} State=RESUME")


def _sinfo_when_up(node) -> dict[str, str]:
    """_sinfo, or nothing while the controller does not answer (restarting)."""
    out = remote.run(node, "sinfo --noheader --Node --format='%N %t'", timeout=60)
    return dict(line.split() for line in out.stdout.splitlines() if line.strip()) if out.ok else {}


def _unit(node, unit: str) -> list[str]:
    return sh(node, f"systemctl is-active {unit} || true; systemctl is-enabled {unit} || true").split()


@pytest.mark.takes_s(660)  # CI's run of stop 46: 544 s
def test_a_node_leaving_the_compute_nodes_is_drained_kept_while_its_job_runs_then_dropped_and_taken_back(
    provisioned, testbed
) -> None:
    """The inventory edited so that only the head computes: node2 leaves Slurm. With a job on
    it, it stays in slurm.conf, drained, and the job runs on; put back in the inventory, that
    drain is lifted. Without jobs it leaves slurm.conf, and the next up stops its slurmd; put
    back, it rejoins idle, and a job running on the head meanwhile is never restarted."""
    path = Path(testbed.inventory_path)
    original = path.read_text()
    cluster = inventory.load(path)
    head, node = cluster.head_node()[0], cluster.nodes[-1]
    assert head.name != node.name
    only_head = original + f"\ncompute = [{head.name!r}]  # e2e: {node.name} leaves Slurm\n"

    def up_with(text: str):
        path.write_text(text)
        report = pipeline.up(inventory.load(path), pipeline.select(only="slurm"))
        assert report.exit_code == 0, report.as_json()
        return report

    def drill() -> None:
        job = sh(head, f"sbatch --parsable --nodelist={node.name} --time=10 --wrap 'sleep 600'").strip().split(";")[0]
        try:
            deadline = time.monotonic() + IDLE_WITHIN_S
            while sh(head, f"squeue --noheader --jobs={job} --format=%T").strip() != "RUNNING":
                assert time.monotonic() < deadline, sh(head, f"scontrol show job {job}")
                time.sleep(2)
            kept = up_with(only_head)
            said = " ".join(kept.hosts[head.name].notes)
            assert f"slurm: {node.name} stays in slurm.conf, drained, until its jobs end ({job})" in said, said
            state, reason = _state(head, node.name)
            assert ("drain" in state, reason) == (True, rules.REMOVED_REASON), (state, reason)
            assert sh(head, f"squeue --noheader --jobs={job} --format=%T").strip() == "RUNNING"
            assert _unit(node, "slurmd") == ["active", "enabled"]  # its job's slurmstepd answers to it
            # Back in the inventory while it still has the job: the removal's drain is lifted.
            up_with(original)
            assert "drain" not in _state(head, node.name)[0]
        finally:
            sh(head, f"scancel {job} || true")
            path.write_text(original)
        try:
            # No jobs: it leaves slurm.conf; its slurmd (no longer its role) stops on the next up,
            # once the head's file no longer holds it (hosts do not wait for each other in a pass,
            # and the head drains it and checks its jobs first).
            dropped = up_with(only_head)
            said = " ".join(dropped.hosts[head.name].notes)
            assert f"slurm: {node.name} leaves slurm.conf" in said, said
            assert _unit(node, "slurmd") == ["active", "enabled"]
            up_with(only_head)
            deadline = time.monotonic() + IDLE_WITHIN_S  # slurmctld restarted: a moment until it answers
            while list(_sinfo_when_up(head)) != [head.name]:
                assert time.monotonic() < deadline, sh(head, "sinfo -N; tail -20 /var/log/slurm/slurmctld.log")
                time.sleep(3)
            assert _unit(node, "slurmd") == ["inactive", "disabled"]
        finally:
            path.write_text(original)
        # Put back: it joins while a job runs on the head, and that job runs on, never restarted
        # (the daemons restart for the new node list; the job lives in its slurmstepd).
        submit = f"sbatch --parsable --nodelist={head.name} --time=10 --wrap 'sleep 600'"
        running = sh(head, submit).strip().split(";")[0]
        try:
            deadline = time.monotonic() + IDLE_WITHIN_S
            while sh(head, f"squeue --noheader --jobs={running} --format=%T").strip() != "RUNNING":
                assert time.monotonic() < deadline, sh(head, f"scontrol show job {running}")
                time.sleep(2)
            up_with(original)
            deadline = time.monotonic() + IDLE_WITHIN_S
            while _sinfo_when_up(head).get(node.name) != "idle":
                assert time.monotonic() < deadline, sh(head, "sinfo -R; sinfo -N")
                time.sleep(3)
            shown = sh(head, f"scontrol show job {running} -o")
            assert "JobState=RUNNING" in shown, shown
            assert "Restarts=0" in shown, shown
        finally:
            sh(head, f"scancel {running} || true")
        deadline = time.monotonic() + IDLE_WITHIN_S
        while _sinfo_when_up(head) != {n.name: "idle" for n in cluster.nodes}:
            assert time.monotonic() < deadline, sh(head, "sinfo -R; sinfo -N")
            time.sleep(3)
        assert _unit(node, "slurmd") == ["active", "enabled"]

    try:
        drill()
    except BaseException:
        # The rest of the suite shares this testbed: whatever failed, node2 goes back.
        path.write_text(original)
        pipeline.up(inventory.load(path), pipeline.select(only="slurm"))
        sh(head, f"scontrol update NodeName={node.name} State=RESUME || true")
        raise


def _open_each(head, node, gres: str) -> tuple[str, dict[str, str]]:
    """A job on ``node`` asking for ``gres``: its CUDA_VISIBLE_DEVICES, and how opening each
    stand-in device ended (ENXIO: the cgroup let it through to a device with no driver
    behind it; EPERM: the job's device cgroup refused it)."""
    script = (
        'echo "visible=$CUDA_VISIBLE_DEVICES"; '
        # sh's own message ("sh: 1: cannot open /dev/nvidia0: <strerror>"), cut to "<file> <strerror>".
        'for d in /dev/nvidia0 /dev/nvidia1; do ( exec 3<"$d" ) 2>&1 | sed "s|.*: |$d |"; done'
    )
    out = sh(head, f"srun --nodelist={node.name} --gres={gres} --time=2 sh -c {shlex.quote(script)}")
    visible = re.search(r"^visible=(.*)$", out, re.M)
    opened = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith("/dev/nvidia"))
    return (visible[1] if visible else ""), opened


def test_a_job_asking_for_one_gpu_sees_only_its_device(provisioned, testbed) -> None:
    """Two stand-in GPUs on node2 (tests/standins/gpu_devices.py: device files, nvidia-smi and
    the driver's /proc files from a captured H200, minor numbers crossed): the slurm step
    declares them from the GPU fact, and a job given one GPU can open only that one."""
    cluster = inventory.load(testbed.inventory_path)
    head, node = cluster.head_node()[0], cluster.nodes[-1]
    gpu_devices.install(node)
    try:
        report = pipeline.up(cluster, pipeline.select(only="slurm"))
        assert report.exit_code == 0, report.as_json()
        conf = sh(node, "cat /etc/slurm/slurm.conf /etc/slurm/gres.conf")
        assert re.search(rf"^NodeName={node.name} .* Gres=gpu:h200:2 ", conf, re.M), conf
        # Each GPU's own file, in NVML index order: index 0 is minor 1 here.
        assert re.findall(r"^NodeName=\S+ Name=gpu Type=h200 File=(\S+)$", conf, re.M) == [
            "/dev/nvidia1",
            "/dev/nvidia0",
        ], conf
        deadline = time.monotonic() + IDLE_WITHIN_S
        while "gpu:h200:2" not in sh(head, f"sinfo --noheader --Node --nodes={node.name} --format=%G"):
            assert time.monotonic() < deadline, sh(head, f"scontrol show node {node.name}")
            time.sleep(3)
        visible, opened = _open_each(head, node, "gpu:1")
        assert visible == "0", visible
        assert sorted(opened.values()) == ["No such device or address", "Operation not permitted"], opened
        visible, opened = _open_each(head, node, "gpu:2")
        assert visible == "0,1", visible
        assert set(opened.values()) == {"No such device or address"}, opened
    finally:
        # Whatever failed above, node2 goes back to no GPUs for the tests after this one: its
        # files written again without them, its health check lifting the drain it made while
        # the stand-ins went, and Slurm's own drain for the vanished GPUs resumed (below).
        gpu_devices.remove(node)
        report = pipeline.up(cluster, pipeline.select(only="slurm"))
        health = _health(node)
        back = _gpus_gone_and_resumed(head, cluster)
    assert report.exit_code == 0, report.as_json()
    assert "Gres=gpu" not in sh(node, "cat /etc/slurm/slurm.conf")
    assert health[0] == 0, health
    assert back, sh(head, "sinfo -R; sinfo -N")


def _gpus_gone_and_resumed(head, cluster) -> bool:
    """Every node idle again after the stand-in GPUs went, within IDLE_WITHIN_S. The node's
    slurmd restarted with none (its gres.conf changed) while slurmctld still counted two, so
    slurmctld may drain it ("gres/gpu count reported lower than configured (0 < 2)"): right
    for GPUs that vanish, the node stays out until an admin resumes it, as this does
    (README, Slurm). Whether the drain comes depends on when slurmd registers against the
    head's restart."""
    deadline = time.monotonic() + IDLE_WITHIN_S
    while _sinfo_when_up(head) != {n.name: "idle" for n in cluster.nodes}:
        if time.monotonic() > deadline:
            return False
        for name in _sinfo_when_up(head):
            if "count reported lower than configured" in _state(head, name)[1]:
                sh(head, f"scontrol update NodeName={name} State=RESUME")
        time.sleep(3)
    return True


def test_slurmd_own_health_check_drains_a_node_whose_data_volume_is_unmounted_within_one_interval(
    provisioned, testbed
) -> None:
    """Nothing run by hand: slurmd runs the check every slurm_health_interval_s, and the first
    run after the data volume goes drains the node with the reason naming it."""
    cluster = inventory.load(testbed.inventory_path)
    head, node = cluster.head_node()[0], cluster.nodes[-1]
    mount, interval = node.settings.data_mount, node.settings.slurm_health_interval_s
    assert _answering_state(head, node.name)[0] == "idle"
    sh(node, f"umount {shlex.quote(mount)}")
    try:
        gone = time.monotonic()
        # One interval, and the check's own run (at most about 30 s: rules.PROBE_S, SLURM_S).
        deadline = gone + interval + 2 * (rules.PROBE_S + rules.SLURM_S) + 10
        state, reason = _state(head, node.name)
        while "drain" not in state:
            assert time.monotonic() < deadline, (state, reason, sh(node, "tail -5 /var/log/slurm/slurmd.log"))
            time.sleep(2)
            state, reason = _state(head, node.name)
        assert reason == f"provision: health: {mount} not mounted", reason
    finally:
        sh(node, f"mountpoint -q {shlex.quote(mount)} || mount {shlex.quote(mount)}")
    _passes(node)
    assert _answering_state(head, node.name)[0] == "idle"


def _sacct_state(node, job: str) -> str:
    """The job's state in accounting as sacct on ``node`` has it ("" while not there yet)."""
    result = remote.run(node, f"sacct -n -X -j {job} --format=State", timeout=60)
    return result.stdout.strip() if result.ok else ""


def test_accounting_keeps_a_finished_job_for_sacct(provisioned, testbed) -> None:
    cluster = inventory.load(testbed.inventory_path)
    head = cluster.head_node()[0]
    assert head.settings.slurm_accounting  # the testbed's inventory turns it on
    assert sh(head, "stat -c '%a %U:%G' /etc/slurm/slurmdbd.conf").strip() == "600 slurm:slurm"
    # MariaDB listens on loopback only, and neither it nor slurmdbd runs on the other nodes.
    listening = sh(head, "ss -H -ltn '( sport = :3306 )'").splitlines()
    assert {line.split()[3] for line in listening} == {"127.0.0.1:3306"}, listening
    for node in cluster.nodes:
        if node.name != head.name:
            assert sh(node, "systemctl is-active mariadb.service slurmdbd.service || true").split() == [
                "inactive",
                "inactive",
            ]
            # Nor does anything listen for it there (the image's MariaDB socket units are off).
            assert sh(node, "ss -H -ltn '( sport = :3306 )'").strip() == "", node.name
    clusters = sh(head, "sacctmgr -n -P list cluster format=cluster").split()
    assert head.settings.slurm_cluster_name in clusters, clusters

    out = sh(head, "srun --nodes=2 --ntasks-per-node=1 --time=2 sh -c 'echo \"$SLURM_JOB_ID $(hostname)\"'")
    jobs = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert len(out.splitlines()) == 2, out  # one task on each node
    assert len(jobs) == 1, out
    (job,) = jobs
    deadline = time.monotonic() + ACCOUNTED_WITHIN_S
    state = _sacct_state(head, job)
    while state != "COMPLETED" and time.monotonic() < deadline:
        time.sleep(3)
        state = _sacct_state(head, job)
    assert state == "COMPLETED", (
        state,
        sh(head, "tail -n 30 /var/log/slurm/slurmdbd.log; systemctl status slurmdbd | cat"),
    )
    # A compute node asks the head's slurmdbd too (AccountingStorageHost, by address).
    assert _sacct_state(cluster.nodes[-1], job) == "COMPLETED"
