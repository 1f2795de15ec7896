"""One attempt at one trial: the reference trainer on one slot (a node, or one GPU of it)
with the sampled flags, launched as `provision train` launches a one-node run
(launch.session: prepare, stream, teardown on failure).

Each evaluation line rank 0 prints is parsed and reported to the study as it streams;
when the pruner gives up on the trial, the controller writes the run's stop file and the
trainer stops cleanly after its next evaluation (its --stop-file). The stop file lives in
the run's directory on the node, which belongs to root, so the training user cannot turn
root's write into a write somewhere else.
"""

from __future__ import annotations

import math
import re
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from provision import remote
from provision.inventory import Node
from provision.launch import plan, session
from provision.tune.slots import Slot

# rank 0's evaluation line: "step 30/60 | val loss 4.1234" (train_ddp.run)
VAL_LINE = re.compile(r"step (\d{1,9})/(\d{1,9}) \| val loss (\S{1,40})")
LOST_PROBE_S = 20  # after a failure: does the node still answer?
ANSWER_EVERY_S = 10  # while a trial runs, its node is asked for a sign of life this often


@dataclass(frozen=True)
class TrialSettings:
    """What every trial of the sweep shares (the command's options)."""

    study: str  # study name: in checkpoint names and run ids
    steps: int  # optimizer steps of a trial that is not pruned
    model: str  # size preset unless the space searches it
    batch_per_rank: int  # sequences per step (one rank per trial: the global batch)
    eval_interval: int  # steps between evaluations: the pruner's reports
    threads: int | None  # CPU threads of the trial's rank (--threads of the trainer)
    extra: tuple[str, ...]  # more trainer flags, after `--`, the same for every trial
    python: str | None  # interpreter on the nodes; default <venv_path>/bin/python
    runs_dir: Path  # this study's trial runs: logs and reports
    timeout_s: float  # a trial attempt running longer is stopped and failed
    node_timeout_s: float = 90.0  # a node silent this long (SSH) fails its trial as lost
    monitor_interval: float = 10.0


@dataclass
class TrialEnd:
    """How one attempt ended."""

    state: str  # "complete", "pruned" or "failed"
    value: float | None  # complete: final validation loss; pruned: the last one reported
    step: int  # the last evaluated step
    reason: str = ""  # why it failed or was pruned
    node_lost: bool = False  # failed because the node stopped answering
    run_id: str = ""
    checkpoint: str | None = None  # complete: the trial's final checkpoint on its node
    seconds: float = 0.0
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM: not the trial's fault
    prepared: bool = False  # the node passed the launch's checks (its venv imports torch)
    slurm_job: str | None = None  # the attempt's Slurm job (--scheduler slurm)


def trainer_flags(params: dict[str, Any]) -> list[str]:
    """The trainer's words for the sampled values (flag names are the space's, checked)."""
    words: list[str] = []
    for flag, value in params.items():
        text = repr(value) if isinstance(value, float) else str(value)
        words += [f"--{flag}", text]
    return words


def flags_text(params: dict[str, Any]) -> str:
    """The sampled values as a person reads them: the trainer's words, one line."""
    return " ".join(trainer_flags(params)) or "(defaults)"


def ckpt_name(study: str, number: int) -> str:
    return f"tune-{study}-t{number}"


def new_run_id(number: int) -> str:
    """An attempt's run id: unique, sortable, and naming its trial."""
    return f"tune-{plan.new_run_id().removeprefix('train-')}-t{number}"


class Reporter:
    """Reads rank 0's lines of one attempt: reports each evaluation to the Optuna trial
    and asks the pruner. ``summary``: the trainer's closing summary, once the run ended
    (the launch's Curves parse it)."""

    def __init__(self, trial: Any, on_prune: Callable[[int, str], None]):
        self.trial = trial
        self._on_prune = on_prune
        self.last: tuple[int, float] | None = None
        self.prune_asked: tuple[int, str] | None = None
        self.summary: dict[str, Any] | None = None
        self._reported: set[int] = set()
        self._lock = threading.Lock()

    def feed(self, who: str, text: str) -> None:
        if who != "rank0":
            return
        m = VAL_LINE.fullmatch(text.strip())
        if not m:
            return
        step, value = int(m.group(1)), _loss(m.group(3))
        if value is None:
            return
        with self._lock:
            self.last = (step, value)
            if step in self._reported:  # Optuna keeps one value per step
                return
            self._reported.add(step)
            self.trial.report(value, step)
            if self.prune_asked is None and self.trial.should_prune():
                self.prune_asked = (step, f"pruned at step {step}: val loss {value:.4f}")
                ask = self.prune_asked
            else:
                return
        self._on_prune(*ask)

    def final_loss(self) -> float | None:
        value = (self.summary or {}).get("final_val_loss")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        return self.last[1] if self.last else None

    def checkpoint(self) -> str | None:
        path = (self.summary or {}).get("checkpoint")
        return path if isinstance(path, str) and path.startswith("/") and len(path) < 4096 else None

    def stopped(self) -> bool:
        return isinstance((self.summary or {}).get("stopped"), dict)


def _loss(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def pruner(
    holder: dict[str, Any], host: str, stop_file: str, label: str, where: str, say: Callable[[str, str], None]
) -> Callable[[int, str], None]:
    """What the reporter calls when the study prunes an attempt: the stop file written in
    the run's root-owned directory on ``host``, over the attempt's connection
    (``holder["conn"]``, set once the run is launched)."""

    def prune(step: int, why: str) -> None:
        say(where, f"{label}: {why}; asking the trainer to stop")
        r = remote.run_beside(
            holder["conn"], host, f"printf '%s\\n' {shlex.quote(why)} > {shlex.quote(stop_file)}", timeout=30
        )
        if not r.ok:
            say(where, f"{label}: could not write the stop file ({r.stderr.strip()[-200:]})")

    return prune


def run(
    node: Node,
    slot: Slot,
    trial: Any,
    settings: TrialSettings,
    *,
    nfs_server: bool,
    stop: threading.Event,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
    check_torch: bool = True,
) -> TrialEnd:
    """Run one attempt of ``trial`` (an Optuna trial, asked by the sweep) on ``slot``.
    Never raises for the trial's own failure: a TrialEnd says how it went. ``stop`` set
    (Ctrl-C) ends the attempt at once, torn down like a failed run."""
    started = time.monotonic()
    run_id = new_run_id(trial.number)
    stop_file = f"{plan.run_dir(node.settings.train_dir, run_id, node.name)}/stop"
    opts = options(
        settings,
        trial.params,  # the sampled values (an Optuna trial asked with the space's distributions)
        ckpt_name(settings.study, trial.number),
        before=("--eval-interval", str(settings.eval_interval), "--stop-file", stop_file),
        check_torch=check_torch,
    )
    holder: dict[str, Any] = {}
    prune = pruner(holder, node.name, stop_file, f"trial {trial.number}", str(slot), say)
    reporter = Reporter(trial, prune)
    try:
        outcome = launch(
            node, slot, opts, run_id, reporter, stop, on_line, say, nfs_server, holder, settings.node_timeout_s
        )
    except session.LaunchError as e:
        return failed_end(node, run_id, f"could not start: {e}", started)
    end = ended(outcome, reporter, run_id, node, started, stop.is_set())
    end.prepared = True
    return end


def ended(
    outcome: session.Outcome, reporter: Reporter, run_id: str, node: Node, started: float, interrupted: bool
) -> TrialEnd:
    """How a trial that started ended: failed, pruned (the trainer stopped on its stop
    file) or complete (its final validation loss)."""
    seconds = time.monotonic() - started
    if outcome.failure:
        end = failed_end(node, run_id, outcome.failure, started, probe=not interrupted)
        end.interrupted = interrupted
        return end
    if reporter.prune_asked and reporter.stopped():
        step, why = reporter.prune_asked
        last_step = reporter.last[0] if reporter.last else step
        return TrialEnd("pruned", reporter.final_loss(), last_step, why, run_id=run_id, seconds=seconds)
    value = reporter.final_loss()
    if value is None or reporter.last is None:
        return TrialEnd("failed", None, 0, "the trainer exited 0 without a validation loss", run_id=run_id)
    return TrialEnd(
        "complete", value, reporter.last[0], run_id=run_id, checkpoint=reporter.checkpoint(), seconds=seconds
    )


def options(
    settings: TrialSettings,
    params: dict[str, Any],
    name: str,
    *,
    before: tuple[str, ...] = (),
    after: tuple[str, ...] = (),
    resume: bool = False,
    check_torch: bool = True,
) -> session.Options:
    """A one-rank run of the trainer with the trial's flags: the sweep's trainer flags
    (after `--`), then the sampled values, which win; checkpoints named ``name``."""
    return session.Options(
        steps=settings.steps,
        model=settings.model,
        nproc_per_node=1,
        batch_per_rank=settings.batch_per_rank,
        resume=resume,
        extra_args=(
            *before,
            *(["--threads", str(settings.threads)] if settings.threads else []),
            *settings.extra,
            *trainer_flags(params),
            *after,
        ),
        python=settings.python,
        runs_dir=settings.runs_dir,
        monitor_interval=settings.monitor_interval,
        timeout_s=settings.timeout_s,
        ckpt_name=name,
        check_torch=check_torch,
        # One rank: the trainer runs alone, without torchrun (the same setsid, user,
        # markers and teardown), which saves a torch import per trial.
        solo=True,
    )


def launch(
    node: Node,
    slot: Slot,
    opts: session.Options,
    run_id: str,
    reporter: Reporter,
    stop: threading.Event,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
    nfs_server: bool,
    holder: dict[str, Any],
    silent_s: float,
    job: Job | None = None,
) -> session.Outcome:
    """A one-node run of the trainer on ``slot``, as `provision train` runs one; rank 0's
    lines go to ``reporter``. LaunchError when the node could not be prepared. ``job``: the
    attempt is a Slurm job already running on the node (tune.jobs), whose task waits for
    the node's script; its log is streamed and the job is cancelled on a stop."""
    conn = remote.connection(node)
    holder["conn"] = conn

    def line(host: str, who: str, text: str) -> None:
        reporter.feed(who, text)
        on_line(str(slot), who, text)

    try:
        run_plan = session.prepare([node], {node.name: conn}, opts, run_id, lambda _h, m: say(str(slot), m), nfs_server)
        run_plan = _on_slot(run_plan, slot)
        if job is None:
            sup = session.Supervisor([node], {node.name: conn}, run_plan, opts, line)
        else:
            job.start(conn, run_plan)
            sup = session.Supervisor(
                [node], {node.name: conn}, run_plan, opts, line, command_for=job.stream, on_stop=job.cancel
            )
        threading.Thread(target=_stop_on_event, args=(stop, sup), daemon=True).start()
        threading.Thread(target=_watch_node, args=(conn, node, sup, silent_s), daemon=True).start()
        outcome = sup.run()
        reporter.summary = outcome.curves.summary
        return outcome
    finally:
        conn.close()


class Job(Protocol):
    """A Slurm job placed on the node (tune.jobs.PlacedJob)."""

    def start(self, conn: Any, run_plan: plan.RunPlan) -> None: ...
    def stream(self, node_plan: plan.NodePlan) -> str: ...
    def cancel(self) -> None: ...


def _on_slot(run_plan: plan.RunPlan, slot: Slot) -> plan.RunPlan:
    """A trial on one GPU sees only that GPU (as cuda:0), so trials on the GPUs of one node
    do not meet."""
    if slot.gpu is None:
        return run_plan
    return replace(run_plan, env=(("CUDA_VISIBLE_DEVICES", str(slot.gpu)),))


def _watch_node(conn: Any, node: Node, sup: session.Supervisor, silent_s: float) -> None:
    """A node that stops answering (powered off, frozen, cut off) leaves its SSH streams
    open and silent: nothing would end the trial until --trial-timeout. Its node is asked
    for a sign of life every ANSWER_EVERY_S on a channel of its own; silent for
    ``silent_s``, the trial is stopped and failed, and its node is probed as lost."""
    last = time.monotonic()
    while not sup.done.wait(ANSWER_EVERY_S):
        r = remote.run_beside(conn, node.name, "true", timeout=max(5.0, min(30.0, silent_s / 3)))
        if r.ok:
            last = time.monotonic()
        elif time.monotonic() - last >= silent_s:
            sup.request_stop(f"{node.name} did not answer for {time.monotonic() - last:.0f} s")
            return


def _stop_on_event(stop: threading.Event, sup: session.Supervisor) -> None:
    """Ctrl-C on the sweep: end this attempt as the run's own Ctrl-C would."""
    while not sup.done.is_set():
        if stop.wait(0.5):
            sup.request_stop("interrupted (Ctrl-C)")
            return


def failed_end(node: Node, run_id: str, why: str, started: float, probe: bool = True) -> TrialEnd:
    lost = False
    if probe:
        r = remote.run(node, "true", timeout=LOST_PROBE_S)
        lost = r.exited in (-1, remote.TIMED_OUT)
    return TrialEnd(
        "failed",
        None,
        0,
        why + ("; the node no longer answers" if lost else ""),
        node_lost=lost,
        run_id=run_id,
        seconds=time.monotonic() - started,
    )


def evaluate(
    node: Node,
    slot: Slot,
    params: dict[str, Any],
    settings: TrialSettings,
    ckpt_dir: str,
    name: str,
    *,
    nfs_server: bool,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
) -> tuple[float | None, str]:
    """The validation loss of the checkpoint ``ckpt_dir``/``name``-step*.pt on ``node``,
    loaded by the trainer with the trial's flags (--resume --eval-only): (loss, "") or
    (None, why not)."""
    run_id = f"tune-{plan.new_run_id().removeprefix('train-')}-eval"
    # The node ran the trial whose checkpoint this is: its venv imports torch.
    opts = options(
        settings, params, name, after=("--eval-only", "--ckpt-dir", ckpt_dir), resume=True, check_torch=False
    )
    reporter = Reporter(_NoTrial(), lambda _s, _w: None)
    try:
        outcome = launch(
            node, slot, opts, run_id, reporter, threading.Event(), on_line, say, nfs_server, {}, settings.node_timeout_s
        )
    except session.LaunchError as e:
        return None, f"could not start: {e}"
    if outcome.failure:
        return None, outcome.failure
    value = reporter.final_loss()
    return (value, "") if value is not None else (None, "the trainer printed no validation loss")


class _NoTrial:
    """An evaluation reports to no study."""

    number = -1

    def report(self, value: float, step: int) -> None:
        pass

    def should_prune(self) -> bool:
        return False
