"""`provision train --scheduler slurm`: the same run as over SSH, started as one Slurm job.

The nodes are prepared over SSH as for an SSH run (trainer, reaper, directories, probes);
then each node gets the script its task runs, and one job is submitted as the training
user from the first node:

    sbatch --nodes=N --nodelist=... --ntasks-per-node=1 --exclusive --mem=0 [--gres=gpu:G]
           --wrap "srun --kill-on-bad-exit=1 sh -c '<the node's script, by $SLURMD_NODENAME>'"

so Slurm gives the run whole nodes (every CPU, all memory, the GPUs in gres.conf) and its
cgroups hold every process of it. Each task runs torchrun exactly as an SSH run does
(plan.torchrun_argv, the same environment and run markers), its output into a log in the
run's torchrun-logs directory (the training user's) and its exit status beside it. The
controller streams each node's log over SSH into the same prefixed live lines and files
as an SSH run, and ends a node's stream with the task's exit status once it has one, or
once the job has left the queue without it (cancelled, killed). A failure or Ctrl-C
cancels the job (scancel), then the reaper checks each node as after an SSH run.

Everything here builds shell text from the plan; names and paths enter it quoted.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from io import StringIO
from typing import Any

from provision import remote
from provision.inventory import Node
from provision.launch import plan, session

TASK_LOG = "slurm-task.log"  # in the node's torchrun-logs directory (the training user's)
TASK_EXIT = "slurm-task.exit"  # beside it: the task's exit status, once torchrun ended
NODE_SCRIPT = "slurm-node.sh"  # in the node's run directory (root's): what its task runs
POLL_S = 2  # how often a node's stream asks whether the job is still queued or running
KILLED = 137  # a node's end when the job left the queue without its exit status


def logs_dir(node: plan.NodePlan) -> str:
    return f"{node.run_dir}/torchrun-logs"


def node_script(run: plan.RunPlan, node: plan.NodePlan) -> str:
    """The script a node's task runs, as the job's user: torchrun with the node's
    environment and the run's markers (the reaper finds strays by them), its output to
    TASK_LOG, its exit status to TASK_EXIT."""
    log, status = shlex.quote(f"{logs_dir(node)}/{TASK_LOG}"), shlex.quote(f"{logs_dir(node)}/{TASK_EXIT}")
    env = [f"{k}={v}" for k, v in plan.node_env(run, node).items()]
    argv = shlex.join(["env", *env, *plan.torchrun_argv(run, node)])
    return (
        "# Written by provision train (--scheduler slurm); run by this node's Slurm task.\n"
        f"cd {shlex.quote(node.work_dir)} || exit 1\n"
        f"{argv} > {log} 2>&1\n"
        "rc=$?\n"
        f"echo $rc > {status}\n"
        "exit $rc\n"
    )


def task_command(run: plan.RunPlan) -> str:
    """srun's command on every node: the node's own script, chosen by the name slurmd runs
    under (the inventory's name: the slurm step starts slurmd with -N <name>)."""
    cases = " ".join(
        f"{shlex.quote(n.name)}) exec sh {shlex.quote(f'{n.run_dir}/{NODE_SCRIPT}')} ;;" for n in run.nodes
    )
    script = f'case "$SLURMD_NODENAME" in {cases} *) echo "no script for node $SLURMD_NODENAME" >&2; exit 1 ;; esac'
    return shlex.join(["sh", "-c", script])


def time_limit(timeout_s: float | None) -> str:
    """sbatch's --time: the run's own --timeout (in whole minutes, one more for the
    teardown), else none: the controller watches the run, not the partition's default."""
    return "UNLIMITED" if timeout_s is None else str(math.ceil(timeout_s / 60) + 1)


def sbatch_command(run: plan.RunPlan, user: str | None, gpus_per_node: int, timeout_s: float | None) -> str:
    """The submission, run on the first node as the training user (root reaches it with
    runuser; a non-root SSH user submits as itself). Prints the job id (--parsable)."""
    first = run.nodes[0]
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name=provision-{run.run_id}",
        f"--nodes={len(run.nodes)}",
        f"--nodelist={','.join(n.name for n in run.nodes)}",
        "--ntasks-per-node=1",
        "--exclusive",
        "--mem=0",
        f"--time={time_limit(timeout_s)}",
        f"--chdir={first.work_dir}",
        "--output=/dev/null",
        # A node lost mid-run ends the run (as over SSH); requeued, the job would restart the
        # trainer behind the controller's back.
        "--no-requeue",
        *([f"--gres=gpu:{gpus_per_node}"] if gpus_per_node else []),
        "--wrap",
        f"srun --kill-on-bad-exit=1 {task_command(run)}",
    ]
    return shlex.join(["runuser", "-u", user, "--", *argv] if user else argv)


def parse_job_id(stdout: str) -> str | None:
    """sbatch --parsable prints "<id>" or "<id>;<cluster>"."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    job = first.split(";", 1)[0].strip()
    return job if job.isdigit() else None


def stream_command(node: plan.NodePlan, job_id: str, user: str | None) -> str:
    """Run over SSH on a node for the length of the run: its task's log as it grows, then
    the task's exit status as this command's own; KILLED when the job left the queue
    without one. Both files are the training user's, so they are read as that user (a link
    it put there reaches nothing root alone may read), and the status only as a number."""
    log, status = shlex.quote(f"{logs_dir(node)}/{TASK_LOG}"), shlex.quote(f"{logs_dir(node)}/{TASK_EXIT}")
    job = shlex.quote(job_id)
    script = (
        f"tail -n +1 -F {log} 2>/dev/null & t=$!; "
        # Gone means squeue answered and named no such job (nothing listed, or the id purged
        # from the controller's memory); a squeue that fails otherwise (the controller busy or
        # restarting) is asked again, not taken for the job's end.
        f"while [ ! -e {status} ]; do "
        f'if q=$(squeue --noheader --jobs={job} --format=%T 2>&1); then [ -n "$q" ] || break; '
        'else case "$q" in *"Invalid job id"*) break ;; esac; fi; '
        f"sleep {POLL_S}; done; "
        # The last lines reach the log before the status is written; give tail a moment.
        "sleep 1; kill $t 2>/dev/null; wait $t 2>/dev/null; "
        f"rc=$(head -c 8 {status} 2>/dev/null); "
        'case "$rc" in ""|*[!0-9]*) '
        f'echo "[provision] Slurm job {job_id} ended without this node\'s exit status (cancelled or killed)"; '
        f"exit {KILLED} ;; esac; exit $rc"
    )
    return shlex.join(["runuser", "-u", user, "--", "sh", "-c", script] if user else ["sh", "-c", script])


def cancel_command(job_id: str, user: str | None) -> str:
    argv = ["scancel", job_id]
    return shlex.join(["runuser", "-u", user, "--", *argv] if user else argv)


def cancel_by_name_command(run_id: str, user: str | None) -> str:
    """After a submission that failed or timed out: any job of this run the controller did
    accept is cancelled by its name (the run id is unique)."""
    argv = ["scancel", f"--name=provision-{run_id}", *([f"--user={user}"] if user else [])]
    return shlex.join(["runuser", "-u", user, "--", *argv] if user else argv)


SUBMIT_TIMEOUT_S = 60  # sbatch, and scancel, on the first node


def run(
    nodes: list[Node],
    conns: dict[str, Any],
    run_plan: plan.RunPlan,
    opts: session.Options,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
) -> session.Outcome:
    """Submit the prepared run as one job and supervise it like an SSH run. Raises
    session.LaunchError when the job could not be submitted (nothing was started)."""
    ranks = {p.nproc for p in run_plan.nodes}
    if len(ranks) != 1:
        raise session.LaunchError(
            "--scheduler slurm starts the same number of ranks on every node (one task each); "
            f"these nodes differ: {', '.join(f'{p.name} {p.nproc}' for p in run_plan.nodes)}; "
            "give --nproc-per-node, or run them over SSH (--scheduler ssh)"
        )
    for p in run_plan.nodes:
        conns[p.name].put(StringIO(node_script(run_plan, p)), f"{p.run_dir}/{NODE_SCRIPT}")
    first, user = nodes[0], run_plan.nodes[0].run_as
    gpus = min(p.gpus for p in run_plan.nodes)
    submitted = remote.run(
        first, sbatch_command(run_plan, user, gpus, opts.timeout_s), timeout=SUBMIT_TIMEOUT_S, conn=conns[first.name]
    )
    job = parse_job_id(submitted.stdout) if submitted.ok else None
    if job is None:
        # sbatch may have timed out after the controller took the job: none must run unwatched.
        remote.run(first, cancel_by_name_command(run_plan.run_id, user), timeout=SUBMIT_TIMEOUT_S)
        why = (submitted.stderr or submitted.stdout).strip()[-400:]
        raise session.LaunchError(f"{first.name}: sbatch failed (exit {submitted.exited}): {why}")
    say(first.name, f"Slurm job {job} submitted: {len(run_plan.nodes)} nodes, {gpus} GPUs each")

    def cancel() -> None:
        """scancel from the first node that answers (the failed node may be the first)."""
        tried = []
        for n in nodes:
            r = remote.run(n, cancel_command(job, user), timeout=SUBMIT_TIMEOUT_S)
            if r.ok:
                return
            tried.append(f"{n.name}: exit {r.exited} {(r.stderr or r.stdout).strip()[-120:]}")
        raise RuntimeError(f"scancel {job} failed everywhere ({'; '.join(tried)}); cancel it by hand")

    supervisor = session.Supervisor(
        nodes,
        conns,
        run_plan,
        opts,
        on_line,
        command_for=lambda p: stream_command(p, job, p.run_as),
        on_stop=cancel,
    )
    outcome = supervisor.run()
    outcome.slurm_job = job
    return outcome
