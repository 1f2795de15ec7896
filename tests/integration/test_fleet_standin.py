"""200 simulated hosts (tests/standins/fleet_standin) through the real CLI, inventory,
runner and facts' parsers: 5 % fail (half refuse the connection, half fail every
command) and 1 % hang. Every host is reported, the failing and hung ones are named with
why, and the run ends within the deadlines the inventory's settings give.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.standins.fleet_standin import FleetShares, SimulatedFleet, fact_only_step, simulated

COUNT = 200
SHARES = FleetShares(fail=0.025, refuse=0.025, hang=0.01)
DEADLINES = {"connect_timeout_s": 2, "command_timeout_s": 2, "step_timeout_s": 10}
# The slowest host's time: a connect, one fact's command deadline, then the pass's own
# overheads; the slack is for a loaded 2-core CI machine, not for the hosts.
SLACK_S = 15


@pytest.fixture
def fleet(tmp_path):
    fleet = SimulatedFleet.spread(COUNT, SHARES, latency_s=0.01)
    with simulated(fleet):
        yield fleet, fleet.write_inventory(tmp_path / "fleet.py", **DEADLINES)


def _timed(cli, *args):
    start = time.monotonic()
    result = cli(*args)
    return result, time.monotonic() - start


def test_facts_on_200_simulated_hosts_reports_every_host_and_names_the_failing_and_hung(fleet, cli):
    fleet, inv = fleet
    result, took = _timed(cli, "facts", str(inv), "--json")
    assert result.code == 1, result.err
    hosts = {h["name"]: h for h in json.loads(result.out)["hosts"]}
    assert set(hosts) == set(fleet.behaviour)
    down = {name: h["error"] for name, h in hosts.items() if not h["reachable"]}
    assert set(down) == fleet.named("fail") | fleet.named("refuse") | fleet.named("hang")
    assert len(down) == 12  # 5 failing, 5 refusing, 2 hung
    for name in fleet.named("refuse"):
        assert "Connection refused" in down[name]
    # The six facts are one command a host (engine/fact_batch.py): a host that fails or
    # hangs fails or hangs them all.
    facts = "facts os, cpu, memory, block_devices, nics, gpus"
    for name in fleet.named("fail"):
        assert down[name] == f"{facts}: the command failed on the host"
    for name in fleet.named("hang"):
        assert down[name] == f"timed out in {facts} after 2 s"
    assert all(h["memory_bytes"] > 0 and h["cpu"]["threads"] >= 1 for h in hosts.values() if h["reachable"])
    assert took < DEADLINES["connect_timeout_s"] + DEADLINES["command_timeout_s"] + SLACK_S


def test_status_on_200_simulated_hosts_lists_every_host_and_names_the_unreachable(fleet, cli):
    fleet, inv = fleet
    result, took = _timed(cli, "status", str(inv), "--json")
    assert result.code == 1, result.err
    report = json.loads(result.out)
    assert report["ok"] is False
    hosts = {h["name"]: h for h in report["hosts"]}
    assert set(hosts) == set(fleet.behaviour)
    down = {name: h["error"] for name, h in hosts.items() if not h["reachable"]}
    assert set(down) == fleet.named("fail") | fleet.named("refuse") | fleet.named("hang")
    for name in fleet.named("hang"):
        assert down[name] == "timed out in facts os, stack after 2 s"
    assert took < DEADLINES["connect_timeout_s"] + DEADLINES["command_timeout_s"] + SLACK_S
    summary = report["summary"]
    # The stand-in's captured host has no framework venv: every reachable host drifts alike.
    assert (summary["hosts"], summary["reachable"], summary["unreachable"]) == (200, 188, 12)
    assert (summary["drifted"], summary["reboot_pending"], summary["mounts_not_ok"]) == (188, 0, 0)
    assert summary["seen"]["os"] == [{"value": "Debian GNU/Linux 12 (bookworm)", "hosts": 188}]


def test_status_table_on_200_simulated_hosts_is_a_summary_and_its_exceptions(fleet, cli):
    fleet, inv = fleet
    result = cli("status", str(inv))
    assert result.code == 1, result.err
    flat = " ".join(result.out.split())
    assert "200 hosts, 188 reachable, 12 unreachable, 188 drifted" in flat
    assert "Debian GNU/Linux 12 (bookworm) x188" in flat
    for name in fleet.named("fail") | fleet.named("refuse") | fleet.named("hang"):
        assert name in flat  # each unreachable host named, beside its why
    assert "Connection" in flat  # the why, wrapped in its cell at 80 columns
    assert "refused" in flat
    assert "timed out in facts os, stack" in flat  # "after 2 s" wraps to the cell's next line
    assert "│ 2 │ node-0002, node-0101 │" in flat
    # The 188 hosts that answered share one drift per package: a row for each, their names
    # in ranges, not a row per host.
    assert "torch 2.13.0 not installed 188" in " ".join(result.out.replace("│", " ").split())
    assert "node-0050" not in flat  # inside node-[0042-0079]
    assert "fleet status" not in flat  # the per-host table is left to --all
    assert len(result.out.splitlines()) < 80


def test_a_host_whose_connection_never_answers_is_reported_at_the_connect_deadline(tmp_path, cli):
    fleet = SimulatedFleet({"node-0000": "ok", "node-0001": "blackhole"}, latency_s=0.01)
    with simulated(fleet):
        inv = fleet.write_inventory(tmp_path / "fleet.py", **DEADLINES)
        result, took = _timed(cli, "facts", str(inv), "--json")
    hosts = {h["name"]: h for h in json.loads(result.out)["hosts"]}
    assert hosts["node-0000"]["reachable"] is True
    assert "timed out" in hosts["node-0001"]["error"]
    assert DEADLINES["connect_timeout_s"] <= took < DEADLINES["connect_timeout_s"] + SLACK_S


def test_the_fabric_side_runs_on_200_simulated_hosts_and_names_the_failing_and_hung(fleet):
    from provision import inventory, remote

    fleet, inv = fleet
    nodes = inventory.load(inv).nodes
    start = time.monotonic()
    os_release = "cat /etc/os-release; echo '---'; uname -r; uname -m; hostname"  # captured (the Os fact)
    results = remote.on_all(nodes, lambda n: remote.run(n, os_release, timeout=2))
    took = time.monotonic() - start
    assert set(results) == set(fleet.behaviour)
    exited = {name: r.exited for name, r in results.items()}
    assert {n for n, code in exited.items() if code == 0} == fleet.named("ok")
    assert {n for n, code in exited.items() if code == 1} == fleet.named("fail")
    assert {n for n, code in exited.items() if code == -1} == fleet.named("refuse")
    assert {n for n, code in exited.items() if code == remote.TIMED_OUT} == fleet.named("hang")
    assert all("VERSION_ID=" in results[n].stdout for n in fleet.named("ok"))
    assert all("Connection refused" in results[n].stderr for n in fleet.named("refuse"))
    assert took < DEADLINES["command_timeout_s"] + SLACK_S


@pytest.mark.parametrize(
    ("rollout", "waves_run", "not_run"),
    [
        # node-0000 is one of the failing hosts (spread from the first): the canary stops it all.
        ({"canary": 5}, 1, COUNT - 5),
        # 40-host waves hold 1 to 3 failing hosts (2.5 % to 7.5 %): within 10 %, every wave runs.
        ({"wave_size": 40, "max_fail": 0.10}, 5, 0),
        # ... and over 0 %: the first wave stops the rollout.
        ({"wave_size": 40}, 1, COUNT - 40),
    ],
    ids=["failed-canary", "waves-within-max-fail", "first-wave-over-max-fail"],
)
def test_a_staged_rollout_on_200_simulated_hosts_stops_where_it_should_and_reports_every_host(
    fleet, rollout, waves_run, not_run
):
    from provision import inventory
    from provision.up import pipeline
    from provision.up.rollout import Rollout

    fleet, inv = fleet
    events: list[tuple[str, str]] = []
    report = pipeline.up(
        inventory.load(inv), [fact_only_step()], on_event=lambda h, t: events.append((h, t)), rollout=Rollout(**rollout)
    )
    assert set(report.hosts) == set(fleet.behaviour)  # every host reported
    skipped = {n for n, h in report.hosts.items() if any(f.step == "rollout" for f in h.failures)}
    assert len(skipped) == not_run
    started = {h for h, t in events if t == "standin: started"}
    assert started.isdisjoint(skipped)  # a host the rollout did not reach was never contacted
    assert len(started) == COUNT - not_run
    waves = {t for _, t in events if t.startswith("rollout: ") and "not run" not in t}
    assert len(waves) == waves_run
    bad = fleet.named("fail") | fleet.named("refuse") | fleet.named("hang")
    ran = set(report.hosts) - skipped
    assert {n for n in ran if not report.hosts[n].ok} == bad & ran  # exactly the misbehaving hosts failed


def test_a_host_whose_fact_fails_or_hangs_in_a_step_fails_with_the_fact_named_not_done(fleet):
    # pyinfra answers a failed fact with its default and drops the host quietly: the host
    # must not come out "done, 0 changed".
    from provision import inventory
    from provision.up import pipeline

    fleet, inv = fleet
    events: list[tuple[str, str]] = []
    report = pipeline.up(inventory.load(inv), [fact_only_step()], on_event=lambda h, t: events.append((h, t)))
    failures = {n: [str(f) for f in h.failures] for n, h in report.hosts.items() if not h.ok}
    for name in fleet.named("fail"):
        assert failures[name] == [
            "standin: fact Os failed on the host (its command failed, or printed what it cannot read)"
        ]
        assert (name, "standin: FAILED") in events
    for name in fleet.named("hang"):
        assert failures[name] == [f"standin: timed out in fact Os after {DEADLINES['command_timeout_s']} s"]
    assert set(failures) == fleet.named("fail") | fleet.named("refuse") | fleet.named("hang")
    assert all("standin" in h.steps for n, h in report.hosts.items() if n not in failures)


def test_hosts_frozen_after_login_are_cut_off_at_their_command_deadline_not_the_gathers(tmp_path):
    # A frozen host answers nothing, not even the request to open the channel a command
    # runs in, which pyinfra's _timeout does not bound: gather_facts cuts each host off at
    # its own command deadline (plus a grace), not at the whole gather's step deadline.
    from provision import engine, inventory
    from provision.engine.facts import CHANNEL_GRACE_S
    from provision.facts.host import HOST_FACTS

    fleet = SimulatedFleet.spread(20, FleetShares(freeze=0.1), latency_s=0.01)
    deadlines = {"connect_timeout_s": 2, "command_timeout_s": 2, "step_timeout_s": 600}
    with simulated(fleet):
        inv = fleet.write_inventory(tmp_path / "fleet.py", **deadlines)
        start = time.monotonic()
        result = engine.gather_facts(list(inventory.load(inv).nodes), HOST_FACTS)
        took = time.monotonic() - start
    frozen = fleet.named("freeze")
    assert len(frozen) == 2
    assert set(result.failed) == frozen
    for name in frozen:
        assert result.failed[name] == "timed out in facts os, cpu, memory, block_devices, nics, gpus after 2 s"
    assert set(result.facts) == set(fleet.behaviour) - frozen
    # Its deadline, not the gather's 600 s: the margin is the disconnect's bound and CI's load.
    assert took < deadlines["command_timeout_s"] + CHANNEL_GRACE_S + 30 + SLACK_S


def test_the_last_host_left_that_times_out_is_reported_timed_out_not_as_no_hosts_remaining(tmp_path):
    """One host refuses the connection, the other connects and hangs: pyinfra drops the
    hung one, its last active host, by raising "No hosts remaining!" in that host's own
    fact call. Its row says it timed out, as any hung host's does (seen in the freeze drill:
    status named the host that answered slowly "PyinfraError: No hosts remaining!")."""
    from provision import engine, inventory
    from provision.facts.host import HOST_FACTS

    fleet = SimulatedFleet({"node-0000": "refuse", "node-0001": "hang"}, latency_s=0.01)
    with simulated(fleet):
        inv = fleet.write_inventory(tmp_path / "fleet.py", connect_timeout_s=2, command_timeout_s=2)
        result = engine.gather_facts(list(inventory.load(inv).nodes), HOST_FACTS)
    assert "Connection refused" in result.failed["node-0000"]
    assert result.failed["node-0001"] == "timed out in facts os, cpu, memory, block_devices, nics, gpus after 2 s"
    assert result.facts == {}


@pytest.mark.parametrize(("parallel", "most"), [(7, 7), (0, 40)])
def test_the_parallel_setting_bounds_the_hosts_worked_on_at_once(tmp_path, cli, parallel, most):
    """parallel = 7: never more than 7 of 60 hosts connecting or answering at one moment,
    and every host still answers. Waiting its turn costs a host none of its deadlines: the
    queue (9 rounds of a 0.3 s connect and a 0.3 s answer) outlasts the 2 s connect and
    command deadlines. 0 is pyinfra's own choice: 20 per controller core (the test pins the
    count of cores it sees), here 40 of 60."""
    from unittest import mock

    fleet = SimulatedFleet.spread(60, latency_s=0.3)
    with simulated(fleet), mock.patch("pyinfra.api.state.cpu_count", return_value=2):
        # The whole gather's deadline (step_timeout_s) well above the queue's 5.4 s, so only
        # the per-host deadlines (2 s) are under test, also on a loaded machine.
        deadlines = DEADLINES | {"step_timeout_s": 60}
        inv = fleet.write_inventory(tmp_path / "fleet.py", parallel=parallel, **deadlines)
        result = cli("facts", str(inv), "--json")
    assert result.code == 0, result.err
    assert len(json.loads(result.out)["hosts"]) == 60
    assert fleet.most_busy == most
