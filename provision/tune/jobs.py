"""Trials as Slurm jobs (`provision tune --scheduler slurm`): the scheduler, not the sweep,
chooses where each trial runs, so a sweep shares the cluster with every other user's jobs.

Each attempt is one job of one task on one node that Slurm chooses (launch.slurm_job's
placed_sbatch_command, no --nodelist), submitted as the training user. The controller
asks squeue where it started, prepares that node as for an SSH trial (trainer, reaper,
directories; launch.session.prepare) while the task waits for the node's script, then
streams the task's log and exit status like a `train --scheduler slurm` run. A stop (Ctrl-C,
the pruner's stop file aside, a silent node, --trial-timeout) cancels the job (scancel) and
the reaper checks the node.

What the sweep keeps per trial (JobBook): the nodes it failed on and those lost, which the
next attempt's --exclude leaves out, and how many tries it has had. A trial whose job Slurm
fails (FAIL, NODE_FAIL, cancelled by an admin) is failed and retried like an SSH trial.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from io import StringIO
from typing import Any

from provision import remote
from provision.inventory import Node
from provision.launch import plan, session, slurm_job
from provision.tune import trial as trial_lib
from provision.tune.slots import NoSlotsLeft, Slot

POLL_S = 2  # how often squeue is asked where a submitted job is
SAY_PENDING_EVERY_S = 60  # a job still pending is said again this often (progress off a terminal)


@dataclass
class _Tries:
    failed_on: set[str] = field(default_factory=set)
    failures: int = 0


class JobBook:
    """How many trials run at once, and where each may run next; thread-safe (one thread
    per running trial).

    ``nodes``: the sweep's nodes; ``outside``: Slurm compute nodes not in the sweep (--limit),
    excluded from every job."""

    def __init__(
        self, nodes: list[str], outside: list[str], *, parallel: int, retries: int, place: slurm_job.Placement
    ):
        if not nodes:
            raise ValueError("a sweep under Slurm needs at least one node")
        if parallel < 1:
            raise ValueError(f"parallel must be 1 or more, not {parallel}")
        self.nodes, self.outside = list(nodes), sorted(outside)
        self.parallel, self.retries, self.place = parallel, retries, place
        self._running = 0
        self._lost: set[str] = set()
        self._trials: dict[int, _Tries] = {}
        self._changed = threading.Condition()

    def take(self, trial: int) -> slurm_job.Placement:
        """What the next job of ``trial`` asks Slurm for, once fewer than ``parallel`` run:
        the sweep's placement, excluding the nodes outside the sweep, the lost ones, and
        those this trial failed on while another node is left. NoSlotsLeft when every node
        of the sweep was lost."""
        with self._changed:
            while self._running >= self.parallel:
                self._changed.wait()
            alive = [n for n in self.nodes if n not in self._lost]
            if not alive:
                raise NoSlotsLeft("every node of the sweep was lost")
            failed_on = self._trials.get(trial, _Tries()).failed_on
            avoid = failed_on if any(n not in failed_on for n in alive) else set()
            self._running += 1
            exclude = sorted({*self.outside, *self._lost, *avoid})
            return replace(self.place, exclude=tuple(exclude))

    def give_back(self, trial: int, node: str | None, *, failed: bool = False, node_lost: bool = False) -> None:
        """``trial``'s job ended (on ``node``, None when it never started)."""
        with self._changed:
            self._running -= 1
            if failed or node_lost:
                record = self._trials.setdefault(trial, _Tries())
                record.failures += 1
                if node:
                    record.failed_on.add(node)
            if node_lost and node:
                self._lost.add(node)
            self._changed.notify_all()

    def may_retry(self, trial: int) -> bool:
        with self._changed:
            return self._trials.get(trial, _Tries()).failures <= self.retries

    def lost_nodes(self) -> set[str]:
        with self._changed:
            return set(self._lost)


class PlacedJob:
    """One submitted job, from its submission to its node's log (trial_lib.Job). Slurm is
    asked through the first of ``via`` that answers: the node that submitted it may be the
    one that was lost."""

    def __init__(self, via: list[Node], job_id: str, user: str | None):
        self.via, self.id = via, job_id
        self.user = user  # who submitted it (runuser), and so who may cancel it
        self.cancelled = False

    def ask(self, command: str, timeout_s: float) -> remote.CommandResult:
        """``command`` on the first node of ``via`` that answers (its result, whatever its
        exit status); the last one's unanswered result when none does."""
        return _on_first_answering(self.via, command, timeout_s)

    def start(self, conn: Any, run_plan: plan.RunPlan) -> None:
        """The prepared node's script, put beside its final name and renamed into place:
        the waiting task runs only a whole file."""
        (p,) = run_plan.nodes
        final = f"{p.run_dir}/{slurm_job.NODE_SCRIPT}"
        conn.put(StringIO(slurm_job.node_script(run_plan, p)), f"{final}.part")
        r = remote.run_beside(conn, p.name, shlex.join(["mv", "-f", f"{final}.part", final]), timeout=30)
        if not r.ok:
            raise session.LaunchError(f"{p.name}: could not put the job's script: {r.stderr.strip()[-200:]}")

    def stream(self, node_plan: plan.NodePlan) -> str:
        return slurm_job.stream_command(node_plan, self.id, node_plan.run_as)

    def cancel(self) -> None:
        if self.cancelled:
            return
        r = self.ask(slurm_job.cancel_command(self.id, self.user), slurm_job.SUBMIT_TIMEOUT_S)
        if not r.ok:
            raise RuntimeError(f"scancel {self.id} failed: {(r.stderr or r.stdout).strip()[-200:]}; cancel it by hand")
        self.cancelled = True


def _on_first_answering(
    nodes: list[Node], command: str, timeout_s: float, *, retry_timed_out: bool = True
) -> remote.CommandResult:
    """``command`` on the first of ``nodes`` that can be reached. ``retry_timed_out``: a
    command that ran past its deadline is tried on the next node too; never for sbatch,
    whose job the controller may have taken before the deadline (a second try would
    submit a second job)."""
    r = remote.CommandResult("-", -1, "", "no node to ask")
    for node in nodes:
        r = remote.run(node, command, timeout=timeout_s)
        if r.exited != -1 and (r.exited != remote.TIMED_OUT or not retry_timed_out):
            return r
    return r


def submit(
    via: list[Node],
    user: str | None,
    run_id: str,
    place: slurm_job.Placement,
    nodes: dict[str, Node],
    timeout_s: float | None,
) -> PlacedJob:
    """sbatch, as ``user`` (the training user where the SSH user is root: root's jobs would
    write the shares as nobody), on the first node of ``via`` that answers; LaunchError when
    Slurm did not take the job (any job it took after all, past the deadline, is cancelled
    by its name)."""
    run_dirs = {name: plan.run_dir(n.settings.train_dir, run_id, name) for name, n in nodes.items()}
    cmd = slurm_job.placed_sbatch_command(run_id, user, place, run_dirs, timeout_s)
    r = _on_first_answering(via, cmd, slurm_job.SUBMIT_TIMEOUT_S, retry_timed_out=False)
    job = slurm_job.parse_job_id(r.stdout) if r.ok else None
    if job is None:
        _on_first_answering(via, slurm_job.cancel_by_name_command(run_id, user), slurm_job.SUBMIT_TIMEOUT_S)
        raise session.LaunchError(f"sbatch failed (exit {r.exited}): {(r.stderr or r.stdout).strip()[-300:]}")
    return PlacedJob(via, job, user)


def wait_for_node(
    job: PlacedJob, stop: threading.Event, say: Callable[[str, str], None], label: str, silent_s: float
) -> tuple[str | None, str]:
    """Where the job started: (node, "") once squeue says RUNNING on one node; (None, why)
    when it left the queue first, ``stop`` was set, or Slurm did not answer for
    ``silent_s`` (a hung controller must not hold the sweep: the attempt fails, and is
    retried while it has tries). A pending job is said when its reason changes and every
    SAY_PENDING_EVERY_S."""
    said, said_at = "", 0.0
    answered = time.monotonic()
    where_cmd = slurm_job.job_where_command(job.id)
    while not stop.is_set():
        r = job.ask(where_cmd, min(30.0, max(5.0, silent_s / 3)))
        now = time.monotonic()
        if r.ok:
            answered = now
            where = slurm_job.parse_job_where(r.stdout)
            if not where.state:
                return None, f"Slurm job {job.id} ended before it started (see `sacct -j {job.id}`)"
            if where.state in ("RUNNING", "COMPLETING") and where.node:
                return where.node, ""
            if where.state in slurm_job.ENDED_STATES:
                return None, f"Slurm job {job.id} ended before it started: {where.state}"
            text = f"{where.state} ({where.reason})" if where.reason and where.reason != "None" else where.state
            if text != said or now - said_at >= SAY_PENDING_EVERY_S:
                say(f"job {job.id}", f"{label}: waiting for Slurm: {text}")
                said, said_at = text, now
        elif "Invalid job id" in r.stderr + r.stdout:  # purged from the controller: gone
            return None, f"Slurm job {job.id} ended before it started (see `sacct -j {job.id}`)"
        elif now - answered >= silent_s:
            why = (r.stderr or r.stdout).strip()[-200:] or f"exit {r.exited}"
            return None, f"Slurm did not say where job {job.id} runs for {now - answered:.0f} s (squeue: {why})"
        stop.wait(POLL_S)
    return None, "interrupted (Ctrl-C)"


def _cancel(job: PlacedJob, say: Callable[[str, str], None], where: str) -> None:
    """A cancel that fails is said, not raised: the attempt's end is what the sweep needs."""
    try:
        job.cancel()
    except RuntimeError as e:
        say(where, f"warning: {e}")


def run(
    via: list[Node],
    run_as: dict[str, str | None],
    nodes: dict[str, Node],
    trial: Any,
    settings: trial_lib.TrialSettings,
    place: slurm_job.Placement,
    *,
    nfs_server: bool,
    stop: threading.Event,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
    torch_ok: set[str],
) -> tuple[trial_lib.TrialEnd, str | None]:
    """One attempt of ``trial`` as a Slurm job, submitted through the first of ``via``
    that answers, as that node's ``run_as`` user: (how it ended, the node it ran on; None
    when it never started). Never raises for the trial's own failure. Its --trial-timeout
    counts from the start of its run; a job may pend as long as Slurm keeps it (said)."""
    started = time.monotonic()
    label = f"trial {trial.number}"
    run_id = trial_lib.new_run_id(trial.number)
    try:
        if not via:
            raise session.LaunchError("no node of the sweep is left to submit from")
        job = submit(via, run_as.get(via[0].name), run_id, place, nodes, settings.timeout_s)
    except session.LaunchError as e:
        return trial_lib.TrialEnd("failed", None, 0, f"could not submit: {e}", run_id=run_id), None
    say(f"job {job.id}", f"{label}: submitted as Slurm job {job.id}")
    name, why = wait_for_node(job, stop, say, label, settings.node_timeout_s)
    if name is None or name not in nodes:
        _cancel(job, say, f"job {job.id}")
        if name is not None:
            why = f"Slurm placed job {job.id} on {name}, which is not a node of this sweep"
        end = trial_lib.TrialEnd("failed", None, 0, why, run_id=run_id, seconds=time.monotonic() - started)
        end.interrupted, end.slurm_job = stop.is_set(), job.id
        return end, name  # a foreign node is named: the retry excludes it
    node, slot = nodes[name], Slot(name)
    say(str(slot), f"{label}: Slurm job {job.id} runs on {name}")
    stop_file = f"{plan.run_dir(node.settings.train_dir, run_id, name)}/stop"
    opts = trial_lib.options(
        settings,
        trial.params,
        trial_lib.ckpt_name(settings.study, trial.number),
        before=("--eval-interval", str(settings.eval_interval), "--stop-file", stop_file),
        check_torch=name not in torch_ok,
    )
    holder: dict[str, Any] = {}
    reporter = trial_lib.Reporter(trial, trial_lib.pruner(holder, name, stop_file, label, str(slot), say))
    try:
        outcome = trial_lib.launch(
            node,
            slot,
            opts,
            run_id,
            reporter,
            stop,
            on_line,
            say,
            nfs_server,
            holder,
            settings.node_timeout_s,
            job=job,
        )
    except Exception as e:  # LaunchError, or the script's upload failing: the job must not stay
        _cancel(job, say, str(slot))
        why = str(e) if isinstance(e, session.LaunchError) else f"{type(e).__name__}: {e}"
        end = trial_lib.failed_end(node, run_id, f"could not start: {why}", started)
        end.slurm_job = job.id
        return end, name
    end = trial_lib.ended(outcome, reporter, run_id, node, started, stop.is_set())
    end.prepared = True
    end.slurm_job = job.id
    return end, name
