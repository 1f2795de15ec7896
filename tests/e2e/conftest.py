"""The shared end-to-end testbed: one 2-node qemu cluster for the whole session.

Every e2e test (testbed, provision up, storage, validate, train) uses the same VMs:
booting and provisioning them once is what keeps the suite inside its time budget
(docs/ARCHITECTURE.md). The testbed lives in a temporary state dir with its own inventory file
and is taken down at the end of the session; the debootstrapped base image stays in
the user's image cache (~/.cache/provision/images) so the next run starts from it, and the
provisioned disks stay beside it (snapshots/, tests/e2e/snapshot.py) so the next run with
the same code boots them instead of provisioning again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision.engine import RunReport
from provision.testbed import NodeRecord, Testbed, image
from tests.e2e import clock, snapshot

NODES = 2  # node1 is the storage node
DISKS = 2  # data disks per node: /dev/disk/by-id/virtio-NVME-<node>-<k>
SHAPE = {"nodes": NODES, "disks": DISKS}  # part of the snapshot key


def _wait_for_boot(tb: Testbed, names: list[str]) -> None:
    """Wait until each node's boot jobs are done (systemd's job queue empty): SSH answers
    before the provisioned nodes' nofail mounts (/data, the /shared bind) are up, and a file
    a test writes then lands under the mount point and is hidden once the mount arrives (a
    backup right after a snapshot boot saw an empty /shared/checkpoints)."""
    for name in names:
        # exit 1 means "degraded" (a unit failed): booted all the same, the tests say what broke
        subprocess.run(
            tb.ssh_argv(name, ["systemctl", "is-system-running", "--wait"]),
            capture_output=True,
            timeout=600,
            check=False,
        )


@dataclass
class SharedTestbed:
    """What the shared fixture hands to tests."""

    testbed: Testbed  # the library handle (status, stop_node, start_node, throttle, ssh_argv)
    inventory_path: Path  # the pyinfra inventory `up` wrote for these VMs
    nodes: list[NodeRecord]  # node records as `up` returned them
    snapshot_key: str  # hash of everything the provisioned disks depend on (tests/e2e/snapshot.py)
    cached_report: RunReport | None  # the snapshot's `up` report when the nodes came from it
    cache_is_new: bool  # the base image was built by this run: no earlier run used this cache


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedTestbed]:
    root = tmp_path_factory.mktemp("testbed")
    inventory_path = root / "inventories" / "testbed.py"
    tb = Testbed(root / "state", inventory_path=inventory_path, progress=clock.testbed_progress)
    digest = snapshot.key(tb, SHAPE)
    names = [f"node{i}" for i in range(1, NODES + 1)]
    cache_is_new = image.cached(tb.recipe(), tb.images_dir) is None
    try:
        clock.record("phase", "testbed up", at="start")
        # A snapshot of this same provisioning (same key) is put in place before the nodes
        # boot: they come up provisioned, and `provisioned` hands out its report.
        cached = snapshot.restore(tb, digest, inventory_path, names)
        clock.record("snapshot", "restore", hit=cached is not None, key=digest)
        nodes = tb.up(nodes=NODES, disks=DISKS)
        if cached is not None:
            _wait_for_boot(tb, names)
        clock.record("phase", "testbed up", at="end")
        yield SharedTestbed(tb, tb.inventory_path, nodes, digest, cached, cache_is_new)
    finally:
        tb.down()


# --- provisioning (owner: `provision up`) ----------------------------------------------


@pytest.fixture(scope="session")
def provisioned(testbed: SharedTestbed) -> RunReport:
    """`provision up` once on the shared testbed, all steps (nvidia skips itself: no GPU),
    frameworks from the CPU-torch wheelhouse the testbed inventory names. Returns the
    RunReport; tests assert on it.

    When the nodes came from a snapshot with this key, that is the report of the `up` which
    made it, with identical code; otherwise `up` runs here for real, and a successful run is
    stored as the new snapshot (the nodes are powered off for the copy and booted again)."""
    from provision import inventory
    from provision.up import pipeline

    if testbed.cached_report is not None:
        clock.record("phase", "shared up", at="from snapshot", key=testbed.snapshot_key)
        return testbed.cached_report
    cluster = inventory.load(testbed.inventory_path)
    clock.record("phase", "shared up", at="start")
    report = pipeline.up(cluster, pipeline.select(), on_event=clock.up_events("shared up"))
    clock.record("phase", "shared up", at="end")
    if testbed.cache_is_new:
        # A cache this run filled (CI's clean clone, a first run on a machine) is not read
        # again: the snapshot's power-off, copy and boot would cost about two minutes for
        # nothing. The nodes' first reboot since this `up` is then the nvidia module's,
        # and the verify suite after it checks that the mounts came back.
        clock.record("snapshot", "save", saved=False, why="the image cache is new this run")
        return report
    names = [n.name for n in testbed.nodes]
    snapshot.save(testbed.testbed, testbed.snapshot_key, testbed.inventory_path, report, names)
    testbed.nodes[:] = testbed.testbed.status()  # booted again: new pids
    _wait_for_boot(testbed.testbed, names)
    clock.record("phase", "snapshot saved", at="end")
    return report


def pytest_runtest_logreport(report):
    if "e2e" in report.keywords:
        seconds = round(report.duration, 1)
        clock.record("test", report.nodeid, phase=report.when, seconds=seconds, outcome=report.outcome)
