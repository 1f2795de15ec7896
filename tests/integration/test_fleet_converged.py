"""The real `up` and `plan` (pipeline, engine, deploys, operations, facts' parsers) on
simulated copies of a provisioned testbed node (tests/standins/fleet_profiles/
testbed-converged.json): a first `up` writes what is the fleet's own (the training user's
known_hosts of every node, the inventory's training key), a second changes nothing on any
host and `plan` shows nothing to do; a host that stops answering mid-fleet is named.

What makes this worth having: the converged re-run is what a thousand-node fleet runs most
(benchmarks/fleet_scale.py measures it), and a simulation that drifted from the real steps
would fail here as "no captured answer" or as changes on a converged host, not pass.
"""

from __future__ import annotations

import pytest

from tests.standins.fleet_standin import SimulatedFleet, simulated

# The steps a copy of one node can run (fleet_profiles/capture_up.py STEPS), without the
# frameworks step: its wheelhouse is the testbed's real one, which the fast tier lacks.
STEPS = "preflight,base,nvidia,volumes"
DEADLINES = {"connect_timeout_s": 2, "command_timeout_s": 2, "step_timeout_s": 60}


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _up(inv):
    from provision import inventory
    from provision.up import pipeline

    return pipeline.up(inventory.load(inv), pipeline.select(only=STEPS))


def test_a_second_up_on_24_simulated_converged_hosts_changes_nothing_and_plan_agrees(tmp_path, state_dir):
    from provision import inventory
    from provision.up import pipeline

    fleet = SimulatedFleet.spread(24, profile="testbed-converged", latency_s=0.005)
    inv = fleet.write_inventory(tmp_path / "fleet.py", **DEADLINES)
    with simulated(fleet):
        first = _up(inv)
        assert all(not r.failures for r in first.hosts.values()), {n: r.failures for n, r in first.hosts.items()}
        # Only the fleet's own files were written: every host, the same two operations' files.
        written = {path for _, path in fleet.files}
        assert written == {
            "/home/train/.ssh/known_hosts",
            "/home/train/.ssh/id_ed25519",
            "/home/train/.ssh/authorized_keys",
        }
        assert {host for host, _ in fleet.files} == set(fleet.behaviour)
        asked: dict[str, int] = {}
        answer = fleet.answer

        def counting(host: str, command: str):
            if command.startswith("cat /etc/ssh/ssh_host_"):  # base's HostKeys fact
                asked[host] = asked.get(host, 0) + 1
            return answer(host, command)

        fleet.answer = counting  # type: ignore[method-assign]
        second = _up(inv)
        plans = pipeline.plan(inventory.load(inv), pipeline.select(only=STEPS))
    assert set(second.hosts) == set(fleet.behaviour)
    assert {n: (r.changed, r.failures) for n, r in second.hosts.items()} == {n: (0, []) for n in fleet.behaviour}
    assert all(p.reachable and not any(p.steps.values()) for p in plans.values())
    # Every node's host keys are read once a pass, not once per host prepared beside it
    # (engine/per_pass.py): one read a host in the second up, and one in the plan.
    assert asked == {name: 2 for name in fleet.behaviour}
    known_hosts = fleet.files[("node-0007", "/home/train/.ssh/known_hosts")].decode()
    assert len(known_hosts.splitlines()) == 24  # every node of the fleet, by name and address
    assert "node-0023,10.0.0.24 ssh-ed25519 " in known_hosts


def test_a_converged_host_that_fails_is_named_and_the_others_stay_converged(tmp_path, state_dir):
    # The others cannot read the failed host's keys: they keep its known_hosts lines from
    # their own file (base.carried_keys), so nothing changes on them.
    fleet = SimulatedFleet.spread(24, profile="testbed-converged", latency_s=0.005)
    inv = fleet.write_inventory(tmp_path / "fleet.py", **DEADLINES)
    with simulated(fleet):
        _up(inv)
        fleet.behaviour["node-0011"] = "fail"
        second = _up(inv)
    assert second.hosts["node-0011"].failures[0].step == "preflight"
    others = {n: (r.changed, r.failures) for n, r in second.hosts.items() if n != "node-0011"}
    assert others == {n: (0, []) for n in fleet.behaviour if n != "node-0011"}
    kept = fleet.files[("node-0003", "/home/train/.ssh/known_hosts")].decode()
    assert "node-0011,10.0.0.12 ssh-ed25519 " in kept
