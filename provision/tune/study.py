"""The sweep's Optuna study: where it is stored, its sampler and pruner, the search space
as Optuna distributions, and the trainer's defaults as the first (enqueued) trial.

Storage: Optuna's journal file in the study's directory on the controller
(``runs/tune/<study>/study.journal``). Only the controller writes it: a trial on a node
never opens the study; the controller reads the trainer's evaluation lines from the
trial's log stream and reports them. So no node needs credentials for a shared database,
nothing a node's training user writes reaches the study unparsed, and the journal's
writers are this process's trial threads, which Optuna's journal storage serialises (its
file lock, taken for every append). `optuna-dashboard <journal>` opens the live study.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Any

from provision.launch import plan
from provision.resources import training_script
from provision.tune.space import Param, Space

JOURNAL = "study.journal"
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "hyperband", "none")

# Trainer flag -> the module constant its parser takes as default (read from the source,
# since importing the trainer imports torch; a unit test holds the table to the parser).
DEFAULT_CONSTANTS = {
    "lr": "LEARNING_RATE",
    "weight-decay": "WEIGHT_DECAY",
    "dropout": "DROPOUT",
    "grad-clip": "GRAD_CLIP",
    "warmup-steps": "WARMUP_STEPS",
    "lr-decay-steps": "LR_DECAY_STEPS",
    "seed": "SEED",
}


@functools.cache
def trainer_constants() -> dict[str, Any]:
    """The trainer's module-level constants that are plain literals."""
    found: dict[str, Any] = {}
    for node in ast.parse(training_script().read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def defaults(space: Space, *, model: str, global_batch: int, micro_batch: int) -> dict[str, Any]:
    """Each searched flag at the value a trial without the sweep would run with: the
    trainer's own default, or what tune passes every trial (model, batch). This is the
    study's first trial, so the study shows what tuning gained over it."""
    sizes = plan.model_sizes()[model]
    known: dict[str, Any] = {
        **{flag: trainer_constants()[const] for flag, const in DEFAULT_CONSTANTS.items()},
        "model": model,
        "global-batch": global_batch,
        "micro-batch": micro_batch,
        "n-layer": sizes[0],
        "n-head": sizes[1],
        "n-embd": sizes[2],
    }
    return {p.flag: known[p.flag] for p in space.params}


def inside(space: Space, values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the values the space holds, one line per value it does not). Optuna can fix a
    trial's parameter only to a value of its distribution (a choice not listed raises; 0
    on a log scale breaks TPE), so a default outside the space is sampled instead, said."""
    kept, outside = {}, []
    for p in space.params:
        value = values[p.flag]
        if p.choices:
            ok = value in p.choices
        else:
            assert p.low is not None
            assert p.high is not None
            ok = p.low <= value <= p.high and (not p.step or p.kind != "int" or (value - p.low) % p.step == 0)
            ok = ok and not (p.log and value <= 0)
        if ok:
            kept[p.flag] = value
        else:
            outside.append(f"{p.flag}: the default {value!r} is outside the space; the defaults trial samples it")
    return kept, outside


def distributions(space: Space) -> dict[str, Any]:
    """Optuna distributions keyed by trainer flag."""
    from optuna import distributions as d

    out: dict[str, Any] = {}
    for p in space.params:
        if p.choices:
            out[p.flag] = d.CategoricalDistribution(list(p.choices))
        elif p.kind == "int":
            out[p.flag] = d.IntDistribution(int(p.low or 0), int(p.high or 0), log=p.log, step=int(p.step or 1))
        else:
            out[p.flag] = d.FloatDistribution(float(p.low or 0), float(p.high or 0), log=p.log, step=p.step)
    return out


def grid_values(param: Param) -> list[Any]:
    """Every value a grid search tries for one flag (space.py refused continuous ranges)."""
    if param.choices:
        return list(param.choices)
    low, high, step = param.low, param.high, param.step or 1
    assert low is not None
    assert high is not None
    points = param.grid_points() or 1
    if param.kind == "int":
        return [int(low) + i * int(step) for i in range(points)]
    return [round(float(low) + i * float(step), 12) for i in range(points)]


def sampler(name: str, space: Space, seed: int | None) -> Any:
    import optuna

    if name == "grid":
        return grid_sampler({p.flag: grid_values(p) for p in space.params}, seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # A small sweep (the testbed's 8 trials) must leave TPE some trials to model; Optuna's
    # default 10 random start-up trials would make the whole study random.
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4, constant_liar=True)


def grid_sampler(search_space: dict[str, list[Any]], seed: int | None) -> Any:
    import optuna

    class GridForAskAndTell(optuna.samplers.GridSampler):
        """Optuna's GridSampler, less its study.stop() once every point was tried: Optuna
        allows that call only inside study.optimize, and the sweep asks and tells from
        its own threads (it counts the trials itself: --trials, at most the grid)."""

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return GridForAskAndTell(search_space, seed=seed)


def pruner(name: str, *, eval_interval: int, steps: int) -> Any:
    """``median``: stop a trial whose loss at an evaluation is worse than the median of
    earlier trials at that step, once two trials have finished and after the first
    evaluation. ``hyperband``: resources counted in training steps."""
    import optuna

    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=eval_interval, interval_steps=1)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=eval_interval, max_resource=steps, reduction_factor=3)
    return optuna.pruners.NopPruner()


def storage(study_dir: Path) -> Any:
    """The study's journal storage, made on first use."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    study_dir.mkdir(parents=True, exist_ok=True)
    path = str(study_dir / JOURNAL)
    # The open-lock (O_EXCL lock file) rather than the default symlink lock: it works on
    # every filesystem the runs directory may be on.
    return optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))


def dashboard_command(study_dir: Path) -> str:
    """The command that opens the live study in optuna-dashboard."""
    import shlex

    return f"optuna-dashboard {shlex.quote(str(study_dir / JOURNAL))}"
