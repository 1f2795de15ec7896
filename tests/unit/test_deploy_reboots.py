"""Reboot decisions: only when needed, batches, never the controller."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from provision import engine
from provision.facts.gpus import Gpus
from provision.facts.probes import RebootState, parse_reboot_state
from provision.inventory import Node, SshTarget
from provision.settings import Settings
from provision.up import reboots
from tests.helpers.deploy_facts import H100, node

NO_GPU = Gpus((), ())


def state(**kw: object) -> RebootState:
    values = {
        "reboot_required": False,
        "loaded_module": None,
        "installed_module": None,
        "smi_version": None,
        "machine_id": "host",
    } | kw
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
    nodes = [
        node("node1"),
        node("node2"),
        Node("@local", SshTarget("@local", 22, None, None, None, "yes"), (), Settings(), {}),
    ]
    probes = {
        "node1": state(reboot_required=True, machine_id="ctrl"),
        "node2": state(reboot_required=True, machine_id="other"),
        "@local": state(reboot_required=True, machine_id="x"),
    }
    gpus = {"node1": Gpus((H100,), ()), "node2": NO_GPU, "@local": NO_GPU}
    decision = reboots.plan(nodes, probes, gpus, {"node1": True, "node2": True, "@local": True}, "ctrl")
    assert decision.reboot == {"node2": "packages changed and a reboot is required"}
    assert "this machine's" in decision.refused["node1"]
    assert "@local" in decision.refused["@local"]


def test_reboot_probe_parses() -> None:
    got = parse_reboot_state(["reboot_required=1", "loaded=", "installed=580.95.05", "smi=580.95.05", "machine_id=abc"])
    assert got == state(reboot_required=True, installed_module="580.95.05", smi_version="580.95.05", machine_id="abc")


# --- reboot_where_needed, with test stand-ins for the hosts ------------------------------
# No host exists here: gather_facts and the reboot step are replaced by stand-ins that
# answer from the states below and record which hosts were asked and rebooted together.

MISMATCH = state(loaded_module="570.195.03", installed_module="580.95.05")  # needs a reboot
DRIVER_UP = state(loaded_module="580.95.05", installed_module="580.95.05", smi_version="580.95.05")


class StandInHosts:
    """Test stand-in for the fleet: reboot-probe answers before and after a reboot, and a
    record of each batch the stand-in reboot step was handed."""

    def __init__(
        self,
        before: dict[str, RebootState],
        after: dict[str, RebootState] | None = None,
        slurm: dict[str, str] | None = None,
    ):
        self.before, self.after = before, after or {}
        self.slurm = slurm or {}  # host -> its reason in Slurm (SlurmDrainReason)
        self.rebooted: set[str] = set()
        self.batches: list[list[str]] = []  # host names per reboot call, in order
        self.asked: list[list[str]] = []  # host names per gather_facts call
        self.resumed: list[list[str]] = []  # host names per resume call, in order

    def stand_in_gather_facts(
        self, nodes: list, wanted: dict, on_event: Callable = lambda h, t: None
    ) -> engine.FactsResult:
        self.asked.append([n.name for n in nodes])
        facts = {}
        for n in nodes:
            probe = self.after.get(n.name, DRIVER_UP) if n.name in self.rebooted else self.before[n.name]
            facts[n.name] = {"probe": probe, "gpus": Gpus((H100,), ()), "slurm": self.slurm.get(n.name)}
        return engine.FactsResult(facts, {})

    def stand_in_reboot_step(self, step: engine.Step, nodes: list, results: dict, on_event: Callable) -> None:
        if step is reboots.RESUME_STEP:  # back in Slurm after the driver check
            self.resumed.append([n.name for n in nodes])
            return
        assert step is reboots.REBOOT_STEP
        self.batches.append([n.name for n in nodes])
        self.rebooted.update(n.name for n in nodes)


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Callable[..., StandInHosts]:
    def install(
        before: dict[str, RebootState], after: dict[str, RebootState] | None = None, slurm: dict[str, str] | None = None
    ) -> StandInHosts:
        hosts = StandInHosts(before, after, slurm)
        monkeypatch.setattr(engine, "gather_facts", hosts.stand_in_gather_facts)
        monkeypatch.setattr(engine, "run_step", hosts.stand_in_reboot_step)
        return hosts

    return install


def results_after_nvidia(*names: str, without_nvidia: tuple[str, ...] = ()) -> dict[str, engine.HostResult]:
    return {
        n: engine.HostResult(n, steps=["preflight", "base"] + ([] if n in without_nvidia else ["nvidia"]))
        for n in names
    }


def test_only_hosts_the_nvidia_step_ran_on_this_run_are_rebooted(stand_in) -> None:
    # node2 has nvidia: skip (or the run had --skip nvidia); node3's nvidia step skipped
    # itself (engine.skip: it is not in the host's steps). Both have a mismatched module,
    # say from an admin's own driver upgrade.
    hosts = stand_in({"node1": MISMATCH, "node2": MISMATCH, "node3": MISMATCH})
    results = results_after_nvidia("node1", "node2", "node3", without_nvidia=("node2", "node3"))
    results["node3"].notes.append("nvidia: skipped (no NVIDIA GPU on the PCI bus)")
    reboots.reboot_where_needed([node("node1"), node("node2"), node("node3")], results, {}, batch=None)
    assert hosts.asked[0] == ["node1"]
    assert hosts.batches == [["node1"]]
    assert [n for n, r in results.items() if r.rebooted] == ["node1"]
    assert all(r.ok for r in results.values())


def test_no_more_than_the_batch_size_reboot_at_once_and_every_one_is_verified(stand_in) -> None:
    names = [f"node{i}" for i in range(1, 6)]
    hosts = stand_in(dict.fromkeys(names, MISMATCH))
    results = results_after_nvidia(*names)
    reboots.reboot_where_needed([node(n) for n in names], results, {}, batch=2)
    assert hosts.batches == [["node1", "node2"], ["node3", "node4"], ["node5"]]
    assert hosts.asked[1:] == hosts.batches  # each batch's driver is checked before the next reboots
    assert hosts.resumed == hosts.batches  # each batch back in Slurm once checked, before the next drains
    assert all(r.rebooted and r.ok for r in results.values())


def test_a_batch_that_fails_its_driver_check_stops_the_later_batches(stand_in) -> None:
    names = [f"node{i}" for i in range(1, 6)]
    hosts = stand_in(dict.fromkeys(names, MISMATCH), after={"node2": state(installed_module="580.95.05")})
    results = results_after_nvidia(*names)
    reboots.reboot_where_needed([node(n) for n in names], results, {}, batch=2)
    assert hosts.batches == [["node1", "node2"]]
    assert hosts.resumed == [["node1"]]  # node2 failed its driver check: it stays drained
    assert results["node1"].ok
    assert results["node1"].rebooted
    assert [str(f) for f in results["node2"].failures] == [
        "reboot: nvidia-smi does not answer after the reboot (driver 580.* expected)"
    ]
    for name in ("node3", "node4", "node5"):
        assert not results[name].rebooted
        assert [str(f) for f in results[name].failures] == [
            "reboot: not rebooted because an earlier batch failed (node2); it still needs one "
            "(kernel runs NVIDIA module 570.195.03, 580.95.05 is installed): fix those hosts and re-run"
        ]


def test_a_reboot_drain_left_by_an_earlier_run_is_resumed_where_no_reboot_is_needed_now(stand_in) -> None:
    # node1 was drained for a reboot that failed (or an admin rebooted it since): it runs the
    # installed driver now. node2 is drained by someone else, node3 needs its reboot still.
    hosts = stand_in(
        {"node1": DRIVER_UP, "node2": DRIVER_UP, "node3": MISMATCH},
        slurm={"node1": "provision: reboot: up reboots it", "node2": "admin: fan", "node3": "none"},
    )
    results = results_after_nvidia("node1", "node2", "node3")
    reboots.reboot_where_needed([node("node1"), node("node2"), node("node3")], results, {}, batch=None)
    assert hosts.resumed == [["node1"], ["node3"]]  # the leftover first, then node3 after its reboot
    assert hosts.batches == [["node3"]]
    assert any("earlier run's reboot drain" in n for n in results["node1"].notes)


def test_a_reboot_drain_stays_on_a_host_that_needs_a_reboot_it_may_not_get_here(stand_in, monkeypatch) -> None:
    # node1 is the controller's own machine: its driver changed (drained first by the nvidia
    # step) and it needs a reboot provision refuses to do. Resuming it would put jobs on a
    # node whose libraries and module disagree.
    monkeypatch.setattr(reboots, "controller_machine_id", lambda: "ctrl")
    mine = state(loaded_module="570.195.03", installed_module="580.95.05", machine_id="ctrl")
    hosts = stand_in({"node1": mine}, slurm={"node1": "provision: reboot: up reboots it"})
    results = results_after_nvidia("node1")
    reboots.reboot_where_needed([node("node1")], results, {}, batch=None)
    assert hosts.resumed == []
    assert hosts.batches == []
    assert any("reboot it by hand" in n for n in results["node1"].notes)
