"""`provision up` on the shared testbed: converges, and a second run changes nothing. Uses
the session's one provisioning run (the `provisioned` fixture).

The verify suite runs once on the shared testbed, in test_nvidia_standins.py, after `up` and
the nvidia step: the base, frameworks and storage checks with the nvidia ones (a second run
of the base and storage checks here cost eight minutes of CI and proved nothing more)."""

from __future__ import annotations

import secrets

from provision import inventory, remote
from provision.up import pipeline
from tests.e2e.storage_helpers import FINGERPRINT, cli, sh


def test_up_brings_every_host_through_its_steps(provisioned) -> None:
    assert provisioned.exit_code == 0, provisioned.as_json()
    for host in provisioned.hosts.values():
        assert host.ok, host.failures
        assert {"preflight", "base", "frameworks"} <= set(host.steps)
        assert "nvidia: skipped (no NVIDIA GPU on the PCI bus)" in host.notes
        assert host.rebooted is False


def test_the_vms_chrony_asks_no_public_time_server(provisioned, testbed) -> None:
    # The base step installed chrony over the image's chrony.conf (ucf kept it): a testbed
    # VM reaches nothing outside this machine but the package mirror (guest_files.CHRONY_CONF).
    for node in inventory.load(testbed.inventory_path).nodes:
        assert sh(node, "systemctl is-active chrony").strip() == "active"
        assert sh(node, "head -n 1 /etc/chrony/chrony.conf").startswith("# provision testbed")
        # What chronyd reads: no pool or server line in its configuration or its sources.d.
        named = sh(node, "cat /etc/chrony/chrony.conf /etc/chrony/sources.d/* 2>/dev/null || true")
        assert not [line for line in named.splitlines() if line.split()[:1] in (["pool"], ["server"])], named


def test_plan_after_up_shows_no_changes_and_changes_nothing(provisioned, testbed) -> None:
    cluster = inventory.load(testbed.inventory_path)
    before = {n.name: remote.run(n, FINGERPRINT).stdout for n in cluster.nodes}
    plans = pipeline.plan(cluster, pipeline.select(only="base,nvidia,frameworks"))
    after = {n.name: remote.run(n, FINGERPRINT).stdout for n in cluster.nodes}
    assert before == after
    for plan in plans.values():
        assert plan.refused == []
        assert plan.changes == 0, [(s, o.name) for s, ops in plan.steps.items() for o in ops]


def test_second_up_changes_nothing_reboots_nothing_and_keeps_the_data(provisioned, testbed) -> None:
    # Through the CLI: volumes and nfs find their array, filesystem, exports and mounts in
    # place, and a file on the data volume is still there. The other steps' re-runs are
    # proved elsewhere on this testbed, to save CI the minutes: base and frameworks by the
    # kill-a-VM drill's re-run (0 changes), nvidia by test_nvidia_standins' second run.
    cluster = inventory.load(testbed.inventory_path)
    storage = cluster.node("node1")
    token = secrets.token_hex(16)
    sh(storage, f"echo {token} > /data/e2e-survives && sync")
    run = cli("up", str(testbed.inventory_path), "--only", "preflight,volumes,nfs,backups", "--json")
    assert run.exit_code == 0, run.stdout + run.stderr
    hosts = run.json()["hosts"]
    assert [h["name"] for h in hosts] == [n.name for n in cluster.nodes]
    changed = {h["name"]: (h["changed_by_step"], h["failures"]) for h in hosts if h["changed"] or not h["ok"]}
    assert changed == {}, changed
    assert all(h["rebooted"] is False for h in hosts), hosts
    assert sh(storage, "cat /data/e2e-survives").strip() == token
