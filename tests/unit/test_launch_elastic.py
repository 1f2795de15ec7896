"""Elastic `provision train --min-nodes`: torchrun's arguments, the restarts read from a
survivor's real log (captured from tests/integration/test_train_elastic.py), the report's
restart arithmetic and verdict, and the CLI's refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from provision.launch import logs, plan, report
from provision.launch.session import Loss, Outcome
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
    losses = [Loss("node2", 30.0, 1_700_000_000.0, "SSH connection lost")]
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
    joins = [Loss("node2", 85.0, 1_700_000_060.0, "admitted again")]
    third = report.restarts(starts, losses, joins)[1]
    assert third.joined == ["node2"]
    assert third.why == "node2 admitted again"
    assert third.recovery_s == 16.0  # admitted at 85 s, its first step with it at 101 s


def test_a_run_that_finished_without_a_lost_node_it_cannot_reach_is_ok_and_names_it(tmp_path):
    p = elastic_plan()
    out = Outcome("r1", p, tmp_path, losses=[Loss("n1", 3.0, 1_700_000_000.0, "SSH connection lost")])
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
