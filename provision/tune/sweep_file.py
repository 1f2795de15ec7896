"""A sweep of any program: a YAML file whose keys follow W&B's sweep configuration, checked
whole before anything is touched::

    program: train.py              # run by the job's python in the synced workdir
    method: bayes                  # grid, random, or bayes (Optuna's TPE)
    metric:
      name: val_loss               # a key of the JSON lines the program writes
      goal: minimize
    parameters:
      lr:
        distribution: log_uniform_values
        min: 1e-5
        max: 1e-2
      batch_size:
        values: [16, 32, 64]
      epochs:
        value: 3
    early_terminate:
      type: hyperband
      min_iter: 2
    run_cap: 12

provision's own keys: ``workdir`` (default: the sweep file's directory), ``pip`` (as a
task's), ``task`` (a task file whose workdir, envs and setup the trials take; its ``run``
is replaced by the program). Each trial gets its parameters as ``--name=value`` flags.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision.errors import InputError, Problem
from provision.jobs import task as task_lib

KNOWN = {"program", "method", "metric", "parameters", "early_terminate", "run_cap", "name", "description",
         "workdir", "pip", "task", "command"}  # fmt: skip
METHODS = ("grid", "random", "bayes")
DISTRIBUTIONS = {
    "uniform": "float",
    "log_uniform_values": "log",
    "int_uniform": "int",
    "q_uniform": "float",
    "categorical": "values",
    "constant": "value",
}
PARAM = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
MAX_VALUES = 10_000


@dataclass(frozen=True)
class Param:
    """One searched parameter."""

    name: str  # the program's flag: --name=value
    kind: str  # "values", "value", "float", "log", "int"
    values: tuple[Any, ...] = ()  # values/value
    low: float = 0.0  # a range's min
    high: float = 0.0  # a range's max
    step: float | None = None  # q_uniform's q


@dataclass(frozen=True)
class Sweep:
    program: str  # path inside the workdir
    method: str
    metric: str
    minimize: bool
    params: tuple[Param, ...]
    workdir: Path
    hyperband: tuple[int, int] | None = None  # (min_iter, eta) of early_terminate
    run_cap: int | None = None
    name: str = "sweep"
    pip: tuple[str, ...] = ()
    base: task_lib.Task | None = None  # the task file's workdir, envs and setup
    problems: list[str] = field(default_factory=list)


def load(path: Path) -> Sweep:
    where = str(path)
    if not path.is_file():
        raise InputError(Problem(where, "not a sweep file (no such regular file)"))
    if path.stat().st_size > task_lib.TASK_MAX_BYTES:
        raise InputError(Problem(where, "too large to be a sweep file"))
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(Problem(where, f"cannot be read ({e})")) from None
    data = task_lib._parse_yaml(where, text)
    return from_mapping(data, where, path.resolve().parent)


def from_mapping(data: dict[str, Any], where: str, base: Path) -> Sweep:
    problems: list[Problem] = []

    def bad(key: str, what: str, fix: str = "") -> None:
        problems.append(Problem(f"{where}: {key}", what, fix))

    _keys(data, bad)
    program, method = _program(data.get("program"), bad), data.get("method", "random")
    if method not in METHODS:
        bad("method", f"{method!r} is not one of {', '.join(METHODS)}")
    metric, minimize = _metric(data.get("metric"), bad)
    params = _params(data.get("parameters"), bad)
    if method == "grid" and any(p.kind not in ("values", "value") for p in params):
        bad("parameters", "a grid searches listed values only (values: [...] or value: x)")
    hyperband = _early(data.get("early_terminate"), bad)
    cap = data.get("run_cap")
    if cap is not None and (type(cap) is not int or not 1 <= cap <= MAX_VALUES):
        bad("run_cap", f"{cap!r} is not a number of trials from 1 to {MAX_VALUES}")
    base_task = _task(data.get("task"), base, bad)
    workdir = _workdir(data.get("workdir"), base, base_task, bad)
    pip = data.get("pip", [])
    if not isinstance(pip, list) or not all(isinstance(p, str) and p.strip() for p in pip):
        bad("pip", "must be a list of requirement lines")
        pip = []
    if workdir is not None and program is not None and not (workdir / program).is_file():
        bad("program", f"{workdir / program} is not a file")
    name = data.get("name", "sweep")
    if not isinstance(name, str) or not task_lib.NAME.fullmatch(name):
        bad("name", f"{name!r} is not a name (letters, digits, . _ -)")
    if problems:
        raise InputError(problems)
    assert workdir is not None
    assert isinstance(program, str)
    return Sweep(program, method, metric, minimize, params, workdir, hyperband, cap, name, tuple(pip), base_task)


def _keys(data: dict[str, Any], bad: Any) -> None:
    for key in data:
        if key not in KNOWN:
            bad(str(key), "unknown key", f"sweep keys: {', '.join(sorted(KNOWN))}")
    if "command" in data:
        bad("command", "not supported: each trial runs `python PROGRAM --name=value ...`")


def _program(program: Any, bad: Any) -> str | None:
    if not isinstance(program, str) or not program or program.startswith(("/", "-")) or ".." in program.split("/"):
        bad("program", f"{program!r} is not a path inside the workdir, e.g. train.py")
        return None
    return program


def _metric(value: Any, bad: Any) -> tuple[str, bool]:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        bad("metric", "needs a name (the key of the JSON lines the program writes) and a goal")
        return "", True
    goal = value.get("goal", "minimize")
    if goal not in ("minimize", "maximize"):
        bad("metric.goal", f"{goal!r} is not minimize or maximize")
    for key in value:
        if key not in ("name", "goal"):
            bad(f"metric.{key}", "unknown key", "name, goal")
    return value["name"], goal != "maximize"


def _params(value: Any, bad: Any) -> tuple[Param, ...]:
    if not isinstance(value, dict) or not value:
        bad("parameters", "needs at least one parameter")
        return ()
    out = []
    for name, spec in value.items():
        key = f"parameters.{name}"
        if not isinstance(name, str) or not PARAM.fullmatch(name):
            bad(key, "is not a flag name (letters, digits, _ . -)")
        elif not isinstance(spec, dict):
            bad(key, "must be a mapping (values, value, or min/max with a distribution)")
        else:
            param = _param(name, spec, lambda what, k=key: bad(k, what))
            if param is not None:
                out.append(param)
    return tuple(out)


def _param(name: str, spec: dict[str, Any], bad: Any) -> Param | None:
    if "values" in spec:
        values = spec["values"]
        if (
            not isinstance(values, list)
            or not values
            or len(values) > MAX_VALUES
            or not all(_scalar(v) for v in values)
        ):
            bad("values must be a list of numbers or strings")
            return None
        return Param(name, "values", tuple(values))
    if "value" in spec:
        return Param(name, "value", (spec["value"],)) if _scalar(spec["value"]) else bad("value is not a scalar")
    low, high = _number(spec.get("min")), _number(spec.get("max"))
    if low is None or high is None or not low < high:
        bad("needs values, value, or min < max (finite numbers)")
        return None
    whole = type(spec["min"]) is int and type(spec["max"]) is int
    dist = spec.get("distribution") or ("int_uniform" if whole else "uniform")
    kind = DISTRIBUTIONS.get(dist)
    if kind not in ("float", "log", "int"):
        bad(f"distribution {dist!r} is not one of uniform, int_uniform, log_uniform_values, q_uniform")
        return None
    if kind == "log" and low <= 0:
        bad("log_uniform_values needs min > 0")
        return None
    q = spec.get("q") if dist == "q_uniform" else None
    if q is not None and (type(q) not in (int, float) or q <= 0):
        bad("q must be a positive number")
        return None
    return Param(name, kind, (), low, high, float(q) if q else None)


def _number(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) and math.isfinite(v) else None


def _scalar(v: Any) -> bool:
    return (type(v) in (int, float, str, bool)) and not (type(v) is float and not math.isfinite(v))


def _early(value: Any, bad: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "hyperband":
        bad("early_terminate", "only type: hyperband is supported")
        return None
    min_iter, eta = value.get("min_iter", 1), value.get("eta", 3)
    if type(min_iter) is not int or min_iter < 1 or type(eta) is not int or eta < 2:
        bad("early_terminate", "min_iter must be a whole number >= 1 and eta >= 2")
        return None
    return min_iter, eta


def _task(value: Any, base: Path, bad: Any) -> task_lib.Task | None:
    if value is None:
        return None
    if not isinstance(value, str):
        bad("task", "must be a task file's path")
        return None
    try:
        return task_lib.load((base / value).resolve())
    except InputError as e:
        for p in e.problems:
            bad("task", str(p))
        return None


def _workdir(value: Any, base: Path, base_task: task_lib.Task | None, bad: Any) -> Path | None:
    if value is None:
        return base_task.workdir if base_task and base_task.workdir else base
    if not isinstance(value, str) or not (base / value).resolve().is_dir():
        bad("workdir", f"{value!r} is not a directory")
        return None
    return (base / value).resolve()


def grid_size(sweep: Sweep) -> int:
    n = 1
    for p in sweep.params:
        n *= len(p.values)
    return n


def flags(params: dict[str, Any]) -> list[str]:
    """W&B's convention: each parameter as --name=value."""
    return [f"--{k}={v}" for k, v in params.items()]
