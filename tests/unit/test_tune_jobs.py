"""`tune --scheduler slurm`: each trial one Slurm job that the scheduler places
(launch/slurm_job.py's placed job, tune/jobs.py's book of where a trial may run next, and
tune/sweep.py's choice of what a job asks for)."""

from __future__ import annotations

import shlex
import threading
import time

import pytest

from provision.launch import slurm_job
from provision.tune import jobs, sweep
from provision.tune.slots import NoSlotsLeft

DIRS = {"node1": "/var/tmp/pt/runs/r1/node1", "node2": "/srv/t/runs/r1/node2"}


def test_a_placed_job_names_no_node_and_asks_for_one_task_as_the_training_user():
    place = slurm_job.Placement(gpus=0, exclusive=True, exclude=("node3", "node9"))
    argv = shlex.split(slurm_job.placed_sbatch_command("tune-x-t4", "train", place, DIRS, 600))
    assert argv[:6] == ["runuser", "-u", "train", "--", "sbatch", "--parsable"]
    for flag in (
        "--job-name=provision-tune-x-t4",
        "--nodes=1",
        "--ntasks=1",
        "--exclusive",
        "--mem=0",
        "--exclude=node3,node9",
        "--time=21",  # the trial timeout and the wait for its node's preparation
        "--no-requeue",
        "--chdir=/tmp",
    ):
        assert flag in argv, flag
    assert not [a for a in argv if a.startswith(("--nodelist", "-w", "--gres", "--cpus-per-task"))]
    assert argv[-2] == "--wrap"
    assert argv[-1].startswith("srun --kill-on-bad-exit=1 sh -c ")


def test_a_one_gpu_job_asks_for_its_gpu_and_cpus_and_not_the_whole_node():
    place = slurm_job.Placement(gpus=1, exclusive=False, cpus=6, mem_per_gpu_mib=90000)
    argv = shlex.split(slurm_job.placed_sbatch_command("r1", None, place, DIRS, None))
    assert argv[0] == "sbatch"  # a non-root SSH user submits as itself
    assert "--gres=gpu:1" in argv
    assert "--cpus-per-task=6" in argv
    assert "--mem-per-gpu=90000M" in argv  # else CR_Core_Memory gives it the node's memory
    assert "--time=UNLIMITED" in argv
    assert "--exclusive" not in argv
    assert "--mem=0" not in argv
    assert not [a for a in argv if a.startswith("--exclude")]


def test_the_placed_task_waits_for_its_own_nodes_script_by_slurmds_name():
    script = slurm_job.placed_script(DIRS)
    assert "node1) f=/var/tmp/pt/runs/r1/node1/slurm-node.sh ;;" in script
    assert "node2) f=/srv/t/runs/r1/node2/slurm-node.sh ;;" in script
    assert script.startswith('case "$SLURMD_NODENAME" in ')
    assert f"-gt {slurm_job.PLACED_WAIT_S} ]" in script
    assert f"exit {slurm_job.PLACED_UNPREPARED}" in script
    assert script.endswith('exec sh "$f"')
    # A path that is not plain (an inventory's train_dir) enters the shell quoted.
    hostile = slurm_job.placed_script({"n1": "/var/tmp/a b;touch /x/runs/r1/n1"})
    assert "f='/var/tmp/a b;touch /x/runs/r1/n1/slurm-node.sh' ;;" in hostile


@pytest.mark.parametrize(
    ("out", "want"),
    [
        ("RUNNING|node2|None\n", ("RUNNING", "node2", "None")),
        ("PENDING||Resources\n", ("PENDING", "", "Resources")),
        ("", ("", "", "")),  # left the queue
        ("RUNNING|node1,node2|None", ("RUNNING", "", "None")),  # not one plain node: none
        ("RUNNING|$(reboot)|None", ("RUNNING", "", "None")),
        ("running|node1|x", ("", "", "")),  # not squeue's word
        ("slurm_load_jobs error: Invalid job id specified", ("", "", "")),
        ("PENDING||" + "R" * 500, ("PENDING", "", "R" * 80)),
    ],
)
def test_where_a_job_runs_is_read_by_type(out, want):
    where = slurm_job.parse_job_where(out)
    assert (where.state, where.node, where.reason) == want


def book(parallel=2, retries=1, nodes=("node1", "node2", "node3"), outside=("gpu9",)):
    return jobs.JobBook(list(nodes), list(outside), parallel=parallel, retries=retries, place=slurm_job.Placement())


def test_no_more_than_parallel_jobs_at_once():
    b = book(parallel=2)
    b.take(1), b.take(2)
    taken = threading.Event()
    threading.Thread(target=lambda: (b.take(3), taken.set()), daemon=True).start()
    assert not taken.wait(0.3)  # a third waits for one to end
    b.give_back(1, "node1")
    assert taken.wait(5)


def test_a_retry_avoids_the_nodes_it_failed_on_and_every_job_avoids_lost_and_outside_nodes():
    b = book(parallel=5, retries=3)
    assert b.take(7).exclude == ("gpu9",)
    b.give_back(7, "node1", failed=True)
    assert b.take(7).exclude == ("gpu9", "node1")
    b.give_back(7, "node2", failed=True, node_lost=True)
    assert b.take(7).exclude == ("gpu9", "node1", "node2")
    assert b.take(8).exclude == ("gpu9", "node2")  # another trial avoids only the lost node
    assert b.lost_nodes() == {"node2"}
    b.give_back(7, "node3", failed=True)
    # Failed on every node still alive: it may run on any of them again, never on a lost one.
    assert b.take(7).exclude == ("gpu9", "node2")


def test_retries_are_bounded_and_a_job_that_never_started_counts_against_them():
    b = book(retries=1)
    b.take(3)
    b.give_back(3, None, failed=True)  # sbatch refused it, or it ended before it started
    assert b.may_retry(3)
    b.take(3)
    b.give_back(3, "node1", failed=True)
    assert not b.may_retry(3)
    assert b.may_retry(4)


def test_with_every_node_lost_nothing_waits_for_a_job():
    b = book(parallel=3, nodes=("node1", "node2"))
    for n, name in enumerate(("node1", "node2")):
        b.take(n)
        b.give_back(n, name, failed=True, node_lost=True)
    started = time.monotonic()
    with pytest.raises(NoSlotsLeft):
        b.take(5)
    assert time.monotonic() - started < 1


def test_a_job_asks_for_one_gpu_on_gpu_nodes_and_for_a_whole_node_otherwise():
    gpu = {"g1": sweep.Shape(cpus=32, gpus=8, mem_mib=1_000_000), "g2": sweep.Shape(cpus=16, gpus=4, mem_mib=400_000)}
    one = sweep.placement(gpu, per_gpu=True, threads=None)
    assert (one.gpus, one.exclusive, one.cpus) == (1, False, 4)  # the smallest share per GPU
    assert one.mem_per_gpu_mib == 90_000  # 90 % of the smallest share: under RealMemory
    assert sweep.placement(gpu, per_gpu=True, threads=2).cpus == 2
    whole = sweep.placement(gpu, per_gpu=False, threads=None)
    assert (whole.gpus, whole.exclusive) == (4, True)  # the node's GPUs, or the job cannot see them
    mixed = {**gpu, "cpu1": sweep.Shape(cpus=64, gpus=0)}
    assert sweep.placement(mixed, per_gpu=True, threads=None) == slurm_job.Placement(gpus=0, exclusive=True)


def test_the_probe_reads_cpus_the_training_user_and_gpus_by_type():
    gpus = "GPU 0: H100 (UUID: GPU-1)\nGPU 1: H100 (UUID: GPU-2)\n"
    sep = "\n--provision-probe--\n"
    probe = f"16{sep}RUN_AS=train{sep}2048000{sep}{gpus}"
    assert sweep.parse_probe(probe, "train") == sweep.Shape(16, 2, "train", 2000)
    # A non-root SSH user submits as itself; garbage is one CPU, no GPU, memory unknown.
    assert sweep.parse_probe(f"x{sep}{sep}-5{sep}", "train") == sweep.Shape(1, 0, None, 0)
    assert sweep.parse_probe(f"4{sep}RUN_AS=mallory{sep}1{sep}", "train").run_as is None
    assert sweep.parse_probe("4", "train") == sweep.Shape(4, 0, None, 0)  # cut short


class SqueueStandIn(jobs.PlacedJob):
    """A placed job whose squeue answers are the test's (a STAND-IN for the controller: the
    real one is the e2e tier's); nothing is run."""

    def __init__(self, answers):
        super().__init__([], "42", None)
        self.answers = list(answers)

    def ask(self, command, timeout_s):
        from provision import remote

        assert command == slurm_job.job_where_command("42")
        exited, out = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return remote.CommandResult("node1", exited, out, "" if exited == 0 else "slurm_load_jobs error: timed out")


def test_waiting_for_placement_says_the_pending_reason_and_returns_the_node(monkeypatch):
    monkeypatch.setattr(jobs, "POLL_S", 0.01)
    said = []
    job = SqueueStandIn([(0, "PENDING||Resources"), (0, "PENDING||Resources"), (0, "RUNNING|node2|None")])
    assert jobs.wait_for_node(job, threading.Event(), lambda w, t: said.append(t), "trial 3", 60) == ("node2", "")
    assert said == ["trial 3: waiting for Slurm: PENDING (Resources)"]  # said once per reason


def test_a_controller_that_stops_answering_fails_the_attempt_instead_of_holding_the_sweep(monkeypatch):
    monkeypatch.setattr(jobs, "POLL_S", 0.01)
    job = SqueueStandIn([(0, "PENDING||Priority"), (124, "")])
    started = time.monotonic()
    node, why = jobs.wait_for_node(job, threading.Event(), lambda *_: None, "trial 3", 0.3)
    assert node is None
    assert "Slurm did not say where job 42 runs" in why
    assert "timed out" in why
    assert time.monotonic() - started < 5


def test_a_job_that_left_the_queue_or_a_stop_ends_the_wait(monkeypatch):
    monkeypatch.setattr(jobs, "POLL_S", 0.01)
    assert jobs.wait_for_node(SqueueStandIn([(0, "")]), threading.Event(), lambda *_: None, "t", 60)[0] is None
    stop = threading.Event()
    stop.set()
    assert jobs.wait_for_node(SqueueStandIn([(0, "PENDING||x")]), stop, lambda *_: None, "t", 60) == (
        None,
        "interrupted (Ctrl-C)",
    )


@pytest.mark.parametrize(
    ("path", "removed"),
    [
        ("/ck/tune-s.1-t3-step00000012.pt", True),
        ("/ck/tune-s.1-t12-step00000012.pt", True),
        ("/ck/tune-sX1-t3-step00000012.pt", False),  # '.' is not any character
        ("/ck/tune-s.1-tb-t3-step00000012.pt", False),  # another study ("s.1-tb")
        ("/ck/tune-s.1-t3x-step00000012.pt", False),
        ("/ck/tune-s.1/best-step00000012.pt", False),  # the kept best
        ("/ck/tune-s.1-t3-step00000012.pt.tmp", False),
        ("/ck/train_ddp-step00000012.pt", False),
    ],
)
def test_only_the_studys_trial_checkpoints_are_removed(path, removed):
    import re

    from provision.tune import results

    # Python's re and find's POSIX ERE agree on this pattern (the integration tier runs find).
    assert (re.fullmatch(results.trial_files_regex("s.1"), path) is not None) is removed


def test_a_timed_out_sbatch_is_not_submitted_again_elsewhere_and_its_job_is_cancelled_by_name(monkeypatch):
    """The controller may have taken a job whose sbatch ran past its deadline: a second try
    on the next node would leave two jobs. The SSH calls are stand-ins here."""
    from provision import remote
    from tests.unit.test_validate_commands import node

    asked: list[tuple[str, str]] = []

    def ssh_standin(n, command, timeout=None, **_):
        asked.append((n.name, command.split(" -- ", 1)[-1].split()[0]))
        return remote.CommandResult(n.name, remote.TIMED_OUT if "sbatch" in command else 0, "", "timed out")

    monkeypatch.setattr(jobs.remote, "run", ssh_standin)
    via = [node("n1"), node("n2")]
    with pytest.raises(jobs.session.LaunchError, match="sbatch failed"):
        jobs.submit(via, "train", "r1", slurm_job.Placement(), {"n1": via[0], "n2": via[1]}, 60)
    assert asked == [("n1", "sbatch"), ("n1", "scancel")]  # once, then cancelled by its name


def test_a_purged_job_ends_the_wait_at_once(monkeypatch):
    monkeypatch.setattr(jobs, "POLL_S", 0.01)

    class Purged(SqueueStandIn):
        def ask(self, command, timeout_s):
            from provision import remote

            return remote.CommandResult("n1", 1, "", "slurm_load_jobs error: Invalid job id specified")

    node, why = jobs.wait_for_node(Purged([]), threading.Event(), lambda *_: None, "t", 600)
    assert node is None
    assert "ended before it started" in why


def test_a_probe_answer_that_is_not_plain_digits_is_one_cpu():
    assert sweep.parse_probe("\u00b2\n--provision-probe--\n\n--provision-probe--\n", "train").cpus == 1
