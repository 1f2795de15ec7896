"""`train --scheduler slurm`'s shell (provision/launch/slurm_job.py): the submission, what each
task runs, the controller's per-node stream, and the cancel, built from a two-node plan."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from provision.launch import plan, slurm_job
from tests.unit.test_launch import two_node_plan


def _with_gpus(p: plan.RunPlan, gpus: int, user: str | None = "train") -> plan.RunPlan:
    nodes = tuple(dataclasses.replace(n, gpus=gpus, run_as=user) for n in p.nodes)
    return dataclasses.replace(p, nodes=nodes)


def test_the_job_asks_for_whole_named_nodes_one_task_each_and_their_gpus_as_the_training_user():
    p = _with_gpus(two_node_plan(), 8)
    argv = shlex.split(slurm_job.sbatch_command(p, "train", 8, None))
    assert argv[:4] == ["runuser", "-u", "train", "--"]
    assert argv[4:6] == ["sbatch", "--parsable"]
    for flag in (
        "--job-name=provision-r1",
        "--nodes=2",
        "--nodelist=n0,n1",
        "--ntasks-per-node=1",
        "--exclusive",
        "--mem=0",
        "--time=UNLIMITED",
        "--gres=gpu:8",
        "--chdir=/var/tmp/pt",
        "--no-requeue",
    ):
        assert flag in argv, flag
    assert argv[-2] == "--wrap"
    assert argv[-1].startswith("srun --kill-on-bad-exit=1 sh -c ")
    # CPU nodes ask for no GPU; a run with --timeout gets that many minutes (and one more).
    cpu = shlex.split(slurm_job.sbatch_command(two_node_plan(), None, 0, 90))
    assert cpu[0] == "sbatch"
    assert not [a for a in cpu if a.startswith("--gres")]
    assert "--time=3" in cpu


def test_each_task_runs_its_own_nodes_script_chosen_by_slurmds_name():
    p = two_node_plan()
    (_, _, script) = shlex.split(slurm_job.task_command(p))
    assert "n0) exec sh /var/tmp/pt/runs/r1/n0/slurm-node.sh ;;" in script
    assert "n1) exec sh /var/tmp/pt/runs/r1/n1/slurm-node.sh ;;" in script
    assert script.startswith('case "$SLURMD_NODENAME" in ')


def test_a_nodes_script_is_torchrun_as_over_ssh_with_its_output_and_status_in_the_users_log_dir():
    p = two_node_plan()
    text = slurm_job.node_script(p, p.nodes[1])
    assert "cd /var/tmp/pt || exit 1\n" in text
    run_line = next(line for line in text.splitlines() if line.startswith("env "))
    argv = shlex.split(run_line.split(" >> ")[0])
    torchrun = plan.torchrun_argv(p, p.nodes[1])
    assert argv[-len(torchrun) :] == torchrun
    assert "PROVISION_RUN_ID=r1" in argv  # the reaper finds strays by the run's markers
    assert run_line.endswith(" >> /var/tmp/pt/runs/r1/n1/torchrun-logs/slurm-task.log 2>&1")
    assert "echo $rc > /var/tmp/pt/runs/r1/n1/torchrun-logs/slurm-task.exit\n" in text


def test_every_start_of_a_nodes_script_clears_the_last_status_and_appends_to_the_log_under_its_attempt():
    """A requeued job runs the script again: the previous attempt's exit status goes first,
    the log is appended to (the stream's tail -F reads on), after a line naming the attempt."""
    p = two_node_plan()
    lines = slurm_job.node_script(p, p.nodes[0]).splitlines()
    clear = lines.index("rm -f /var/tmp/pt/runs/r1/n0/torchrun-logs/slurm-task.exit || exit 1")
    (announce,) = [i for i, line in enumerate(lines) if "started (attempt" in line]
    (run,) = [i for i, line in enumerate(lines) if line.startswith("env ")]
    assert clear < announce < run
    assert lines[announce].endswith(">> /var/tmp/pt/runs/r1/n0/torchrun-logs/slurm-task.log")
    assert "SLURM_RESTART_COUNT" in "\n".join(lines[:announce])
    assert not [line for line in lines if "slurm-task.log" in line and " > " in line]  # never truncated
    assert slurm_job.attempt_of("[provision] Slurm job 4711 started (attempt 2)") == 2
    assert slurm_job.attempt_of("[provision] Slurm job 4711 started (attempt 1)\n") == 1
    assert slurm_job.attempt_of("step 2/8 | train loss 5.1 (attempt 2)") is None


def test_with_requeue_the_job_is_requeueable_and_every_start_resumes_the_runs_own_checkpoint():
    argv = shlex.split(slurm_job.sbatch_command(two_node_plan(), "train", 0, None, requeue=True))
    assert "--requeue" in argv
    assert "--no-requeue" not in argv

    def args(**kw):
        return plan.trainer_args(
            steps=8, model="tiny", world=2, batch_per_rank=4, run_id="r1", ckpt_name="c", summary="s", **kw
        )

    assert "--auto-resume-own" in args(resume=False, requeue=True)
    # --resume continues an earlier run's checkpoint: on every start, as the first did.
    assert "--resume" in args(resume=True, requeue=True)
    assert "--auto-resume-own" not in args(resume=True, requeue=True)
    assert not {"--resume", "--auto-resume-own"} & set(args(resume=False))


def test_the_stream_reads_the_users_files_as_that_user_and_their_status_only_as_a_number():
    p = two_node_plan()
    argv = shlex.split(slurm_job.stream_command(p.nodes[0], "4711", "train"))
    assert argv[:7] == ["runuser", "-u", "train", "--", "sh", "-c", argv[6]]
    script = argv[6]
    assert "tail -n +1 -F /var/tmp/pt/runs/r1/n0/torchrun-logs/slurm-task.log" in script
    assert "squeue --noheader --jobs=4711 --format=%T 2>&1" in script
    # Only squeue's own word ends the stream: nothing listed, or the id purged; any other
    # failure (the controller busy) is asked again.
    assert '[ -n "$q" ] || break' in script
    assert '*"Invalid job id"*) break ;;' in script
    assert 'case "$rc" in ""|*[!0-9]*)' in script
    assert f"exit {slurm_job.KILLED} ;; esac; exit $rc" in script
    assert shlex.split(slurm_job.stream_command(p.nodes[0], "4711", None))[:2] == ["sh", "-c"]


def test_with_requeue_the_stream_trusts_an_exit_status_only_once_the_job_cannot_run_again():
    p = two_node_plan()
    plain = shlex.split(slurm_job.stream_command(p.nodes[0], "4711", "train"))[6]
    script = shlex.split(slurm_job.stream_command(p.nodes[0], "4711", "train", requeue=True))[6]
    # Without requeue an exit status ends the stream when it appears; with it, it does not.
    assert "while [ ! -e /var/tmp/pt/runs/r1/n0/torchrun-logs/slurm-task.exit ]" in plain
    assert "[ ! -e" not in script
    for state in slurm_job.ENDED_STATES:
        assert f"*{state}*" in script
    for state in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED"):
        assert state not in slurm_job.ENDED_STATES
    assert '[ -n "$q" ] || break' in script
    assert '*"Invalid job id"*) break ;;' in script
    assert "ended while waiting to start" in script


def test_the_run_counts_the_jobs_requeues_by_the_attempt_lines_of_every_node_and_says_them(tmp_path, capsys):
    seen: list[str] = []
    attempts = slurm_job.Attempts(lambda host, who, text: seen.append(f"{host} {text}"))
    for host, text in (
        ("n0", "[provision] Slurm job 4711 started (attempt 1)"),
        ("n1", "[provision] Slurm job 4711 started (attempt 1)"),
        ("n0", "step 2/8 | train loss 5.0 | lr 1e-3 | 10 tok/s | 5.0 ms"),
        ("n1", "[provision] Slurm job 4711 started (attempt 2)"),
        ("n0", "[provision] Slurm job 4711 started (attempt 2)"),
    ):
        attempts.line(host, "torchrun", text)
    assert attempts.most - 1 == 1
    assert len(seen) == 5  # every line still reaches the console and the parsers

    from provision.cli.train import _print
    from provision.launch import report
    from provision.launch.session import Outcome

    r = report.build(Outcome("r1", two_node_plan(), tmp_path, requeues=1), tmp_path / "rec.json", "sig")
    _print(r)
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    assert "Slurm job requeued: 1 time(s), each next attempt resumed from the run's last checkpoint" in printed


def test_the_job_id_is_read_from_sbatch_parsable_and_anything_else_is_none():
    assert slurm_job.parse_job_id("4711\n") == "4711"
    assert slurm_job.parse_job_id("4711;cluster\n") == "4711"
    assert slurm_job.parse_job_id("sbatch: error: Batch job submission failed\n") is None
    assert slurm_job.parse_job_id("") is None
    assert slurm_job.cancel_command("4711", "train") == "runuser -u train -- scancel 4711"
    assert slurm_job.cancel_by_name_command("r1", "train") == (
        "runuser -u train -- scancel --name=provision-r1 --user=train"
    )


def test_train_scheduler_slurm_refuses_nodes_outside_slurm_and_unknown_schedulers_before_any_host(cli, tmp_path):
    path = tmp_path / "inv.py"
    path.write_text(
        'nodes = [("n1", {"ssh_hostname": "192.0.2.1"}), ("n2", {"ssh_hostname": "192.0.2.2", "slurm": "skip"})]\n'
    )
    result = cli("train", str(path), "--scheduler", "slurm")
    assert result.code == 2, result.err
    assert "not Slurm compute nodes: n2" in result.err
    result = cli("train", str(path), "--scheduler", "pbs")
    assert result.code == 2, result.err
    assert "unknown scheduler 'pbs'" in result.err


def _cluster(tmp_path, text: str):
    from provision import inventory

    path = tmp_path / "inv.py"
    path.write_text(text)
    return inventory.load(path)


TWO = 'nodes = [("n1", {"ssh_hostname": "192.0.2.1"}), ("n2", {"ssh_hostname": "192.0.2.2"})]\n'


def test_auto_takes_slurm_only_where_the_controller_lists_every_host_of_the_run(tmp_path, monkeypatch):
    from provision import scheduler

    cluster = _cluster(tmp_path, TWO)
    asked = []

    def answers(nodes: dict[str, scheduler.SlurmState], error: str | None = None):
        def view(c):
            asked.append(c.head_node()[0].name)
            return scheduler.SlurmView("n1", nodes, [], error)

        monkeypatch.setattr(scheduler, "view", view)

    idle = scheduler.SlurmState("idle", 1, "none")
    answers({"n1": idle, "n2": idle})
    assert scheduler.why_not_slurm(cluster, ["n1", "n2"]) == scheduler.Choice(None, {})
    assert asked == ["n1"]  # one call, on the head
    # A drained or unresponsive node is still Slurm's: the job waits for it, as any user's
    # job would, and the choice names it.
    answers(
        {
            "n1": scheduler.SlurmState("idle*", 1, "Not responding"),
            "n2": scheduler.SlurmState("drained", 1, "admin: fan"),
        }
    )
    assert scheduler.why_not_slurm(cluster, ["n1", "n2"]) == scheduler.Choice(
        None, {"n1": "idle*: Not responding", "n2": "drained: admin: fan"}
    )
    answers({"n1": scheduler.SlurmState("mixed", 1, "none"), "n2": scheduler.SlurmState("allocated", 1, "none")})
    assert scheduler.why_not_slurm(cluster, ["n1", "n2"]).waits_for == {}  # busy: the job queues, as it should
    answers({"n1": idle})
    assert scheduler.why_not_slurm(cluster, ["n1", "n2"]).why_not == (
        "not in Slurm's node list yet (run `provision up`): n2"
    )
    assert scheduler.why_not_slurm(cluster, ["n1"]).why_not is None
    answers({}, error="n1: exit 127: sinfo: command not found")
    assert scheduler.why_not_slurm(cluster, ["n1"]).why_not == (
        "Slurm does not answer on the head (n1: exit 127: sinfo: command not found)"
    )


def test_auto_never_asks_the_head_when_the_inventory_rules_slurm_out(tmp_path, monkeypatch):
    from provision import scheduler

    def no_call(c):
        raise AssertionError("the head was asked")

    monkeypatch.setattr(scheduler, "view", no_call)
    skipped = _cluster(tmp_path, TWO.replace('"}', '", "slurm": "skip"}'))
    assert scheduler.why_not_slurm(skipped, ["n1", "n2"]).why_not == "slurm = 'skip' in the inventory"
    partial = _cluster(
        tmp_path,
        'nodes = [("n1", {"ssh_hostname": "192.0.2.1"}), ("n2", {"ssh_hostname": "192.0.2.2", "slurm": "skip"})]\n',
    )
    assert scheduler.why_not_slurm(partial, ["n1", "n2"]).why_not == "not Slurm compute nodes: n2"


def test_train_says_which_scheduler_auto_chose_and_why(cli, tmp_path, monkeypatch):
    from provision import launch, scheduler

    path = tmp_path / "inv.py"
    path.write_text(TWO)
    chosen = []

    def fake_train(cluster, nodes, opts, on_line, say):
        chosen.append(opts.scheduler)
        raise launch.LaunchError("stopped here by the test")

    monkeypatch.setattr(launch, "train", fake_train)
    monkeypatch.setattr(scheduler, "view", lambda c: scheduler.SlurmView("n1", {}, [], "n1: exit 255: no route"))
    result = cli("train", str(path))
    said = " ".join(result.err.split())  # the console wraps long lines
    assert "n1: scheduler: ssh (not Slurm: Slurm does not answer on the head (n1: exit 255: no route))" in said
    idle = scheduler.SlurmState("idle", 1, "none")
    monkeypatch.setattr(scheduler, "view", lambda c: scheduler.SlurmView("n1", {"n1": idle, "n2": idle}, []))
    result = cli("train", str(path))
    assert "scheduler: slurm" in result.err
    assert chosen == ["ssh", "slurm"]


def test_requeue_without_slurm_is_bad_input_before_any_host(cli, tmp_path):
    path = tmp_path / "inv.py"
    path.write_text('nodes = [("n1", {"ssh_hostname": "192.0.2.1"})]\n')
    result = cli("train", str(path), "--requeue", "--scheduler", "ssh")
    assert result.code == 2, result.err
    assert "--requeue" in result.err
    assert "only a Slurm job can be requeued" in result.err


def test_requeue_where_auto_chooses_ssh_is_bad_input_before_the_run(cli, tmp_path, monkeypatch):
    from provision import launch, scheduler

    path = tmp_path / "inv.py"
    path.write_text('nodes = [("n1", {"ssh_hostname": "192.0.2.1"})]\n')
    monkeypatch.setattr(scheduler, "view", lambda c: scheduler.SlurmView("n1", {}, [], "n1: exit 127: no sinfo"))

    def no_run(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr(launch, "train", no_run)
    result = cli("train", str(path), "--requeue")
    assert result.code == 2, result.err
    assert "only a Slurm job can be requeued" in " ".join(result.err.split())


def test_auto_gives_way_to_ssh_when_the_nodes_run_different_rank_counts(tmp_path, monkeypatch):
    """--scheduler auto chose Slurm before the plan was known; one job cannot start 8 ranks on
    one node and 4 on the other, so that run goes over SSH, said; asked for by name
    (--scheduler slurm), it is refused instead."""
    from dataclasses import replace

    from provision import launch, remote
    from provision.launch import plan, report, session, slurm_job

    cluster = _cluster(tmp_path, TWO)
    node = plan.NodePlan("n1", "10.0.0.1", "eth1", "/opt/v/bin/python", 8, "/r/n1", "/w", True)
    run_plan = plan.RunPlan("r1", "10.0.0.1", 29500, (node, replace(node, name="n2", nproc=4, is_host=False)), ())
    ran: list[str] = []
    said: list[str] = []

    class Conn:
        def close(self) -> None:
            pass

    class Supervisor:
        def __init__(self, nodes, conns, run_plan, opts, on_line, **kw):
            pass

        def run(self):
            ran.append("ssh")
            raise session.LaunchError("stopped here by the test")

    monkeypatch.setattr(remote, "connection", lambda n: Conn())
    monkeypatch.setattr(session, "prepare", lambda *a, **k: run_plan)
    monkeypatch.setattr(session, "Supervisor", Supervisor)
    monkeypatch.setattr(slurm_job, "run", lambda *a, **k: ran.append("slurm"))
    monkeypatch.setattr(report, "build", lambda *a, **k: None)
    opts = session.Options(1, "tiny", None, 1, False, (), None, tmp_path, 1.0, None, "c", "slurm", chosen=True)
    with pytest.raises(session.LaunchError):
        launch.train(cluster, list(cluster.nodes), opts, lambda *a: None, lambda h, t: said.append(t))
    assert ran == ["ssh"]
    assert any(t.startswith("scheduler: ssh after all (a Slurm job starts the same number of ranks") for t in said)
    assert slurm_job.unfit(run_plan) is not None
    assert slurm_job.unfit(replace(run_plan, nodes=run_plan.nodes[:1])) is None
