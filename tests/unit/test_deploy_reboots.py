"""Reboot decisions: only when needed, batches, never the controller."""

from __future__ import annotations

from provision import reboots
from provision.deploys.probes import RebootState, parse_reboot_state
from provision.facts.gpus import Gpus
from provision.inventory import Node, SshTarget
from provision.settings import Settings
from tests.helpers.deploy_facts import H100, node

NO_GPU = Gpus((), ())


def state(**kw: object) -> RebootState:
    values = {"reboot_required": False, "loaded_module": None, "installed_module": None,
              "smi_version": None, "machine_id": "host"} | kw
    return RebootState(**values)  # type: ignore[arg-type]


def test_reboot_only_when_packages_changed_and_asked_for_one() -> None:
    assert reboots.needs_reboot(state(reboot_required=True), changed=True, has_gpu=False)
    assert reboots.needs_reboot(state(reboot_required=True), changed=False, has_gpu=False) is None
    assert reboots.needs_reboot(state(), changed=True, has_gpu=False) is None


def test_module_version_mismatch_needs_a_reboot() -> None:
    why = reboots.needs_reboot(state(loaded_module="570.195.03", installed_module="580.95.05"), False, True)
    assert why == "kernel runs NVIDIA module 570.195.03, 580.95.05 is installed"
    assert reboots.needs_reboot(state(installed_module="580.95.05"), False, has_gpu=True)
    assert reboots.needs_reboot(state(installed_module="580.95.05"), False, has_gpu=False) is None


def test_batches_default_to_a_quarter_at_least_one() -> None:
    assert reboots.batch_size(3, None) == 1
    assert reboots.batch_size(16, None) == 4
    assert reboots.batch_size(16, 2) == 2
    assert reboots.batches(["a", "b", "c"], 2) == [["a", "b"], ["c"]]


def test_never_reboots_the_controller() -> None:
    nodes = [node("node1"), node("node2"), Node("@local", SshTarget("@local", 22, None, None, None, "yes"),
                                                 (), Settings(), {})]
    probes = {"node1": state(reboot_required=True, machine_id="ctrl"),
              "node2": state(reboot_required=True, machine_id="other"),
              "@local": state(reboot_required=True, machine_id="x")}
    gpus = {"node1": Gpus((H100,), ()), "node2": NO_GPU, "@local": NO_GPU}
    decision = reboots.plan(nodes, probes, gpus, {"node1": True, "node2": True, "@local": True}, "ctrl")
    assert decision.reboot == {"node2": "packages changed and a reboot is required"}
    assert "this machine's" in decision.refused["node1"] and "@local" in decision.refused["@local"]


def test_reboot_probe_parses() -> None:
    got = parse_reboot_state(["reboot_required=1", "loaded=", "installed=580.95.05", "smi=580.95.05",
                              "machine_id=abc"])
    assert got == state(reboot_required=True, installed_module="580.95.05", smi_version="580.95.05",
                        machine_id="abc")
