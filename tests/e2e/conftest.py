"""The shared end-to-end testbed: one 2-node qemu cluster for the whole session.

Every e2e test (testbed, provision up, storage, validate, train) uses the same VMs:
booting and provisioning them once is what keeps the suite inside its time budget
(docs/ARCHITECTURE.md). The testbed lives in a temporary state dir with its own inventory file
and is taken down at the end of the session; the debootstrapped base image stays in
the user's image cache (~/.cache/provision/images) so the next run starts from it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from provision.testbed import NodeRecord, Testbed
from tests.e2e import clock

NODES = 2  # node1 is the storage node
DISKS = 2  # data disks per node: /dev/disk/by-id/virtio-NVME-<node>-<k>


@dataclass
class SharedTestbed:
    """What the shared fixture hands to tests."""

    testbed: Testbed  # the library handle (status, stop_node, start_node, throttle, ssh_argv)
    inventory_path: Path  # the pyinfra inventory `up` wrote for these VMs
    nodes: list[NodeRecord]  # node records as `up` returned them


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedTestbed]:
    root = tmp_path_factory.mktemp("testbed")
    tb = Testbed(root / "state", inventory_path=root / "inventories" / "testbed.py", progress=clock.testbed_progress)
    try:
        clock.record("phase", "testbed up", at="start")
        nodes = tb.up(nodes=NODES, disks=DISKS)
        clock.record("phase", "testbed up", at="end")
        yield SharedTestbed(tb, tb.inventory_path, nodes)
    finally:
        tb.down()


# --- provisioning (owner: `provision up`) ----------------------------------------------


@pytest.fixture(scope="session")
def provisioned(testbed: SharedTestbed):
    """`provision up` once on the shared testbed, all steps (nvidia skips itself: no GPU),
    frameworks from the CPU-torch wheelhouse the testbed inventory names. Returns the
    RunReport; tests assert on it."""
    from provision import inventory
    from provision.up import pipeline

    cluster = inventory.load(testbed.inventory_path)
    clock.record("phase", "shared up", at="start")
    report = pipeline.up(cluster, pipeline.select(), on_event=clock.up_events("shared up"))
    clock.record("phase", "shared up", at="end")
    return report


def pytest_runtest_logreport(report):
    if "e2e" in report.keywords:
        seconds = round(report.duration, 1)
        clock.record("test", report.nodeid, phase=report.when, seconds=seconds, outcome=report.outcome)
