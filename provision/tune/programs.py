"""A sweep of any program (tune/sweep_file.py): Optuna asks, each trial is a one-node job
(jobs.run: the workdir synced, the env layered and cached, over SSH on a node of its own
or as a Slurm job), its parameters passed as --name=value flags, its metric read from the
JSON lines it writes. A line of its output that is a JSON object holding the metric (and a
``step``) is an intermediate value: with ``early_terminate: hyperband`` a trial the pruner
stops is torn down like any job. The best trial is named, and its outputs kept."""

from __future__ import annotations

import json
import shlex
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provision.inventory import Cluster, Node
from provision.jobs.task import Task
from provision.tune import study as study_lib
from provision.tune.sweep_file import Param, Sweep, flags


@dataclass
class ProgramOptions:
    runs_dir: Path  # runs/tune/<name>/: the study's journal, each trial's run, best/
    trials: int  # trials to finish (complete or pruned)
    parallel: int  # trials at once
    scheduler: str  # "ssh": a node per trial; "slurm": Slurm places each one
    seed: int | None = None
    retries: int = 2  # failed trials asked again, at most this many in all


@dataclass
class TrialRow:
    number: int
    params: dict[str, Any]
    state: str  # COMPLETE, PRUNED, FAIL
    value: float | None
    run_id: str | None
    node: str | None
    why: str = ""  # a failure's or a pruning's reason
    outputs: str | None = None  # the trial's outputs copied back here


@dataclass
class ProgramResult:
    name: str
    metric: str
    goal: str
    rows: list[TrialRow] = field(default_factory=list)
    best: TrialRow | None = None
    best_outputs: str | None = None  # runs/tune/<name>/best: the best trial's outputs
    study_dir: str = ""
    failure: str | None = None


def distributions(params: tuple[Param, ...]) -> dict[str, Any]:
    """Optuna's distributions of the searched parameters (a single value is a constant)."""
    import optuna

    out: dict[str, Any] = {}
    for p in params:
        if p.kind == "values":
            out[p.name] = optuna.distributions.CategoricalDistribution(list(p.values))
        elif p.kind == "int":
            out[p.name] = optuna.distributions.IntDistribution(int(p.low), int(p.high))
        elif p.kind in ("float", "log"):
            out[p.name] = optuna.distributions.FloatDistribution(p.low, p.high, log=p.kind == "log", step=p.step)
    return out


def constants(params: tuple[Param, ...]) -> dict[str, Any]:
    return {p.name: p.values[0] for p in params if p.kind == "value"}


def open_study(sweep: Sweep, opts: ProgramOptions) -> Any:
    import optuna

    storage = study_lib.storage(opts.runs_dir)
    if sweep.method == "grid":
        space = {p.name: list(p.values) for p in sweep.params if p.kind == "values"}
        sampler: Any = study_lib.grid_sampler(space, opts.seed)  # the sweep counts its trials itself
    elif sweep.method == "random":
        sampler = optuna.samplers.RandomSampler(seed=opts.seed)
    else:
        # As the trainer's sweeps: a few random start-up trials, and running trials lied about.
        sampler = optuna.samplers.TPESampler(seed=opts.seed, n_startup_trials=4, constant_liar=True)
    pruner: Any = optuna.pruners.NopPruner()
    if sweep.hyperband:
        min_iter, eta = sweep.hyperband
        pruner = optuna.pruners.HyperbandPruner(min_resource=min_iter, reduction_factor=eta)
    return optuna.create_study(
        storage=storage,
        sampler=sampler,
        pruner=pruner,
        study_name=sweep.name,
        direction="minimize" if sweep.minimize else "maximize",
        load_if_exists=True,
    )


def trial_task(sweep: Sweep, params: dict[str, Any], number: int) -> Task:
    """The trial as a job: the program with its flags, in the sweep's workdir."""
    run = shlex.join(["python", sweep.program, *flags(params)])
    base = sweep.base or Task(run=run)
    return replace(
        base,
        run=run,
        name=f"{sweep.name}-{number}",
        workdir=sweep.workdir,
        num_nodes=1,
        pip=(*base.pip, *sweep.pip),
        source=f"sweep {sweep.name}",
    )


def metric_of(text: str, name: str) -> tuple[float, int | None] | None:
    """(value, step) from a JSON line holding the metric, or None."""
    text = text.strip()
    if not text.startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or type(data.get(name)) not in (int, float):
        return None
    step = data.get("step")
    return float(data[name]), step if type(step) is int else None


class _Run:
    """The sweep's workers, each on its own node (SSH) or its own Slurm job."""

    def __init__(self, cluster: Cluster, nodes: list[Node], sweep: Sweep, opts: ProgramOptions,
                 say: Callable[[str, str], None], on_line: Callable[[str, str, str], None]):  # fmt: skip
        self.cluster, self.nodes, self.sweep, self.opts = cluster, nodes, sweep, opts
        self.say, self.on_line = say, on_line
        self.study = open_study(sweep, opts)
        self.dists = distributions(sweep.params)
        self.fixed = constants(sweep.params)
        self.lock = threading.Lock()
        self.rows: list[TrialRow] = []
        self.failures = 0
        self.running = 0  # trials asked and not told yet
        self.halt: str | None = None

    def _take(self) -> Any | None:
        with self.lock:
            done = sum(r.state in ("COMPLETE", "PRUNED") for r in self.rows)
            running = self.running
            if self.halt or done + running >= self.opts.trials:
                return None
            if self.sweep.method == "grid" and len(self.rows) + running >= _grid_total(self.sweep):
                return None
            self.running += 1
            return self.study.ask(self.dists)

    def worker(self, node: Node | None) -> None:
        try:
            self._work(node)
        except Exception as e:  # the study itself failed: every worker stops, and it is said
            with self.lock:
                self.halt = self.halt or f"{type(e).__name__}: {e}"

    def _work(self, node: Node | None) -> None:
        while (trial := self._take()) is not None:
            try:
                row = self._one(trial, node)
            finally:
                with self.lock:
                    self.running -= 1
            with self.lock:
                self.rows.append(row)
                if row.state == "FAIL":
                    self.failures += 1
                    if self.failures > self.opts.retries:
                        self.halt = f"{self.failures} trials failed (the last: {row.why})"

    def _one(self, trial: Any, node: Node | None) -> TrialRow:
        import optuna

        from provision import jobs

        params = {**trial.params, **self.fixed}
        stop = threading.Event()
        pruned: list[int] = []

        def line(host: str, who: str, text: str) -> None:
            found = metric_of(text, self.sweep.metric)
            if found and found[1] is not None and not pruned:
                trial.report(found[0], found[1])
                if trial.should_prune():
                    pruned.append(found[1])
                    stop.set()
            self.on_line(host, f"trial{trial.number} {who}", text)

        candidates = [node] if node is not None else self.nodes
        opts = jobs.Options(runs_dir=self.opts.runs_dir / "trials", scheduler=self.opts.scheduler, stop=stop)
        task = trial_task(self.sweep, params, trial.number)
        self.say(candidates[0].name, f"trial {trial.number}: {' '.join(flags(params))}")
        try:
            report = jobs.run(self.cluster, candidates, task, opts, on_line=line, say=self.say)
        except Exception as e:  # a node that cannot take it: the trial fails, the sweep goes on
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return TrialRow(trial.number, params, "FAIL", None, None, None, f"{type(e).__name__}: {e}")
        where = report.nodes[0] if report.nodes else None
        if pruned:
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return TrialRow(trial.number, params, "PRUNED", None, report.run_id, where, f"pruned at step {pruned[0]}")
        value = report.metrics.get(self.sweep.metric)
        if not report.ok or value is None:
            why = report.failure or f"it wrote no {self.sweep.metric!r} metric"
            self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return TrialRow(trial.number, params, "FAIL", None, report.run_id, where, why)
        self.study.tell(trial, value)
        return TrialRow(trial.number, params, "COMPLETE", value, report.run_id, where, outputs=report.outputs)


def _grid_total(sweep: Sweep) -> int:
    from provision.tune.sweep_file import grid_size

    return grid_size(replace(sweep, params=tuple(p for p in sweep.params if p.kind == "values")))


def run(
    cluster: Cluster,
    nodes: list[Node],
    sweep: Sweep,
    opts: ProgramOptions,
    say: Callable[[str, str], None],
    on_line: Callable[[str, str, str], None],
) -> ProgramResult:
    opts.runs_dir.mkdir(parents=True, exist_ok=True)
    r = _Run(cluster, nodes, sweep, opts, say, on_line)
    slots: list[Node | None] = list(nodes[: opts.parallel]) if opts.scheduler == "ssh" else [None] * opts.parallel
    threads = [threading.Thread(target=r.worker, args=(slot,), daemon=True) for slot in slots]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        r.halt = "interrupted (Ctrl-C)"
        raise
    goal = "minimize" if sweep.minimize else "maximize"
    rows = sorted(r.rows, key=lambda x: x.number)
    result = ProgramResult(sweep.name, sweep.metric, goal, rows, study_dir=str(opts.runs_dir), failure=r.halt)
    done = [x for x in result.rows if x.state == "COMPLETE" and x.value is not None]
    if done:
        pick = min if sweep.minimize else max
        result.best = pick(done, key=lambda x: x.value)  # type: ignore[arg-type, return-value]
        result.best_outputs = _keep_best(result.best, opts.runs_dir)
    (opts.runs_dir / "tune.json").write_text(json.dumps(_as_json(result), indent=1, default=str))
    return result


def _keep_best(best: TrialRow, runs_dir: Path) -> str | None:
    """The best trial's outputs copied to runs/tune/<name>/best (replacing an older best)."""
    if not best.outputs or not Path(best.outputs).is_dir():
        return None
    dest = runs_dir / "best"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(best.outputs, dest, symlinks=True)
    return str(dest)


def _as_json(result: ProgramResult) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(result)
