"""The sweep: an Optuna study whose trials run on the cluster's slots.

One worker thread per trial that may run at once (``--parallel``, at most the slots):
each asks the study for a trial, takes a free slot, runs the trial there (trial.run) and
tells the study how it ended. A failed attempt is marked failed in the study and asked
again with the same flags (an enqueued trial with ``retry_of``), on a slot it has not
failed on, a bounded number of times; a node that stops answering leaves the queue. The
study's first trial is the trainer's defaults (enqueued), so it shows what tuning gained.

Ctrl-C (or SIGTERM) stops every running trial on every node (each torn down as `provision
train` tears a run down) and leaves the study resumable: ``--resume`` asks the
interrupted trials again first, then goes on to ``--trials``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provision import remote
from provision.inventory import Cluster, Node
from provision.launch import plan, session
from provision.tune import slots as slot_lib
from provision.tune import study as study_lib
from provision.tune import trial as trial_lib
from provision.tune.space import Space

PROBE_S = 60  # the start's check of every node (SSH, GPU count)


class SweepError(Exception):
    """The sweep cannot start (a study name taken, a resumed study with another space,
    no node answering); nothing ran."""


@dataclass(frozen=True)
class SweepOptions:
    trials: int  # trials the study should have finished (complete, pruned, or failed for good)
    parallel: int  # trials running at once, at most
    sampler: str  # tpe, random or grid
    pruner: str  # median, hyperband or none
    study: str  # the study's name; its files are in study_dir
    resume: bool  # continue the study of that name
    retries: int  # attempts after a trial's first failure
    seed: int | None  # the sampler's seed
    per_gpu: bool  # a slot per GPU on GPU nodes (else a slot per node)
    study_dir: Path  # runs/tune/<study>
    settings: trial_lib.TrialSettings


@dataclass
class SweepResult:
    study_dir: Path
    interrupted: bool = False
    stopped_why: str | None = None  # the sweep ended early (no slot left, Ctrl-C)
    lost_nodes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def open_study(space: Space, opts: SweepOptions) -> Any:
    """The study: created, or loaded for --resume; the same space and direction only."""
    import json

    import optuna

    storage = study_lib.storage(opts.study_dir)
    names = optuna.get_all_study_names(storage)
    if opts.study in names and not opts.resume:
        raise SweepError(
            f"study {opts.study!r} exists in {opts.study_dir}: add --resume to continue it, or --study NEW"
        )
    if opts.resume and opts.study not in names:
        raise SweepError(f"--resume: no study {opts.study!r} in {opts.study_dir}")
    settings = opts.settings
    st = optuna.create_study(
        storage=storage,
        sampler=study_lib.sampler(opts.sampler, space, opts.seed),
        pruner=study_lib.pruner(opts.pruner, eval_interval=settings.eval_interval, steps=settings.steps),
        study_name=opts.study,
        direction="minimize",
        load_if_exists=opts.resume,
    )
    fingerprint = json.dumps(
        {
            "space": {p.flag: repr(p) for p in space.params},
            "steps": settings.steps,
            "eval_interval": settings.eval_interval,
            "model": settings.model,
            "batch_per_rank": settings.batch_per_rank,
            "extra": list(settings.extra),
        },
        sort_keys=True,
    )
    if opts.resume:
        was = st.user_attrs.get("fingerprint")
        if was != fingerprint:
            raise SweepError(
                f"--resume: study {opts.study!r} was run with another space or other trial settings "
                "(--space, --steps, --eval-interval, --model, --batch-per-rank, flags after --); "
                "resume with the same ones, or start a new --study"
            )
    else:
        st.set_user_attr("fingerprint", fingerprint)
        defaults = study_lib.defaults(
            space,
            model=settings.model,
            global_batch=settings.batch_per_rank,
            micro_batch=settings.batch_per_rank,
        )
        kept, outside = study_lib.inside(space, defaults)
        st.set_user_attr("defaults_outside", outside)
        st.enqueue_trial(kept, user_attrs={"default": True})
    return st


def _requeue_interrupted(st: Any) -> int:
    """--resume: the trials a Ctrl-C (or a killed controller) left unfinished are asked
    again first, with the same flags. Returns how many."""
    from optuna.trial import TrialState

    redone = set(st.user_attrs.get("requeued", []))
    again = []
    for t in st.get_trials(deepcopy=False):
        if t.number in redone:
            continue
        if t.state == TrialState.RUNNING:  # the controller died under it
            st.tell(t.number, state=TrialState.FAIL)
        elif not (t.state == TrialState.FAIL and t.user_attrs.get("interrupted")):
            continue
        key = t.user_attrs.get("retry_of", t.number)
        st.enqueue_trial(t.params, user_attrs={"retry_of": key, "attempt": t.user_attrs.get("attempt", 1)})
        again.append(t.number)
    if again:
        st.set_user_attr("requeued", sorted(redone | set(again)))
    return len(again)


def _waiting_retries(st: Any) -> int:
    """Trials asked again and not yet run (interrupted ones on --resume, a failed one's
    retry left by a stop): each counts toward --trials as the trial it repeats."""
    from optuna.trial import TrialState

    return sum(1 for t in st.get_trials(deepcopy=False, states=(TrialState.WAITING,)) if "retry_of" in t.user_attrs)


def finished(st: Any) -> int:
    """Trials that count toward --trials: complete, pruned, or failed with no try left."""
    from optuna.trial import TrialState

    done = (TrialState.COMPLETE, TrialState.PRUNED)
    return sum(1 for t in st.get_trials(deepcopy=False) if t.state in done or t.user_attrs.get("gave_up"))


def gpu_counts(nodes: list[Node], say: Callable[[str, str], None]) -> dict[str, int]:
    """GPUs per answering node (nvidia-smi -L; 0 without it). A node that does not answer
    is left out of the sweep, said."""

    def probe(node: Node) -> remote.CommandResult:
        return remote.run(node, "nvidia-smi -L 2>/dev/null; true", timeout=PROBE_S)

    found: dict[str, int] = {}
    for name, r in remote.on_all(nodes, probe).items():
        if r.exited != 0:
            say(name, f"left out of the sweep: {(r.stderr or r.stdout).strip()[-200:] or 'no answer'}")
            continue
        found[name] = plan.gpu_count(r.stdout)
    return found


class _Sweep:
    def __init__(
        self,
        cluster: Cluster,
        nodes: dict[str, Node],
        st: Any,
        space: Space,
        opts: SweepOptions,
        queue: slot_lib.SlotQueue,
        on_line: Callable[[str, str, str], None],
        say: Callable[[str, str], None],
    ):
        self.cluster, self.nodes, self.st, self.opts, self.queue = cluster, nodes, st, opts, queue
        self.dists = study_lib.distributions(space)
        self.on_line, self.say = on_line, say
        self.stop = threading.Event()
        self.stopped_why: str | None = None
        self._lock = threading.Lock()
        self._fresh_left = max(0, opts.trials - finished(st) - _waiting_retries(st))
        self._nfs = cluster.storage_node() is not None
        self._torch_ok: set[str] = set()  # nodes whose venv imported torch for an earlier trial

    def worker(self) -> None:
        """One trial after another until the study has its trials or the sweep stops. A
        bug here must not leave the other workers waiting on a slot this one holds: it
        stops the sweep (said), and the study stays resumable."""
        try:
            self._work()
        except Exception as e:
            self.halt(f"internal error in a sweep worker: {type(e).__name__}: {e}")

    def _work(self) -> None:
        while not self.stop.is_set():
            trial = self._ask()
            if trial is None:
                return
            key = int(trial.user_attrs.get("retry_of", trial.number))
            try:
                slot = self.queue.take(key)  # no timeout: a slot, or NoSlotsLeft
                assert slot is not None
            except slot_lib.NoSlotsLeft as e:
                self._end(trial, None, trial_lib.TrialEnd("failed", None, 0, str(e), interrupted=True))
                self.halt(f"{e}: the study stops; --resume when nodes are back")
                return
            if self.stop.is_set():
                self.queue.give_back(slot, key)
                self._end(trial, None, trial_lib.TrialEnd("failed", None, 0, "not started", interrupted=True))
                return
            self.say(str(slot), f"trial {trial.number}: {trial_lib.flags_text(trial.params)}")
            try:
                end = trial_lib.run(
                    self.nodes[slot.node],
                    slot,
                    trial,
                    self.opts.settings,
                    nfs_server=self._nfs,
                    stop=self.stop,
                    on_line=self.on_line,
                    say=self.say,
                    check_torch=slot.node not in self._torch_ok,
                )
                if end.prepared:
                    self._torch_ok.add(slot.node)
            except Exception as e:  # a bug or a broken connection setup: this trial fails, the study goes on
                end = trial_lib.TrialEnd("failed", None, 0, f"{type(e).__name__}: {e}")
            self._end(trial, slot, end)

    def _ask(self) -> Any:
        from optuna.trial import TrialState

        with self._lock:
            waiting = self.st.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if not waiting and self._fresh_left <= 0:
                return None
            trial = self.st.ask(self.dists)
            if "retry_of" not in trial.user_attrs:
                self._fresh_left -= 1
            return trial

    def _end(self, trial: Any, slot: slot_lib.Slot | None, end: trial_lib.TrialEnd) -> None:
        from optuna.trial import TrialState

        key = int(trial.user_attrs.get("retry_of", trial.number))
        who = str(slot) if slot else "-"
        failed = end.state == "failed" and not end.interrupted
        try:
            _record(trial, slot, end)
        finally:  # the slot goes back whatever the study's storage says
            if slot:
                self.queue.give_back(slot, key, failed=failed, node_lost=failed and end.node_lost)
        if end.state == "complete":
            self.st.tell(trial, end.value)
            self.say(who, f"trial {trial.number}: complete, val loss {end.value:.4f} ({end.seconds:.0f} s)")
        elif end.state == "pruned":
            self.st.tell(trial, state=TrialState.PRUNED)
            self.say(who, f"trial {trial.number}: {end.reason}")
        elif end.interrupted:
            trial.set_user_attr("interrupted", True)
            self.st.tell(trial, state=TrialState.FAIL)
        else:
            self._failed(trial, key, who, end)

    def _failed(self, trial: Any, key: int, who: str, end: trial_lib.TrialEnd) -> None:
        """Marked failed; asked again with the same flags while it has tries left."""
        from optuna.trial import TrialState

        attempt = int(trial.user_attrs.get("attempt", 1))
        # The queue counts this run's failures; the stored attempt counts them over --resume too.
        again = self.queue.may_retry(key) and attempt <= self.opts.retries
        if not again:
            trial.set_user_attr("gave_up", True)
        self.st.tell(trial, state=TrialState.FAIL)
        if not again:
            self.say(who, f"trial {trial.number} failed ({end.reason[-300:]}); no tries left")
            return
        with self._lock:
            self.st.enqueue_trial(trial.params, user_attrs={"retry_of": key, "attempt": attempt + 1})
        self.say(who, f"trial {trial.number} failed ({end.reason[-300:]}); it runs again on another slot")

    def halt(self, why: str) -> None:
        if self.stopped_why is None:
            self.stopped_why = why
        self.stop.set()


def run(
    cluster: Cluster,
    nodes: list[Node],
    space: Space,
    opts: SweepOptions,
    on_line: Callable[[str, str, str], None],
    say: Callable[[str, str], None],
) -> tuple[SweepResult, Any]:
    """Run the study to ``opts.trials`` finished trials; (result, the Optuna study)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    gpus = gpu_counts(nodes, say)
    if not gpus:
        raise SweepError("no node answered: nothing can run")
    st = open_study(space, opts)
    result = SweepResult(opts.study_dir)
    size = space.grid_size() if opts.sampler == "grid" else None
    if size is not None and opts.trials > size + 1:  # more would try grid points again
        result.notes.append(f"--trials {opts.trials}: the grid has {size} points; {size + 1} run, the defaults first")
        opts = replace(opts, trials=size + 1)
    requeued = _requeue_interrupted(st) if opts.resume else 0
    if requeued:
        result.notes.append(f"{requeued} interrupted trial(s) asked again first")
    slots = slot_lib.node_slots(gpus, per_gpu=opts.per_gpu)
    queue = slot_lib.SlotQueue(slots, parallel=opts.parallel, retries=opts.retries)
    answering = {n.name: n for n in nodes if n.name in gpus}
    sweep = _Sweep(cluster, answering, st, space, opts, queue, on_line, say)
    say("tune", f"study {opts.study}: {len(slots)} slot(s) ({', '.join(map(str, slots))}), {opts.parallel} at a time")
    workers = [
        threading.Thread(target=sweep.worker, name=f"tune-{i}", daemon=True)
        for i in range(min(opts.parallel, len(slots)))
    ]
    with session.stop_signals() as asked:  # noted; the loop below acts on it
        for w in workers:
            w.start()
        while any(w.is_alive() for w in workers):
            for w in workers:
                w.join(timeout=0.2)
            if asked.why and not sweep.stop.is_set():
                say("tune", f"{asked.why}: stopping every running trial")
                result.interrupted = True
                sweep.halt(asked.why)
    result.stopped_why = sweep.stopped_why
    result.lost_nodes = sorted(queue.lost_nodes())
    return result, st


def _record(trial: Any, slot: slot_lib.Slot | None, end: trial_lib.TrialEnd) -> None:
    """What the table shows of an attempt, kept with the trial in the study."""
    for name, value in (
        ("slot", str(slot) if slot else None),
        ("run_id", end.run_id),
        ("seconds", round(end.seconds, 1)),
        ("reason", end.reason[-500:]),
        ("checkpoint", end.checkpoint),
    ):
        if value:
            trial.set_user_attr(name, value)
