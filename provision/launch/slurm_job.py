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

With --requeue the job may be requeued (by an admin's `scontrol requeue`, a preemption):
Slurm ends the tasks, the job goes back to PENDING and then runs again. Each start of a
node's script clears the previous attempt's exit status, appends to the same log (so the
stream keeps following it) under a line naming the attempt, and the trainer resumes the
run's newest checkpoint (plan.trainer_args). The stream then trusts an exit status only
once the job can no longer run again (stream_command).

Everything here builds shell text from the plan; names and paths enter it quoted.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
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
    environment and the run's markers (the reaper finds strays by them), its output
    appended to TASK_LOG, its exit status to TASK_EXIT.

    Every start of the task runs it again, the first and each after a requeue: it removes
    the previous attempt's exit status first, and appends (never truncates) the log, after
    a line naming the attempt (ATTEMPT_LINE), so the stream's tail -F reads on. Slurm
    exports SLURM_RESTART_COUNT to a job that was requeued (unset or 0 on its first run)."""
    log, status = shlex.quote(f"{logs_dir(node)}/{TASK_LOG}"), shlex.quote(f"{logs_dir(node)}/{TASK_EXIT}")
    env = [f"{k}={v}" for k, v in plan.node_env(run, node).items()]
    argv = shlex.join(["env", *env, *plan.launch_argv(run, node)])
    return (
        "# Written by provision train (--scheduler slurm); run by this node's Slurm task.\n"
        f"cd {shlex.quote(node.work_dir)} || exit 1\n"
        f"rm -f {status} || exit 1\n"
        'case "${SLURM_RESTART_COUNT:-0}" in ""|*[!0-9]*) restarts=0 ;; *) restarts=${SLURM_RESTART_COUNT:-0} ;; esac\n'
        f'echo "[provision] Slurm job ${{SLURM_JOB_ID:-?}} started (attempt $((restarts + 1)))" >> {log}\n'
        f"{argv} >> {log} 2>&1\n"
        "rc=$?\n"
        f"echo $rc > {status}\n"
        "exit $rc\n"
    )


# The line node_script writes at each start; the controller counts a run's requeues by it.
ATTEMPT_LINE = re.compile(r"^\[provision\] Slurm job \S+ started \(attempt (\d+)\)$")


def attempt_of(text: str) -> int | None:
    """The attempt number of a node's ATTEMPT_LINE (1: the job's first start); None for
    any other line."""
    m = ATTEMPT_LINE.match(text.strip())
    return int(m.group(1)) if m else None


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


def sbatch_command(
    run: plan.RunPlan, user: str | None, gpus_per_node: int, timeout_s: float | None, requeue: bool = False
) -> str:
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
        # Without --requeue a node lost mid-run ends the run (as over SSH). With it, Slurm may
        # start the job again (scontrol requeue, preemption); the stream follows each attempt
        # (stream_command) and the trainer resumes the run's newest checkpoint.
        "--requeue" if requeue else "--no-requeue",
        *([f"--gres=gpu:{gpus_per_node}"] if gpus_per_node else []),
        "--wrap",
        f"srun --kill-on-bad-exit=1 {task_command(run)}",
    ]
    return shlex.join(["runuser", "-u", user, "--", *argv] if user else argv)


# A job Slurm places (placed_sbatch_command) waits this long for its node to be prepared.
PLACED_WAIT_S = 600
PLACED_UNPREPARED = 97  # its exit status when the wait ran out


@dataclass(frozen=True)
class Placement:
    """What a job placed by Slurm asks for (a sweep's trial: one rank on one node)."""

    gpus: int = 0  # GPUs of the node (--gres=gpu:N); 0 with exclusive: the whole node
    exclusive: bool = True  # the whole node (every CPU, all memory)
    cpus: int | None = None  # CPUs of a job that does not take the whole node
    # Memory per GPU of a job that does not take the whole node (MiB): with CR_Core_Memory
    # and no DefMemPerCPU, a job that asks for none is given all of the node's memory, and
    # one-GPU jobs could not share a node.
    mem_per_gpu_mib: int | None = None
    exclude: tuple[str, ...] = ()  # nodes it must not run on (lost, failed there, outside the sweep)


def placed_script(run_dir_of: dict[str, str]) -> str:
    """The task of a job whose node Slurm chooses: it waits until the controller, having
    seen where the job runs, has prepared that node and put the node's script
    (NODE_SCRIPT, in the run directory ``run_dir_of[node]``, root's), then runs it. A node
    not in the map is refused; a node not prepared within PLACED_WAIT_S ends the task
    with PLACED_UNPREPARED. Every path enters the shell quoted."""
    cases = " ".join(f"{shlex.quote(n)}) f={shlex.quote(f'{d}/{NODE_SCRIPT}')} ;;" for n, d in run_dir_of.items())
    return (
        f'case "$SLURMD_NODENAME" in {cases} '
        '*) echo "provision: no run directory for node $SLURMD_NODENAME" >&2; exit 1 ;; esac; '
        f'n=0; while [ ! -f "$f" ]; do n=$((n + 1)); if [ "$n" -gt {PLACED_WAIT_S} ]; then '
        f'echo "provision: $SLURMD_NODENAME was not prepared within {PLACED_WAIT_S} s" >&2; '
        f"exit {PLACED_UNPREPARED}; fi; sleep 1; done; "
        'exec sh "$f"'
    )


def placed_sbatch_command(
    run_id: str, user: str | None, place: Placement, run_dir_of: dict[str, str], timeout_s: float | None
) -> str:
    """One task on one node that Slurm chooses (no --nodelist): the scheduler balances a
    sweep's trials. Submitted as the training user, like sbatch_command; prints the job id.
    The controller learns the node from squeue (job_where_command) and prepares it while
    the task waits (placed_script). Never requeued: a failed trial is the sweep's to retry,
    elsewhere."""
    ask = ([f"--gres=gpu:{place.gpus}"] if place.gpus else []) + (
        ["--exclusive", "--mem=0"]
        if place.exclusive
        else [
            f"--cpus-per-task={place.cpus or 1}",
            *([f"--mem-per-gpu={place.mem_per_gpu_mib}M"] if place.gpus and place.mem_per_gpu_mib else []),
        ]
    )
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name=provision-{run_id}",
        "--nodes=1",
        "--ntasks=1",
        *ask,
        *([f"--exclude={','.join(place.exclude)}"] if place.exclude else []),
        # Slurm's clock starts when the task waits for its node's preparation.
        f"--time={time_limit(None if timeout_s is None else timeout_s + PLACED_WAIT_S)}",
        "--chdir=/tmp",  # the node script goes to the run's work directory itself
        "--output=/dev/null",
        "--no-requeue",
        "--wrap",
        f"srun --kill-on-bad-exit=1 {shlex.join(['sh', '-c', placed_script(run_dir_of)])}",
    ]
    return shlex.join(["runuser", "-u", user, "--", *argv] if user else argv)


def job_where_command(job_id: str) -> str:
    """squeue's word on one job: "<state>|<node list>|<reason>" (empty once it left the queue)."""
    return shlex.join(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T|%N|%r"])


@dataclass(frozen=True)
class JobWhere:
    state: str  # squeue's %T (RUNNING, PENDING, ...); "" when the job is no longer listed
    node: str  # the node it runs on ("" while pending)
    reason: str  # why it pends (Resources, Priority, ReqNodeNotAvail, ...)


_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def parse_job_where(stdout: str) -> JobWhere:
    """A host's output, read by type: a state of capitals, one plain node name, a short reason."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    parts = first.split("|", 2)
    if len(parts) != 3 or not re.fullmatch(r"[A-Z_]{1,32}", parts[0]):
        return JobWhere("", "", "")
    node = parts[1].strip()
    return JobWhere(parts[0], node if _NODE_NAME.fullmatch(node) else "", parts[2].strip()[:80])


def parse_job_id(stdout: str) -> str | None:
    """sbatch --parsable prints "<id>" or "<id>;<cluster>"."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    job = first.split(";", 1)[0].strip()
    return job if job.isdigit() else None


# Job states (squeue %T) after which the job cannot run again: its end. Any other state
# (PENDING, RUNNING, COMPLETING, REQUEUED, REQUEUE_HOLD, SPECIAL_EXIT, SUSPENDED, ...) may
# still lead to a (further) attempt; a state unknown here counts as such too, and the job
# leaves the queue in the end anyway (then squeue lists nothing). Slurm's own names.
ENDED_STATES = (
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
)
# States in which the job waits to start (again): ended from one of these, the exit status
# on the node (if any) is an earlier attempt's, not the last one's.
WAITING_STATES = ("PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT")


def stream_command(node: plan.NodePlan, job_id: str, user: str | None, requeue: bool = False) -> str:
    """Run over SSH on a node for the length of the run: its task's log as it grows, then
    the task's exit status as this command's own; KILLED when the job left the queue
    without one. Both files are the training user's, so they are read as that user (a link
    it put there reaches nothing root alone may read), and the status only as a number.

    Without ``requeue`` the exit status ends the stream as soon as it is written (a failed
    rank ends the run at once). With ``requeue`` it cannot: an attempt that Slurm ends for
    a requeue may leave an exit status (torchrun killed) moments before the job goes back
    to PENDING, and a stream that trusted it would end a run that is about to continue.
    Keying the file by SLURM_RESTART_COUNT would not help, since the stream cannot know
    whether the attempt it belongs to is the last one. So the stream asks the controller
    instead: the status counts once squeue says the job can no longer run again (an
    ENDED_STATES state, or no longer listed), and it is then the last attempt's, because
    every start of a node's script removes the previous one first (node_script). A job
    that ended while it waited to start again (cancelled while PENDING after a requeue)
    has no status of its last attempt: KILLED, whatever an earlier attempt left. A failed
    rank still ends the run within seconds: srun --kill-on-bad-exit ends the job, and a
    job that fails is not requeued. The run's --timeout bounds the wait in every case."""
    log, status = shlex.quote(f"{logs_dir(node)}/{TASK_LOG}"), shlex.quote(f"{logs_dir(node)}/{TASK_EXIT}")
    job = shlex.quote(job_id)
    ask = f"q=$(squeue --noheader --jobs={job} --format=%T 2>&1)"
    # Gone means squeue answered and named no such job (nothing listed, or the id purged
    # from the controller's memory); a squeue that fails otherwise (the controller busy or
    # restarting) is asked again, not taken for the job's end.
    gone = 'else case "$q" in *"Invalid job id"*) break ;; esac; fi; '
    if requeue:
        ended = "|".join(f"*{s}*" for s in ENDED_STATES)
        waiting = "|".join(f"{s}*" for s in WAITING_STATES)
        watch = (
            "last=; "
            f'while :; do if {ask}; then [ -n "$q" ] || break; '
            f'case "$q" in {ended}) break ;; esac; '
            # Said once a requeue: when a job that had started waits again.
            f'case "$last" in ""|{waiting}) ;; *) case "$q" in {waiting}) '
            f'echo "[provision] Slurm job {job_id} requeued ($q): following its next attempt" ;; esac ;; esac; '
            "last=$q; "
            f"{gone}sleep {POLL_S}; done; "
        )
        stale = (
            f'case "$last" in {waiting}) '
            f'echo "[provision] Slurm job {job_id} ended while waiting to start ($last)"; '
            f"exit {KILLED} ;; esac; "
        )
    else:
        watch = f'while [ ! -e {status} ]; do if {ask}; then [ -n "$q" ] || break; {gone}sleep {POLL_S}; done; '
        stale = ""
    script = (
        f"tail -n +1 -F {log} 2>/dev/null & t=$!; "
        f"{watch}"
        # The last lines reach the log before the status is written; give tail a moment.
        "sleep 1; kill $t 2>/dev/null; wait $t 2>/dev/null; "
        f"{stale}"
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
REQUEUE_WITHOUT_CHECKPOINTS = (
    "note: --requeue without `-- --ckpt-interval N`: the trainer checkpoints only at its last step, "
    "so a requeued job starts again from step 0"
)


class Attempts:
    """Passes the nodes' lines on, counting the job's starts by their attempt lines."""

    def __init__(self, on_line: Callable[[str, str, str], None]):
        self._on_line = on_line
        self.most = 1  # the highest attempt any node has started

    def line(self, host: str, who: str, text: str) -> None:
        if (n := attempt_of(text)) is not None:
            self.most = max(self.most, n)
        self._on_line(host, who, text)


def unfit(run_plan: plan.RunPlan) -> str | None:
    """Why this prepared run cannot be one Slurm job, or None: the job starts one task per
    node, the same torchrun on each, so every node must run the same number of ranks."""
    ranks = {p.nproc for p in run_plan.nodes}
    if len(ranks) == 1:
        return None
    differ = ", ".join(f"{p.name} {p.nproc}" for p in run_plan.nodes)
    return f"starts the same number of ranks on every node (one task each); these nodes differ: {differ}"


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
    why = unfit(run_plan)
    if why:
        raise session.LaunchError(
            f"--scheduler slurm {why}; give --nproc-per-node, or run them over SSH (--scheduler ssh)"
        )
    for p in run_plan.nodes:
        conns[p.name].put(StringIO(node_script(run_plan, p)), f"{p.run_dir}/{NODE_SCRIPT}")
    first, user = nodes[0], run_plan.nodes[0].run_as
    gpus = min(p.gpus for p in run_plan.nodes)
    submitted = remote.run(
        first,
        sbatch_command(run_plan, user, gpus, opts.timeout_s, opts.requeue),
        timeout=SUBMIT_TIMEOUT_S,
        conn=conns[first.name],
    )
    job = parse_job_id(submitted.stdout) if submitted.ok else None
    if job is None:
        # sbatch may have timed out after the controller took the job: none must run unwatched.
        remote.run(first, cancel_by_name_command(run_plan.run_id, user), timeout=SUBMIT_TIMEOUT_S)
        why = (submitted.stderr or submitted.stdout).strip()[-400:]
        raise session.LaunchError(f"{first.name}: sbatch failed (exit {submitted.exited}): {why}")
    say(first.name, f"Slurm job {job} submitted: {len(run_plan.nodes)} nodes, {gpus} GPUs each")
    if opts.requeue and not any(a.startswith("--ckpt-interval") for a in run_plan.trainer_args):
        say(first.name, REQUEUE_WITHOUT_CHECKPOINTS)
    attempts = Attempts(on_line)

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
        attempts.line,
        command_for=lambda p: stream_command(p, job, p.run_as, opts.requeue),
        on_stop=cancel,
    )
    outcome = supervisor.run()
    outcome.slurm_job = job
    if opts.requeue:
        outcome.requeues = attempts.most - 1
    return outcome
