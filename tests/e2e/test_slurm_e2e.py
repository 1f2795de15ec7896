"""The slurm step on the shared testbed (part of the session's one `up`): one controller, both
nodes registered and idle, one munge key, the same slurm.conf everywhere, a job across both
nodes, and a second run of the step that changes nothing."""

from __future__ import annotations

import time

from provision import inventory
from provision.up import pipeline
from tests.e2e.storage_helpers import sh

IDLE_WITHIN_S = 120  # slurmd registers within seconds of its start; a TCG guest is slow


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
    assert states == {n.name: "idle" for n in cluster.nodes}, sh(head, "sinfo -R; scontrol show nodes | head -60")


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
