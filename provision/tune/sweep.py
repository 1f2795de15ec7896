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

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provision import remote
from provision.inventory import Cluster, Node
from provision.launch import plan, session, slurm_job
from provision.tune import jobs as jobs_lib
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
    scheduler: str = "ssh"  # ssh: the sweep's slot queue places trials; slurm: each trial is a job (tune.jobs)


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


@dataclass(frozen=True)
class Shape:
    """What a node offers trials, and who runs them there."""

    cpus: int
    gpus: int
    run_as: str | None = None  # the training user when the SSH user is root (plan.run_as_probe)
    mem_mib: int = 0  # MemTotal (0: not read)


_SPLIT = "--provision-probe--"


def probe(nodes: list[Node], say: Callable[[str, str], None]) -> dict[str, Shape]:
    """CPUs, GPUs (nvidia-smi -L; 0 without it) and the user trials run as, per answering
    node. A node that does not answer is left out of the sweep, said."""

    def one(node: Node) -> remote.CommandResult:
        run_as = plan.run_as_probe(node.settings.training_user)
        return remote.run(
            node,
            f"nproc; echo {_SPLIT}; {run_as}; echo {_SPLIT}; awk '/^MemTotal:/ {{print $2}}' /proc/meminfo; "
            f"echo {_SPLIT}; nvidia-smi -L 2>/dev/null; true",
            timeout=PROBE_S,
        )

    found: dict[str, Shape] = {}
    for name, r in remote.on_all(nodes, one).items():
        if r.exited != 0:
            say(name, f"left out of the sweep: {(r.stderr or r.stdout).strip()[-200:] or 'no answer'}")
            continue
        found[name] = parse_probe(r.stdout, next(n for n in nodes if n.name == name).settings.training_user)
    return found


def parse_probe(stdout: str, training_user: str) -> Shape:
    """A node's answer to probe(), read by type."""
    cpus_text, run_as_text, mem_text, gpus_text = ([*stdout.split(_SPLIT, 3), "", "", ""])[:4]
    cpus = int(cpus_text.strip()) if re.fullmatch(r"[0-9]{1,5}", cpus_text.strip()) else 1
    run_as = training_user if run_as_text.strip() == f"RUN_AS={training_user}" else None
    mem_kib = int(mem_text.strip()) if re.fullmatch(r"[0-9]{1,12}", mem_text.strip()) else 0
    return Shape(max(1, cpus), plan.gpu_count(gpus_text), run_as, mem_kib // 1024)


def placement(shapes: dict[str, Shape], *, per_gpu: bool, threads: int | None) -> slurm_job.Placement:
    """What each trial's job asks Slurm for: one GPU (and the CPUs that go with it: --threads,
    else the smallest node's share per GPU) when every node has GPUs and trials go per GPU;
    else a whole node, with its GPUs where every node has some (a device Slurm did not give
    the job is hidden from it)."""
    gpus = min(s.gpus for s in shapes.values())
    if per_gpu and gpus > 0:
        share = min(s.cpus // s.gpus for s in shapes.values())
        # 90 % of the smallest node's memory per GPU: below RealMemory (3 % under MemTotal).
        mem = min(s.mem_mib * 9 // 10 // s.gpus for s in shapes.values())
        return slurm_job.Placement(gpus=1, exclusive=False, cpus=threads or max(1, share), mem_per_gpu_mib=mem or None)
    return slurm_job.Placement(gpus=gpus, exclusive=True)


class _Sweep:
    def __init__(
        self,
        cluster: Cluster,
        nodes: dict[str, Node],
        st: Any,
        space: Space,
        opts: SweepOptions,
        queue: slot_lib.SlotQueue | jobs_lib.JobBook,
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
        self.run_as: dict[str, str | None] = {}  # per node: who submits its jobs (the sweep's probe)

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
            if isinstance(self.queue, jobs_lib.JobBook):
                self._run_job(trial, key, self.queue)
            else:
                self._run_on_slot(trial, key, self.queue)

    def _run_on_slot(self, trial: Any, key: int, queue: slot_lib.SlotQueue) -> None:
        try:
            slot = queue.take(key)  # no timeout: a slot, or NoSlotsLeft
            assert slot is not None
        except slot_lib.NoSlotsLeft as e:
            self._no_place_left(trial, e)
            return
        if self.stop.is_set():
            self._end(
                trial,
                None,
                trial_lib.TrialEnd("failed", None, 0, "not started", interrupted=True),
                lambda: queue.give_back(slot, key),
            )
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
        failed = end.state == "failed" and not end.interrupted
        self._end(
            trial, slot, end, lambda: queue.give_back(slot, key, failed=failed, node_lost=failed and end.node_lost)
        )

    def _run_job(self, trial: Any, key: int, book: jobs_lib.JobBook) -> None:
        """The attempt as a Slurm job: Slurm places it, away from lost nodes and from those
        this trial failed on."""
        try:
            place = book.take(key)
        except slot_lib.NoSlotsLeft as e:
            self._no_place_left(trial, e)
            return
        node: str | None = None  # where Slurm ran it
        end = trial_lib.TrialEnd("failed", None, 0, "not started", interrupted=True)
        try:
            if not self.stop.is_set():
                self.say("tune", f"trial {trial.number}: {trial_lib.flags_text(trial.params)}")
                lost = book.lost_nodes()
                via = [n for name, n in self.nodes.items() if name not in lost]
                end, node = jobs_lib.run(
                    via,
                    self.run_as,
                    self.nodes,
                    trial,
                    self.opts.settings,
                    place,
                    nfs_server=self._nfs,
                    stop=self.stop,
                    on_line=self.on_line,
                    say=self.say,
                    torch_ok=set(self._torch_ok),
                )
                if end.prepared and node:
                    self._torch_ok.add(node)
        except Exception as e:  # a bug: this trial fails, the study goes on
            end = trial_lib.TrialEnd("failed", None, 0, f"{type(e).__name__}: {e}")
        failed = end.state == "failed" and not end.interrupted
        self._end(
            trial,
            slot_lib.Slot(node) if node else None,
            end,
            lambda: book.give_back(key, node, failed=failed, node_lost=failed and end.node_lost),
        )

    def _no_place_left(self, trial: Any, e: slot_lib.NoSlotsLeft) -> None:
        """Every node was lost: the trial is left for --resume, and the study stops."""
        self._end(trial, None, trial_lib.TrialEnd("failed", None, 0, str(e), interrupted=True))
        self.halt(f"{e}: the study stops; --resume when nodes are back")

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

    def _end(
        self,
        trial: Any,
        slot: slot_lib.Slot | None,
        end: trial_lib.TrialEnd,
        give_back: Callable[[], None] = lambda: None,
    ) -> None:
        """Record the attempt, give its place back (``give_back``: the failure counted
        before the retry is decided), and tell the study how it ended."""
        from optuna.trial import TrialState

        key = int(trial.user_attrs.get("retry_of", trial.number))
        who = str(slot) if slot else "-"
        try:
            _record(trial, slot, end)
        finally:  # the place goes back whatever the study's storage says
            give_back()
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
    shapes = probe(nodes, say)
    if not shapes:
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
    answering = {n.name: n for n in nodes if n.name in shapes}
    queue: slot_lib.SlotQueue | jobs_lib.JobBook
    if opts.scheduler == "slurm":
        place = placement(shapes, per_gpu=opts.per_gpu, threads=opts.settings.threads)
        # Slurm may place a job on any of its nodes: those outside the sweep (--limit, or
        # not answering now) are excluded from every job.
        outside = [n.name for n in cluster.compute_nodes() if n.name not in answering]
        queue = jobs_lib.JobBook(list(answering), outside, parallel=opts.parallel, retries=opts.retries, place=place)
        width = opts.parallel
        asks = f"{place.gpus} GPU(s), {place.cpus} CPU(s)" if not place.exclusive else "a whole node"
        say("tune", f"study {opts.study}: each trial a Slurm job ({asks}) on {', '.join(answering)}, {width} at a time")
    else:
        slots = slot_lib.node_slots({name: s.gpus for name, s in shapes.items()}, per_gpu=opts.per_gpu)
        queue = slot_lib.SlotQueue(slots, parallel=opts.parallel, retries=opts.retries)
        width = min(opts.parallel, len(slots))
        say(
            "tune",
            f"study {opts.study}: {len(slots)} slot(s) ({', '.join(map(str, slots))}), {opts.parallel} at a time",
        )
    sweep = _Sweep(cluster, answering, st, space, opts, queue, on_line, say)
    sweep.run_as = {name: shape.run_as for name, shape in shapes.items()}
    workers = [threading.Thread(target=sweep.worker, name=f"tune-{i}", daemon=True) for i in range(width)]
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
        ("slurm_job", end.slurm_job),
        ("run_id", end.run_id),
        ("seconds", round(end.seconds, 1)),
        ("reason", end.reason[-500:]),
        ("checkpoint", end.checkpoint),
    ):
        if value:
            trial.set_user_attr(name, value)
