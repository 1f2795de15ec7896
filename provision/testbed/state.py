"""The state file of one testbed: every node, the files it owns and the pids the testbed
started. `down` and `status` work from this file alone, so nothing is ever found by
name. It is rewritten atomically after every change, so a crash halfway through `up`
still leaves a record that `down` can clean up from."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provision.errors import ProvisionError
from provision.state import write_atomic

STATE_FILE = "state.json"


@dataclass
class NodeRecord:
    """One node of the testbed, as `up` made it."""

    name: str  # inventory name and hostname, "node1"
    index: int  # 1-based position; decides addresses and MACs
    ssh_port: int  # loopback port forwarded to the guest's sshd
    cluster_address: str  # eth1 address on the private cluster network
    memory_mb: int  # guest RAM
    cpus: int  # guest vCPUs
    serials: list[str]  # data disk serials, in order
    disk_bps_total: int | None = None  # data disk throttle in bytes/s; None: unlimited
    pid: int | None = None  # qemu's pid from its pidfile, when started
    running: bool = False  # filled in by status(); not trusted from the file

    @property
    def data_disks(self) -> list[str]:
        """The data disks as the guest sees them, by stable id."""
        return [f"/dev/disk/by-id/virtio-{serial}" for serial in self.serials]


@dataclass
class TestbedState:
    """The whole testbed."""

    __test__ = False  # not a pytest test class, despite its name
    image: str  # base image folder (its name carries the recipe hash)
    image_label: str  # the base image's root filesystem label
    accel: str  # "kvm" or "tcg", decided once for this testbed
    nodes: list[NodeRecord] = field(default_factory=list)  # in index order
    vde_pid: int | None = None  # the cluster switch's pid
    inventory_path: str | None = None  # the inventory file `up` wrote

    def node(self, name: str) -> NodeRecord:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)


def load(state_dir: Path) -> TestbedState | None:
    """The recorded state, or None when no testbed was brought up in state_dir."""
    path = state_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        raw: dict[str, Any] = json.loads(path.read_text())
        nodes = [NodeRecord(**n) for n in raw.pop("nodes", [])]
        return TestbedState(nodes=nodes, **raw)
    except (OSError, ValueError, TypeError, AttributeError) as e:  # not JSON, or not this version's records
        raise ProvisionError(
            f"{path} is not a testbed's state ({type(e).__name__}: {e}); stop its VMs by hand if any run, "
            "then remove the directory"
        ) from None


def save(state_dir: Path, state: TestbedState) -> None:
    """Write the state whole or not at all (provision.state.write_atomic)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    data = asdict(state)
    for node in data["nodes"]:
        node.pop("running", None)
    write_atomic(state_dir / STATE_FILE, json.dumps(data, indent=2) + "\n")
