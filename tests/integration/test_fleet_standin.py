"""200 simulated hosts (tests/standins/fleet_standin) through the real CLI, inventory,
runner and facts' parsers: 5 % fail (half refuse the connection, half fail every
command) and 1 % hang. Every host is reported, the failing and hung ones are named with
why, and the run ends within the deadlines the inventory's settings give.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.standins.fleet_standin import FleetShares, SimulatedFleet, simulated

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
    for name in fleet.named("fail"):
        assert down[name] == "fact os: the command failed on the host"
    for name in fleet.named("hang"):
        assert down[name] == "timed out in fact os after 2 s"
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
        assert down[name] == "timed out in fact os after 2 s"
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
    assert "timed out in fact os after 2 s" in flat
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
    results = remote.on_all(nodes, lambda n: remote.run(n, "cat /proc/meminfo", timeout=2))
    took = time.monotonic() - start
    assert set(results) == set(fleet.behaviour)
    exited = {name: r.exited for name, r in results.items()}
    assert {n for n, code in exited.items() if code == 0} == fleet.named("ok")
    assert {n for n, code in exited.items() if code == 1} == fleet.named("fail")
    assert {n for n, code in exited.items() if code == -1} == fleet.named("refuse")
    assert {n for n, code in exited.items() if code == remote.TIMED_OUT} == fleet.named("hang")
    assert all("MemTotal:" in results[n].stdout for n in fleet.named("ok"))
    assert all("Connection refused" in results[n].stderr for n in fleet.named("refuse"))
    assert took < DEADLINES["command_timeout_s"] + SLACK_S
