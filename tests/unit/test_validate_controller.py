"""The controller keeps what a killed agent sent, says why it stopped, and never calls a node
that answered SSH unreachable. remote.run is replaced by a stand-in returning what a node
would (no SSH here)."""

from __future__ import annotations

import json
from pathlib import Path

from provision import remote
from provision.inventory import Cluster, Node, SshTarget
from provision.settings import Settings
from provision.validate import agent_stream, controller, netrun


def node(name: str) -> Node:
    return Node(name, SshTarget("127.0.0.1", 22, "root", None, None, "yes"), ("nodes",), Settings())


def cut_off_stream() -> str:
    """An agent killed by timeout(1) in its disk phase: cpu finished, disk half done."""
    plan = [
        {"phase": "cpu", "budget_s": 30, "metrics": ["cpu_gemm_gflops"], "device": ""},
        {"phase": "disk", "budget_s": 45, "metrics": ["disk_seq_write_mibs", "disk_seq_read_mibs"], "device": ""},
    ]
    lines = [
        {"type": "start", "agent": agent_stream.AGENT_SCHEMA, "mode": "quick", "deadline_s": 480},
        {"type": "inventory", "hostname": "a", "inventory": {}, "gpus": []},
        {"type": "plan", "phases": plan},
        {"type": "phase", "phase": "cpu", "state": "start"},
        {"type": "row", "metric": "cpu_gemm_gflops", "device": "", "value": 2.0, "not_run": "", "detail": ""},
        {"type": "phase", "phase": "cpu", "state": "end"},
        {"type": "phase", "phase": "disk", "state": "start"},
        {"type": "row", "metric": "disk_seq_write_mibs", "device": "", "value": 90.0, "not_run": "", "detail": ""},
    ]
    return "".join(json.dumps(line) + "\n" for line in lines)


def stand_in_remote(agent_result: remote.CommandResult):
    """Test stand-in for remote.run: the upload succeeds, the agent gives ``agent_result``."""

    def run(n, command, timeout=None, conn=None):
        if "base64 -d" in command:
            return remote.CommandResult(n.name, 0, "", "")
        return agent_result

    return run


def test_agent_killed_at_its_deadline_keeps_its_rows_and_says_which_phase_timed_out(monkeypatch):
    result = remote.CommandResult("a", 124, cut_off_stream(), "")
    monkeypatch.setattr(controller.remote, "run", stand_in_remote(result))
    run = controller._agent(node("a"), controller.Plan(), "/tmp/agent.py", lambda host, text: None)
    assert run.answered
    assert run.error == (
        "agent ran past its deadline of 480 s and was stopped (timeout, exit 124) during disk; "
        "every result it sent before is kept"
    )
    got = {m.metric: m for m in run.report.measurements}
    assert got["cpu_gemm_gflops"].value == 2.0
    assert got["disk_seq_write_mibs"].value == 90.0
    assert got["disk_seq_read_mibs"].not_run.startswith("not run: timed out after 480 s")
    assert "124:" not in run.error


def test_agent_killed_before_printing_anything_names_the_deadline_not_a_bare_exit_code(monkeypatch):
    monkeypatch.setattr(controller.remote, "run", stand_in_remote(remote.CommandResult("a", 124, "", "")))
    run = controller._agent(node("a"), controller.Plan(), "/tmp/agent.py", lambda host, text: None)
    assert run.report is None
    assert run.answered
    deadline = controller.agent.outer_deadline_s("quick")
    assert run.error == f"agent ran past its deadline of {deadline} s before printing anything (timeout, exit 124)"


def test_outer_deadline_of_the_agent_command_is_the_sum_of_its_phase_budgets_plus_margin():
    cmd = controller.agent_command(node("a"), "/tmp/a.py", controller.Plan())
    budgets = controller.agent.BUDGETS_S["quick"]
    assert f"timeout {sum(budgets.values()) + controller.agent.MARGIN_S['quick']:.0f} " in cmd
    assert "--budget" not in cmd  # the mode's own budgets


def test_a_nodes_validate_budgets_reach_its_agent_and_its_deadline_grows_with_them():
    slow = Node(
        "slow",
        SshTarget("127.0.0.1", 22, "root", None, None, "yes"),
        ("nodes",),
        Settings(validate_budgets_s={"cpu": 300, "disk": 120.5}),
    )
    cmd = controller.agent_command(slow, "/tmp/a.py", controller.Plan())
    assert cmd.endswith(" --budget cpu=300,disk=120.5")
    quick = controller.agent.BUDGETS_S["quick"]
    grown = sum(quick.values()) - quick["cpu"] - quick["disk"] + 300 + 120.5
    deadline = int(grown + controller.agent.MARGIN_S["quick"])
    assert f"timeout {deadline} " in cmd
    assert controller.agent_deadline_s(slow, "quick") == deadline
    # The agent itself reads them as its phases' budgets.
    assert controller.agent._budgets("cpu=300,disk=120.5", "quick") == {"cpu": 300.0, "disk": 120.5}


def test_the_agent_killed_at_a_nodes_own_deadline_says_that_deadline(monkeypatch):
    monkeypatch.setattr(controller.remote, "run", stand_in_remote(remote.CommandResult("a", 124, "", "")))
    slow = Node(
        "a", SshTarget("127.0.0.1", 22, "root", None, None, "yes"), (), Settings(validate_budgets_s={"cpu": 600})
    )
    run = controller._agent(slow, controller.Plan(), "/tmp/agent.py", lambda host, text: None)
    assert f"its deadline of {controller.agent_deadline_s(slow, 'quick')} s" in run.error


def test_a_node_whose_agent_timed_out_still_has_its_links_measured(monkeypatch):
    nodes = [node("a"), node("b")]
    timed_out = controller.AgentRun(None, "agent ran past its deadline", True)
    unreachable = controller.AgentRun(None, "cannot upload the agent: NoValidConnectionsError", False)
    runs = {"a": timed_out, "b": unreachable}
    monkeypatch.setattr(controller, "_agent", lambda n, plan, path, say: runs[n.name])
    monkeypatch.setattr(
        controller.remote, "run", lambda n, command, timeout=None: remote.CommandResult(n.name, 0, "", "")
    )
    measured: list[list[str]] = []

    def links(reachable, mode, seconds, say, peers):
        measured.append([n.name for n in reachable])
        return {"a": (None, "not run: every link test failed", "")}, {}

    monkeypatch.setattr(netrun, "links", links)
    plan = controller.Plan(groups=frozenset({"cpu", "net"}))
    outcome = controller.run(Cluster(Path("inv.py"), tuple(nodes)), plan)
    assert measured == [["a"]]
    net = {r.node: next(f for f in r.findings if f.metric == "net_gbits") for r in outcome.results}
    assert "unreachable" not in net["a"].reason
    assert net["b"].reason.startswith("not run: node unreachable")


def test_a_command_stopped_by_its_own_timeout_keeps_what_it_printed():
    from invoke.exceptions import CommandTimedOut
    from invoke.runners import Result

    class StandInConnection:
        """Test stand-in for a fabric Connection whose command outlives run()'s timeout."""

        def run(self, command, **kwargs):
            raise CommandTimedOut(Result(stdout='{"type": "start"}\n', stderr="", command=command, exited=-1), 5)

    node = Node("n1", SshTarget("127.0.0.1", 22, "root", None, None, "yes"), ("nodes",), Settings())
    r = remote.run(node, "agent", timeout=5, conn=StandInConnection())
    assert r.exited == remote.TIMED_OUT == 124
    assert r.stdout == '{"type": "start"}\n'
    assert r.stderr.startswith("timed out after 5 s")


def test_an_all_reduce_stopped_by_timeout_says_it_timed_out_not_a_bare_exit_code():
    r = remote.CommandResult("b", 124, "rank 1 waiting", "")
    assert (
        netrun._failed(r) == f"timed out after {netrun.ALLREDUCE_TIMEOUT_S} s (all-reduce across nodes): rank 1 waiting"
    )
    assert netrun._failed(remote.CommandResult("b", 1, "", "NCCL error")) == "exit 1: NCCL error"


def test_agent_killed_during_start_up_says_so(monkeypatch):
    start = {"type": "start", "agent": agent_stream.AGENT_SCHEMA, "mode": "quick", "deadline_s": 480}
    result = remote.CommandResult("a", 124, json.dumps(start) + "\n", "")
    monkeypatch.setattr(controller.remote, "run", stand_in_remote(result))
    run = controller._agent(node("a"), controller.Plan(), "/tmp/agent.py", lambda host, text: None)
    assert run.report is None
    assert run.error == (
        "agent ran past its deadline of 480 s and was stopped (timeout, exit 124) during "
        "start-up (python, torch import, inventory), before its first benchmark"
    )
