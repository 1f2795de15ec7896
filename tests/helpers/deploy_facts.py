"""Captured-fact hosts for the deploy tests: an OsInfo from a real os-release file, and
a fact answerer, and plan_with_facts, which prepares a deploy against them (pyinfra's "fake state")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from provision.engine import PlannedOp, RunContext, Step
from provision.engine.plan import changing_ops
from provision.engine.pyinfra_state import new_state
from provision.facts.gpus import Gpus, PciDevice
from provision.facts.probes import HostProbe, SecureBoot, parse_reboot_state
from provision.facts.system import OsInfo, parse_os_release
from provision.inventory import Cluster, Node, SshTarget
from provision.settings import Settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

KERNELS = {
    "ubuntu-22.04-jammy": "5.15.0-185-generic",
    "ubuntu-24.04.3-noble": "6.8.0-45-generic",
    "debian-12-bookworm": "6.1.0-18-amd64",
}

# An H100 SXM5 as lspci names it (device id 2330, as in the H100 capture's header).
H100 = PciDevice("0000:17:00.0", "0302", "2330", "NVIDIA Corporation GH100 [H100 SXM5 80GB]")
NVSWITCH = PciDevice("0000:05:00.0", "0680", "22a3", "NVIDIA Corporation Device")
# A Tesla P100 (Pascal, device 15f8): older than Turing, proprietary modules only.
P100 = PciDevice("0000:04:00.0", "0302", "15f8", "NVIDIA Corporation GP100GL [Tesla P100 PCIe 16GB]")


def os_info(fixture: str) -> OsInfo:
    release = parse_os_release((FIXTURES / f"os-release_{fixture}").read_text())
    return OsInfo(
        release["ID"],
        release["VERSION_ID"],
        release.get("VERSION_CODENAME"),
        release["PRETTY_NAME"],
        KERNELS[fixture],
        "node1",
        "x86_64",
    )


def probe(**changes: Any) -> HostProbe:
    base = HostProbe(
        root_free_gb=100.0,
        secure_boot=SecureBoot(False, "SecureBoot disabled"),
        apt_locks_held=(),
        lock_holders="",
        reboot_pending=False,
        machine_id="abc",
        headers_candidate="5.15.0-185.195",
        candidates={},
    )
    return replace(base, **changes)


def node(name: str = "node1", groups: tuple[str, ...] = (), **settings: Any) -> Node:
    return Node(name, SshTarget("10.0.0.1", 22, "root", None, None, "yes"), groups, Settings(**settings), {})


class FakeHost:
    """Answers facts by class name; anything not given gets the fact's empty answer."""

    def __init__(self, **facts: Any):
        self.facts = {
            "NvidiaDevices": Gpus((), ()),
            "DebPackages": {},
            "PipPackages": {},
            "AptHolds": ({}, set()),
            "HostKeys": ["ssh-ed25519 AAAAC3Nz"],
            "BlockDevices": [],
            "Probe": probe(),
            "RebootProbe": parse_reboot_state([]),
        } | facts
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, cls: type, kwargs: dict[str, Any]) -> Any:
        self.asked.append((cls.__name__, kwargs))
        if cls.__name__ in self.facts:
            return self.facts[cls.__name__]
        return cls().default()


def plan_with_facts(
    step: Step,
    node: Node,
    facts: Callable[[type, dict[str, Any]], Any],
    cluster: Cluster | None = None,
    steps: list[Step] | None = None,
    planning: bool = False,
) -> tuple[list[PlannedOp], list[str]]:
    """Prepare one step for one node against given facts instead of a live host: pyinfra's
    "fake state". Returns the operations that would change and the refusals. Nothing is
    contacted; ``facts(FactClass, kwargs)`` answers every fact the deploy reads. ``steps``
    are the steps of the run it pretends to be part of (default: this step alone);
    ``planning``: that run is `provision plan`'s (earlier steps' changes not made).

    This is how deploys are tested on captured facts (an Ubuntu host, a GPU host): the real
    engine prepares the deploy, and only pyinfra's Host.get_fact is answered from the test.
    """
    from unittest import mock

    from pyinfra.api.deploy import add_deploy
    from pyinfra.api.host import Host

    run = RunContext(
        cluster or Cluster(Path("fake-inventory.py"), (node,)),
        tuple(s.name for s in steps or [step]),
        planning=planning,
    )
    state = new_state([node], run=run)

    def get_fact(self: Any, cls: type, *args: Any, **kwargs: Any) -> Any:
        return facts(cls, kwargs)

    with mock.patch.object(Host, "get_fact", get_fact):
        host = state.inventory.get_host(node.name)
        add_deploy(state, step.deploy, host=host)
        planned = changing_ops(state, host, run)
    return planned, run.take_refusals(node.name)
