"""Staged rollouts: the canary and the waves, the storage host first, where the rollout
stops, and every host reported (those never reached as "not run" with the reason)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.engine import HostResult, RunReport
from provision.errors import InputError
from provision.inventory import Cluster
from provision.up import rollout
from provision.up.rollout import Rollout
from tests.helpers.deploy_facts import node


def fleet(count: int, storage: str | None = None) -> Cluster:
    nodes = [node(f"n{i:02d}", groups=("storage",) if f"n{i:02d}" == storage else ()) for i in range(count)]
    return Cluster(Path("inv.py"), tuple(nodes))


def names(waves) -> list[list[str]]:
    return [[n.name for n in wave] for wave in waves]


def test_unstaged_is_one_wave_of_every_host_in_inventory_order():
    assert names(rollout.waves(list(fleet(4, storage="n02").nodes), Rollout(), first="n02")) == [
        ["n00", "n01", "n02", "n03"]
    ]


def test_canary_then_waves_with_the_storage_host_in_the_canary():
    waves = rollout.waves(list(fleet(7).nodes), Rollout(canary=2, wave_size=2), first="n05")
    assert names(waves) == [["n05", "n00"], ["n01", "n02"], ["n03", "n04"], ["n06"]]


def test_waves_without_a_canary_and_a_canary_without_waves():
    assert names(rollout.waves(list(fleet(5).nodes), Rollout(wave_size=3))) == [["n00", "n01", "n02"], ["n03", "n04"]]
    assert names(rollout.waves(list(fleet(5).nodes), Rollout(canary=1))) == [["n00"], ["n01", "n02", "n03", "n04"]]
    assert names(rollout.waves(list(fleet(2).nodes), Rollout(canary=5))) == [["n00", "n01"]]


class Waves:
    """A stand-in for one wave's `up`: hosts named in ``failing`` fail; records each wave."""

    def __init__(self, failing: set[str]):
        self.failing = failing
        self.seen: list[tuple[list[str], list[str]]] = []  # (hosts run, hosts known)

    def __call__(self, part: Cluster) -> RunReport:
        self.seen.append(([n.name for n in part.nodes], [n.name for n in part.all_nodes]))
        results = {}
        for n in part.nodes:
            results[n.name] = HostResult(n.name)
            if n.name in self.failing:
                results[n.name].fail("base", "apt said no")
        return RunReport(results)


def test_a_failed_canary_stops_the_rollout_and_every_other_host_is_reported_not_run():
    cluster = fleet(6)
    run_wave = Waves(failing={"n00"})
    events: list[tuple[str, str]] = []
    report = rollout.run(cluster, Rollout(canary=2, wave_size=2), run_wave, lambda h, t: events.append((h, t)))
    assert [hosts for hosts, _ in run_wave.seen] == [["n00", "n01"]]
    assert list(report.hosts) == [n.name for n in cluster.nodes]  # every host, in inventory order
    assert report.exit_code == 1
    assert report.hosts["n01"].ok  # the canary host that passed keeps its result
    for name in ("n02", "n03", "n04", "n05"):
        (failure,) = report.hosts[name].failures
        assert failure.step == "rollout"
        assert failure.why == "not run: the canary failed on n00"
    assert ("n00", "rollout: canary (2 hosts)") in events
    assert ("n05", "rollout: not run, the canary failed on n00") in events


def test_each_wave_runs_on_its_hosts_and_still_knows_every_host():
    run_wave = Waves(failing=set())
    report = rollout.run(fleet(5), Rollout(canary=1, wave_size=2), run_wave)
    assert report.exit_code == 0
    assert [hosts for hosts, _ in run_wave.seen] == [["n00"], ["n01", "n02"], ["n03", "n04"]]
    assert all(known == ["n00", "n01", "n02", "n03", "n04"] for _, known in run_wave.seen)


def test_a_wave_over_max_fail_stops_the_rollout_and_one_within_it_does_not():
    # 1 of 4 failed (25 %): within --max-fail 30 %, the rollout goes on; 2 of 4 (50 %) stops it.
    run_wave = Waves(failing={"n01", "n05", "n06"})
    report = rollout.run(fleet(12), Rollout(wave_size=4, max_fail=0.3), run_wave)
    assert [hosts for hosts, _ in run_wave.seen] == [["n00", "n01", "n02", "n03"], ["n04", "n05", "n06", "n07"]]
    why = report.hosts["n08"].failures[0].why
    assert why == "not run: wave 2 of 3: 2 of 4 hosts failed (n05, n06), more than --max-fail 30%"
    assert report.hosts["n07"].ok
    assert not report.hosts["n01"].ok


def test_default_max_fail_zero_stops_at_the_first_failed_host():
    run_wave = Waves(failing={"n03"})
    report = rollout.run(fleet(6), Rollout(wave_size=2), run_wave)
    assert len(run_wave.seen) == 2
    assert [n for n, h in report.hosts.items() if not h.ok] == ["n03", "n04", "n05"]


def test_an_unstaged_run_is_one_call_and_emits_no_rollout_events():
    run_wave = Waves(failing={"n01"})
    events: list[tuple[str, str]] = []
    report = rollout.run(fleet(3), Rollout(), run_wave, lambda h, t: events.append((h, t)))
    assert len(run_wave.seen) == 1
    assert events == []
    assert [h.ok for h in report.hosts.values()] == [True, False, True]


@pytest.mark.parametrize(("text", "share"), [("0", 0.0), ("5%", 0.05), ("0.25", 0.25), ("100%", 1.0)])
def test_max_fail_takes_a_share_or_a_percentage(text, share):
    assert rollout.parse_max_fail(text) == pytest.approx(share)


@pytest.mark.parametrize("bad", ["-1", "150%", "half", "", "1.5", "nan"])
def test_max_fail_outside_0_to_1_is_bad_input(bad):
    with pytest.raises(InputError):
        rollout.parse_max_fail(bad)
