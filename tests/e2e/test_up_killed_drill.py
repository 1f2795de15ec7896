"""Failure drill: the controller killed (SIGKILL) while `provision up` runs, at the worst
moment: a file has just changed on a host and the follow-up that makes it take effect has
not run. The re-run finishes the job (the host's stamp says the follow-up is still owed,
operations/stamps.py), the run after that changes nothing, and `provision verify` passes.

Two points, each reached by an inventory change a user would make (tests/e2e/up_killed_at.py
kills the run as the follow-up is about to start):
- base: ntp_servers added; killed after chrony's sources were written, before its restart;
- nfs: an export option added; killed after the exports were written, before `exportfs -ra`.
The third point, mid-volumes, is in test_storage_drills.py: its force_format rebuild is killed
after fstab names the new volume, before systemd re-reads fstab and the mount.
The testbed's own settings are put back at the end by one more `up`.
"""

from __future__ import annotations

import pytest

from provision import inventory
from provision.facts.stamps import stamp_path
from tests.e2e.storage_helpers import cli, derived_inventory, sh
from tests.e2e.up_killed_at import killed_up

pytestmark = pytest.mark.destructive

NTP = "10.0.2.2"  # qemu's address for the machine running the VMs: reaches nothing beyond it
OPTIONS = "rw,sync,root_squash,no_subtree_check,no_wdelay"  # the default and no_wdelay
SERVER = "node1"  # the testbed's storage host


def chrony_servers(node) -> str:
    return sh(node, "chronyc -n sources")


def test_up_killed_between_a_file_and_its_follow_up_finishes_on_the_next_run(provisioned, testbed, tmp_path) -> None:
    names = [n.name for n in testbed.nodes]
    changed = derived_inventory(
        testbed.inventory_path,
        tmp_path / "changed.py",
        names,
        {name: {"ntp_servers": [NTP], "nfs_export_options": OPTIONS} for name in names},
    )
    cluster = inventory.load(changed)
    server = cluster.node(SERVER)

    try:
        # base: chrony's sources are the new ones on the host the run died on, chrony still
        # runs without them, and the stamp is not theirs.
        host = cluster.node(killed_up(changed, "base", "chrony: reload servers"))
        assert NTP in sh(host, "cat /etc/chrony/sources.d/provision.sources")
        assert NTP not in chrony_servers(host)
        stamp_before = sh(host, f"cat {stamp_path('chrony-sources')} 2>/dev/null || true")

        # nfs: the exports file says no_wdelay on the server; the kernel's exports do not yet.
        assert killed_up(changed, "nfs", "Re-export", SERVER) == SERVER
        assert "no_wdelay" in sh(server, "cat /etc/exports.d/provision.exports")
        assert "no_wdelay" not in sh(server, "exportfs -v")

        # The re-run runs what the killed runs owed (and takes the host locks they held).
        again = cli("up", str(changed), "--only", "base,nfs", "--json")
        assert again.exit_code == 0, again.stdout + again.stderr
        for node in cluster.nodes:
            assert NTP in chrony_servers(node), node.name
        assert sh(host, f"cat {stamp_path('chrony-sources')}") != stamp_before
        assert "no_wdelay" in sh(server, "exportfs -v")

        # Converged: the next run changes nothing, and verify passes.
        third = cli("up", str(changed), "--only", "base,nfs", "--json")
        assert third.exit_code == 0, third.stdout + third.stderr
        assert {h["name"]: h["changed"] for h in third.json()["hosts"]} == dict.fromkeys(names, 0)
        verified = cli("verify", str(changed), "--workdir", str(tmp_path / "verify"))
        assert verified.exit_code == 0, verified.stdout[-4000:] + verified.stderr[-2000:]

    finally:
        # The testbed's own settings back, whatever failed above: no server for chrony, the
        # default export options, the testbed inventory's own training key.
        back = cli("up", str(testbed.inventory_path), "--only", "base,nfs", "--json")
    assert back.exit_code == 0, back.stdout + back.stderr
    assert NTP not in chrony_servers(cluster.node(SERVER))
    assert "no_wdelay" not in sh(server, "exportfs -v")
