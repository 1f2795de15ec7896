"""Elastic `provision train --min-nodes`: torchrun's arguments, the restarts read from a
survivor's real log (captured from tests/integration/test_train_elastic.py), the report's
restart arithmetic and verdict, and the CLI's refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from provision.launch import logs, plan, report
from provision.launch.session import NodeEvent, Outcome
from tests.unit.test_launch import two_node_plan

FIXTURES = Path(__file__).parent.parent / "fixtures"
SURVIVOR = FIXTURES / "train-elastic-survivor_netns-2-hosts-lost-1_torch-2.13.log"


def elastic_plan(min_nodes: int = 1, restarts: int = 3) -> plan.RunPlan:
    p = two_node_plan()
    e = plan.Elastic(min_nodes, restarts, (("n0", 40001), ("n1", 40002)))
    return dataclasses.replace(p, elastic=e)


def test_an_elastic_run_meets_at_the_controllers_store_through_each_nodes_own_loopback_port():
    p = elastic_plan()
    argvs = [plan.torchrun_argv(p, n) for n in p.nodes]
    assert [a[a.index("--rdzv-endpoint") + 1] for a in argvs] == ["127.0.0.1:40001", "127.0.0.1:40002"]
    for a in argvs:
        assert a[a.index("--nnodes") + 1] == "1:2"
        assert a[a.index("--max-restarts") + 1] == "3"
        # No node hosts the store, the first included: losing it must not end the run.
        assert a[a.index("--rdzv-conf") + 1] == f"is_host=0,last_call_timeout={plan.LAST_CALL_S}"
        assert a[a.index("--rdzv-id") + 1] == "r1"


def test_an_elastic_run_picks_each_rounds_rank0_store_afresh_and_a_plain_run_does_not():
    assert plan.node_env(elastic_plan(), elastic_plan().nodes[0])["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in plan.node_command(elastic_plan(), elastic_plan().nodes[1])
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in plan.node_env(two_node_plan(), two_node_plan().nodes[0])


def test_an_elastic_trainer_resumes_its_own_runs_checkpoints_saved_every_n_steps():
    common = dict(steps=50, model="tiny", world=2, batch_per_rank=8, run_id="r1", ckpt_name="c", summary="s")
    args = plan.trainer_args(resume=False, elastic=True, ckpt_every=10, **common)
    assert "--auto-resume-own" in args
    assert "--resume" not in args
    assert args[args.index("--ckpt-interval") + 1] == "10"
    assert args[args.index("--global-batch") + 1] == "16"  # fixed at the start; a restart keeps it
    resumed = plan.trainer_args(resume=True, elastic=True, ckpt_every=10, **common)
    assert "--resume" in resumed
    assert "--auto-resume-own" not in resumed
    dropping = plan.trainer_args(resume=False, elastic=True, drop_stragglers=1.5, **common)
    assert dropping[dropping.index("--drop-stragglers") + 1] == "1.5"
    plain = plan.trainer_args(resume=False, **common)
    assert "--auto-resume-own" not in plain
    assert "--ckpt-interval" not in plain


def feed(path: Path) -> logs.Curves:
    """Every rank-0 line of a host log, one second apart."""
    curves = logs.Curves()
    for i, line in enumerate(path.read_text().splitlines()):
        who, text = logs.split_rank(line)
        if who == "rank0":
            curves.feed(text, at=float(i))
    return curves


def test_a_survivors_log_gives_each_start_of_the_workers_with_its_world_and_checkpoint_step():
    curves = feed(SURVIVOR)
    first, again = curves.starts
    assert (first.world, first.resumed_from, first.last_step) == (2, 0, 0)
    assert (again.world, again.resumed_from) == (1, 8)
    assert again.last_step == 9  # step 9 was logged before the loss, and is done again
    assert again.first_step_at is not None
    assert again.first_step_at > again.at
    assert curves.train[-1][0] == 24
    assert [s for s, _ in curves.train] == list(range(1, 25))  # the redone step is the restart's


def test_a_restart_says_who_was_lost_the_worlds_the_step_resumed_and_the_time_to_the_next_step():
    starts = [
        logs.Start(0.0, 2, 0, 0, 5.0),
        logs.Start(40.0, 1, 10, 13, 52.5),
        logs.Start(90.0, 2, 20, 24, 101.0),
    ]
    losses = [NodeEvent("node2", 30.0, 1_700_000_000.0, "SSH connection lost")]
    first, second = report.restarts(starts, losses)
    assert first.lost == ["node2"]
    assert "node2 lost (SSH connection lost)" in first.why
    assert (first.world_before, first.world_after, first.resumed_from_step) == (2, 1, 10)
    assert first.steps_recomputed == 3
    assert first.recovery_s == 22.5  # the loss at 30 s, the next step at 52.5 s
    # A start that no loss explains (a node admitted again, a rank torchrun restarted).
    assert second.lost == []
    assert second.why == "the workers were started again"
    assert (second.world_before, second.world_after, second.steps_recomputed) == (1, 2, 4)
    assert second.recovery_s == 11.0
    assert report.restarts(starts[:1], losses) == []
    # The same starts, with node2 admitted again before the third: that is the cause.
    joins = [NodeEvent("node2", 85.0, 1_700_000_060.0, "admitted again")]
    third = report.restarts(starts, losses, joins)[1]
    assert third.joined == ["node2"]
    assert third.why == "node2 admitted again"
    assert third.recovery_s == 16.0  # admitted at 85 s, its first step with it at 101 s


def test_a_run_that_finished_without_a_lost_node_it_cannot_reach_is_ok_and_names_it(tmp_path):
    p = elastic_plan()
    out = Outcome("r1", p, tmp_path, losses=[NodeEvent("n1", 3.0, 1_700_000_000.0, "SSH connection lost")])
    out.curves.summary = {"tokens_per_s": 10.0, "ranks": []}
    out.teardown = {"n0": {"left": []}, "n1": {"error": "unreachable", "left": None}}
    r = report.build(out, tmp_path / "rec.json", "sig")
    assert r.ok is True
    assert r.lost[0]["host"] == "n1"
    assert r.lost[0]["why"] == "SSH connection lost"
    assert any("n1 was lost during the run and could not be reached" in n for n in r.notes)
    # A node that was not lost must be checked clean, as in any run.
    out.losses = []
    assert report.build(out, tmp_path / "rec.json", "sig").ok is False


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inv.py"
    path.write_text("nodes = [('a', {'ssh_hostname': '192.0.2.250'}), ('b', {'ssh_hostname': '192.0.2.251'})]\n")
    return path


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--min-nodes", "3"), "3 is more than the run's 2 node(s)"),
        (("--min-nodes", "0"), "--min-nodes"),
        (("--min-nodes", "1", "--scheduler", "slurm"), "an elastic run is started over SSH"),
        (("--min-nodes", "1", "--requeue"), "an elastic run is started over SSH"),
        (("--min-nodes", "1", "--ckpt-every", "0"), "--ckpt-every"),
        (
            (
                "--drop-stragglers",
                "1.5",
            ),
            "needs an elastic run (--min-nodes)",
        ),
        (("--min-nodes", "1", "--drop-stragglers", "1"), "F must be above 1"),
    ],
)
def test_bad_elastic_options_are_refused_before_any_host_is_contacted(cli, inventory, tmp_path, args, said):
    result = cli("train", str(inventory), "--runs-dir", str(tmp_path / "runs"), *args)
    assert result.code == 2, result.err
    assert said in result.err
    assert "Traceback" not in result.err


def supervisor(tmp_path: Path, min_nodes: int = 1):
    """A Supervisor over two nodes that have not been contacted (nothing here starts)."""
    from provision import remote as _remote  # noqa: F401 (the seam the methods below would use)
    from provision.launch.session import Supervisor
    from tests.unit.test_launch import nfs_node, options

    p = elastic_plan(min_nodes)
    nodes = [nfs_node(0), nfs_node(1)]
    nodes = [dataclasses.replace(n, name=f"n{i}") for i, n in enumerate(nodes)]
    return Supervisor(nodes, {}, p, options(tmp_path), lambda *a: None)


@pytest.mark.parametrize(
    ("exited", "gone"),
    [(-1, True), (137, True), (143, True), (1, False), (2, False)],
    ids=["connection-lost", "sigkill", "sigterm", "exit-1", "exit-2"],
)
def test_a_node_is_gone_when_its_connection_or_a_signal_ended_it_not_when_torchrun_failed(tmp_path, exited, gone):
    from provision.launch.session import HostEnd

    s = supervisor(tmp_path)
    assert s._gone("n1", HostEnd(exited, 0.0, "")) is gone


def test_a_failed_torchrun_ends_an_elastic_run_saying_the_rendezvous_is_closed(tmp_path):
    """torch's launcher shuts the rendezvous down when torchrun exits with an error (its
    restarts ran out): the others cannot go on, so the run fails and says why."""
    from provision.launch.session import HostEnd

    s = supervisor(tmp_path)
    s.out.ends["n1"] = HostEnd(1, 0.0, "")
    assert s._went_on("n1", HostEnd(1, 0.0, ""), {"n0"}) is False
    assert "restarts ran out" in s.out.failure
    assert s.out.losses == []


def test_a_dropped_or_silent_node_is_a_loss_whatever_its_torchrun_said(tmp_path, monkeypatch):
    from provision.launch.session import HostEnd, Supervisor

    monkeypatch.setattr(Supervisor, "_reaper", lambda self, *a, **k: {"left": []})
    s = supervisor(tmp_path)
    s._silent["n1"] = "silent for 61 s (no answer to the monitor)"
    assert s._went_on("n1", HostEnd(1, 0.0, ""), {"n0"}) is True
    s._loss_work["n1"].join(5)  # the survivors' workers stopped (a stand-in reaper here)
    assert [(x.host, x.why) for x in s.out.losses] == [("n1", "silent for 61 s (no answer to the monitor)")]
    assert s.out.failure is None


def test_a_node_that_stops_answering_the_monitor_has_its_connection_closed(tmp_path, monkeypatch):
    from provision.launch import session

    closed = []

    class Conn:
        def close(self):
            closed.append(True)

    s = supervisor(tmp_path)
    s.conns = {"n0": Conn(), "n1": Conn()}
    now = session.time.monotonic()
    s._answered = {"n0": now, "n1": now - session.SILENT_S - 1}
    s._close_silent({"n0", "n1"})
    assert list(s._silent) == ["n1"]
    deadline = now + 5
    while not closed and session.time.monotonic() < deadline:
        session.time.sleep(0.01)
    assert closed == [True]


@pytest.mark.parametrize(
    ("ss", "refused"),
    [
        ("LISTEN 0 128 127.0.0.1:40001 0.0.0.0:*\nLISTEN 0 128 [::1]:40001 [::]:*\n", None),
        ("LISTEN 0 128 0.0.0.0:40001 0.0.0.0:*\n", "0.0.0.0:40001"),
        ("LISTEN 0 128 [::]:40001 [::]:*\n", "[::]:40001"),
        ("", "is not listening"),
    ],
    ids=["loopback", "every-ipv4", "every-ipv6", "nothing"],
)
def test_a_forwarded_port_open_beyond_the_loopback_is_refused(monkeypatch, ss, refused):
    from provision import remote
    from provision.launch import store

    monkeypatch.setattr(
        remote, "run_beside", lambda conn, host, command, timeout: remote.CommandResult(host, 0, ss, "")
    )
    why = store._open_wider(object(), "n1", 40001)
    if refused is None:
        assert why is None
    else:
        assert refused in why


def test_a_node_without_ss_is_refused_not_trusted(monkeypatch):
    from provision import remote
    from provision.launch import store

    monkeypatch.setattr(
        remote, "run_beside", lambda conn, host, command, timeout: remote.CommandResult(host, 127, "", "ss: not found")
    )
    assert "cannot see where its forwarded port listens" in store._open_wider(object(), "n1", 40001)
