"""`provision up` on the shared testbed: converges, verifies, and a second run changes
nothing. Uses the session's one provisioning run (the `provisioned` fixture)."""

from __future__ import annotations

from provision import inventory, remote, verify
from provision.up import pipeline
from tests.e2e.storage_helpers import FINGERPRINT


def test_up_brings_every_host_through_its_steps(provisioned) -> None:
    assert provisioned.exit_code == 0, provisioned.as_json()
    for host in provisioned.hosts.values():
        assert host.ok, host.failures
        assert {"preflight", "base", "frameworks"} <= set(host.steps)
        assert "nvidia: skipped (no NVIDIA GPU on the PCI bus)" in host.notes
        assert host.rebooted is False


def test_verify_suite_passes_after_up(provisioned, testbed, tmp_path) -> None:
    cluster = inventory.load(testbed.inventory_path)
    result = verify.run(cluster, str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "passed" in result.output


def test_plan_after_up_shows_no_changes_and_changes_nothing(provisioned, testbed) -> None:
    cluster = inventory.load(testbed.inventory_path)
    before = {n.name: remote.run(n, FINGERPRINT).stdout for n in cluster.nodes}
    plans = pipeline.plan(cluster, pipeline.select(only="base,nvidia,frameworks"))
    after = {n.name: remote.run(n, FINGERPRINT).stdout for n in cluster.nodes}
    assert before == after
    for plan in plans.values():
        assert plan.refused == []
        assert plan.changes == 0, [(s, o.name) for s, ops in plan.steps.items() for o in ops]


def test_second_up_changes_nothing_and_reboots_nothing(provisioned, testbed) -> None:
    cluster = inventory.load(testbed.inventory_path)
    again = pipeline.up(cluster, pipeline.select())
    assert again.exit_code == 0, again.as_json()
    for host in again.hosts.values():
        assert host.changed == 0, (host.name, host.changed)
        assert host.rebooted is False
