"""A value the fleet check alone would fail is measured again with the rest of the fleet
idle, and the second figure is judged (provision.validate.remeasure). remote.run and the
agent are replaced by stand-ins returning what a node's agent would print (no SSH here)."""

from __future__ import annotations

import json
from pathlib import Path

from provision import remote
from provision.inventory import Cluster, Node, SshTarget
from provision.settings import Settings
from provision.validate import agent_stream, controller, judge, remeasure
from provision.validate.expectations import parse_flat
from provision.validate.records import Measurement

# The testbed's own rule (provision.testbed.inventory_writer): a node fails 4x below the median.
TESTBED = parse_flat({"fleet.warn_drop": 0.2, "fleet.fail_drop": 0.75}, "test")


def disk_node(name: str, write: float, read: float = 2400.0, **kw) -> judge.NodeInput:
    ms = [
        Measurement(name, "disk_seq_write_mibs", write),
        Measurement(name, "disk_seq_read_mibs", read),
        Measurement(name, "cpu_gemm_gflops", 50.0),
    ]
    return judge.NodeInput(name, ms, overrides=TESTBED, **kw)


def test_the_testbeds_stalled_write_is_an_outlier_and_only_that_value():
    # The figures of session 43's failed demo gate: node2 wrote at 73 MiB/s beside 762.
    out = judge.fleet_outliers([disk_node("node1", 762.0), disk_node("node2", 73.06)])
    assert list(out) == ["node2"]
    assert [(m.metric, m.value) for m in out["node2"]] == [("disk_seq_write_mibs", 73.06)]
    assert remeasure.groups(out["node2"]) == {"disk"}


def test_a_floor_or_a_small_gap_is_not_measured_again():
    strict = parse_flat({"disk_seq_write_mibs": 5000, "fleet.fail_drop": 0.75}, "test")
    nodes = [
        judge.NodeInput("a", [Measurement("a", "disk_seq_write_mibs", 700.0)], overrides=strict),
        judge.NodeInput("b", [Measurement("b", "disk_seq_write_mibs", 400.0)], overrides=strict),
    ]
    assert judge.fleet_outliers(nodes) == {}  # both fail their floor; neither is the fleet's outlier
    # The links are the controller's (bisected on their own): never sent back to the agent.
    link = [Measurement("b", "net_gbits", 0.1)]
    assert remeasure.groups(link) == frozenset()


def test_merged_judges_the_second_figure_and_says_the_first():
    first = disk_node("b", 73.06).measurements
    suspects = [first[0]]
    again = [Measurement("b", "disk_seq_write_mibs", 1632.0, detail="O_DIRECT"), Measurement("b", "x", 1.0)]
    got = remeasure.merged(first, suspects, again, "")
    assert [m.value for m in got] == [1632.0, 2400.0, 50.0]  # only the suspect was replaced
    assert got[0].note == f"{remeasure.AGAIN}; first 73.06 with every node at once"
    assert [m.note for m in got[1:]] == ["", ""]
    results = judge.judge([disk_node("a", 762.0), judge.NodeInput("b", got, overrides=TESTBED)])
    (write,) = [f for f in results[1].findings if f.metric == "disk_seq_write_mibs"]
    assert write.verdict == "pass"
    assert write.reason.endswith("first 73.06 with every node at once")  # said even on a pass


def test_a_second_run_without_the_value_keeps_the_first_and_says_why():
    first = disk_node("b", 73.06).measurements
    timed_out = [Measurement("b", "disk_seq_write_mibs", None, not_run="not run: timed out after 45 s")]
    got = remeasure.merged(first, [first[0]], timed_out, "")
    assert got[0].value == 73.06
    assert got[0].note == f"{remeasure.AGAIN}: no value (not run: timed out after 45 s)"
    got = remeasure.merged(first, [first[0]], [], "cannot upload the agent: Connection reset")
    assert got[0].note.endswith("no value (cannot upload the agent: Connection reset)")


def node(name: str) -> Node:
    return Node(
        name,
        SshTarget("127.0.0.1", 22, "root", None, None, "yes"),
        ("nodes",),
        Settings(validate_expect={"fleet.warn_drop": 0.2, "fleet.fail_drop": 0.75}),
    )


WRITE = "disk_seq_write_mibs"


def agent_stream_with(write: float) -> str:
    """An agent's whole output for a disk-only run that measured ``write``."""
    lines = [
        {"type": "start", "agent": agent_stream.AGENT_SCHEMA, "mode": "quick", "deadline_s": 300},
        {"type": "inventory", "hostname": "h", "inventory": {}, "gpus": []},
        {
            "type": "plan",
            "phases": [{"phase": "disk", "budget_s": 45, "metrics": ["disk_seq_write_mibs"], "device": ""}],
        },
        {"type": "phase", "phase": "disk", "state": "start"},
        {"type": "row", "metric": WRITE, "device": "", "value": write, "not_run": "", "detail": ""},
        {"type": "phase", "phase": "disk", "state": "end"},
        {"type": "end"},
    ]
    return "".join(json.dumps(line) + "\n" for line in lines)


def run_with(monkeypatch, writes: dict[str, list[float]]) -> tuple[list, list[tuple[str, str]]]:
    """controller.run over stand-in nodes whose agent runs measure ``writes`` in turn."""
    calls: list[tuple[str, str]] = []

    def run(n, command, timeout=None, conn=None):  # test stand-in for remote.run
        if "base64 -d" in command or command.startswith("rm -f"):
            return remote.CommandResult(n.name, 0, "", "")
        calls.append((n.name, command))
        return remote.CommandResult(n.name, 0, agent_stream_with(writes[n.name].pop(0)), "")

    monkeypatch.setattr(controller.remote, "run", run)
    plan = controller.Plan(groups=frozenset({"disk"}))
    outcome = controller.run(Cluster(Path("inv.py"), (node("node1"), node("node2"))), plan)
    return outcome.results, calls


def finding(results, name: str):
    (r,) = [r for r in results if r.node == name]
    return next(f for f in r.findings if f.metric == "disk_seq_write_mibs"), r.verdict


def test_a_stall_beside_a_neighbour_passes_when_measured_again(monkeypatch):
    results, calls = run_with(monkeypatch, {"node1": [762.0], "node2": [73.06, 1632.0]})
    write, verdict = finding(results, "node2")
    assert (write.value, write.verdict, verdict) == (1632.0, "pass", "pass")
    assert "first 73.06 with every node at once" in write.reason
    names = [name for name, _ in calls]
    assert sorted(names[:2]) == ["node1", "node2"]  # the fleet at once,
    assert names[2:] == ["node2"]  # then node2 alone
    assert " --only disk " in calls[-1][1]  # only the outlying group runs again
    assert finding(results, "node1")[0].value == 762.0  # the other node was not run again


def test_a_slow_disk_is_as_slow_the_second_time_and_fails(monkeypatch):
    results, calls = run_with(monkeypatch, {"node1": [762.0], "node2": [20.0, 19.5]})
    write, verdict = finding(results, "node2")
    assert (write.value, write.verdict, verdict) == (19.5, "fail", "fail")
    assert "below the fleet median" in write.reason
    assert write.reason.endswith(f"{remeasure.AGAIN}; first 20 with every node at once")
    assert len(calls) == 3
