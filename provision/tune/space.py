"""The search space of a sweep: a small TOML file naming trainer flags and their ranges.

    [lr]                 # a float range, sampled on a log scale
    low = 1e-4
    high = 3e-3
    log = true

    [warmup-steps]       # an int range, every 5th value
    low = 0
    high = 50
    step = 5

    [model]              # a list of values
    choices = ["tiny", "small"]

Only the flags in TUNABLE may appear (tests/unit/test_tune_space.py holds the table to the
trainer's own argument parser), each with values of the flag's type. Every problem in a
file is found and reported at once, one line per problem naming the parameter, before any
node is contacted (exit 2 at the command). Optuna's distributions are made from the parsed
space where the study starts; this module only reads and checks."""

from __future__ import annotations

import functools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision import controller_files
from provision.launch import plan

# Trainer flags a sweep may set, and their types ("choice": only the values listed).
# Not here: what a trial's budget, checkpoints, data or logging depend on (--steps,
# --eval-interval, --ckpt-*, --data*, --run-id...); the sweep sets those itself.
TUNABLE: dict[str, str] = {
    "lr": "float",
    "weight-decay": "float",
    "dropout": "float",
    "grad-clip": "float",
    "warmup-steps": "int",
    "lr-decay-steps": "int",
    "global-batch": "int",
    "micro-batch": "int",
    "n-layer": "int",
    "n-head": "int",
    "n-embd": "int",
    "seed": "int",
    "model": "choice",
}


@functools.cache
def model_presets() -> tuple[str, ...]:
    """The trainer's size presets (its MODEL_SIZES, read from its source by launch)."""
    return tuple(sorted(plan.model_sizes()))


# Where a flag has a natural lower bound, a range that crosses it is refused here rather
# than by the trainer on a node, trials into the study.
BOUNDS: dict[str, tuple[float, float]] = {
    "lr": (0.0, math.inf),
    "weight-decay": (0.0, math.inf),
    "dropout": (0.0, 1.0),
    "grad-clip": (0.0, math.inf),
    "warmup-steps": (0, math.inf),
    "lr-decay-steps": (0, math.inf),
    "global-batch": (1, math.inf),
    "micro-batch": (1, math.inf),
    "n-layer": (1, math.inf),
    "n-head": (1, math.inf),
    "n-embd": (1, math.inf),
    "seed": (0, math.inf),
}

MAX_CHOICES = 1000  # a longer list is a mistake (a generated file gone wrong), not a sweep


@dataclass(frozen=True)
class Param:
    """One flag's searched values: a range (low..high, log scale or every ``step``th
    value) or a list of ``choices``."""

    flag: str
    kind: str  # "float", "int" or "choice"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] = ()

    def grid_points(self) -> int | None:
        """How many values a grid search tries for this flag, or None for a continuous
        range (a float range without ``step``), which no grid can cover."""
        if self.choices:
            return len(self.choices)
        if self.low is None or self.high is None:
            return None
        if self.kind == "int":
            return int((self.high - self.low) // (self.step or 1)) + 1
        if self.step:  # a float range in steps: low, low + step, ... up to high
            points = (self.high - self.low) / self.step + 1e-9
            # a step of 5e-324 makes the count infinite: more than any grid (refused as such)
            return math.floor(points) + 1 if math.isfinite(points) and points < 2**31 else 2**31
        return None

    def argv(self, value: Any) -> list[str]:
        """The trainer's command-line words for this flag set to ``value``."""
        return [f"--{self.flag}", str(value)]


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]

    def grid_size(self) -> int | None:
        """Points in the full grid, or None when a flag's range is continuous."""
        size = 1
        for p in self.params:
            points = p.grid_points()
            if points is None:
                return None
            size *= points
        return size


class SpaceError(ValueError):
    """A space file that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, path: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"{path}: " + "; ".join(problems))


SPACE_MAX_BYTES = 2**20  # a few flags and their ranges


def load(path: str | Path, *, trials: int, sampler: str) -> Space:
    """The space in ``path``, checked for a study of ``trials`` trials with ``sampler``
    ("tpe", "random" or "grid"); SpaceError listing every problem otherwise."""
    try:
        text = controller_files.read_small_text(Path(path), SPACE_MAX_BYTES)  # a FIFO would hang the read
    except controller_files.Unreadable as e:
        raise SpaceError(str(path), [f"cannot read it: {e}"]) from None
    return parse(text, str(path), trials=trials, sampler=sampler)


def parse(text: str, where: str, *, trials: int, sampler: str) -> Space:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpaceError(where, [f"not TOML: {e}"]) from None
    problems: list[str] = []
    params: list[Param] = []
    for flag, table in doc.items():
        param = _param(flag, table, problems)
        if param is not None:
            params.append(param)
    if not doc:
        problems.append("no parameters: name at least one trainer flag, e.g. [lr] low = 1e-4 high = 1e-2 log = true")
    if not problems and sampler == "grid":
        problems += _grid_problems(params, trials)
    if problems:
        raise SpaceError(where, problems)
    return Space(tuple(params))


def _param(flag: str, table: Any, problems: list[str]) -> Param | None:
    kind = TUNABLE.get(flag)
    if kind is None:
        dashed = flag.replace("_", "-") in TUNABLE
        hint = " (write flags as the trainer does, with dashes: weight-decay)" if dashed else ""
        problems.append(f"{flag}: not a flag a sweep can set{hint}; these can: {', '.join(sorted(TUNABLE))}")
        return None
    if not isinstance(table, dict):
        problems.append(f"{flag}: give a table ([{flag}] with low/high or choices), not a single value")
        return None
    unknown = sorted(set(table) - {"low", "high", "log", "step", "choices"})
    if unknown:
        problems.append(f"{flag}: unknown key {', '.join(unknown)} (keys: low, high, log, step, choices)")
        return None
    if "choices" in table:
        return _choices(flag, kind, table, problems)
    if kind == "choice":
        problems.append(f"{flag}: give choices (one or more of {', '.join(model_presets())})")
        return None
    return _range(flag, kind, table, problems)


def _choices(flag: str, kind: str, table: dict[str, Any], problems: list[str]) -> Param | None:
    if set(table) != {"choices"}:
        problems.append(f"{flag}: choices is a list of values; low, high, log and step do not go with it")
        return None
    values = table["choices"]
    if not isinstance(values, list) or not values:
        problems.append(f"{flag}: choices must be a non-empty list")
        return None
    if len(values) > MAX_CHOICES:
        problems.append(f"{flag}: {len(values)} choices; at most {MAX_CHOICES}")
        return None
    bad = [v for v in values if not _of_kind(v, kind)]
    if bad:
        want = {"float": "numbers", "int": "whole numbers", "choice": f"one of {', '.join(model_presets())}"}[kind]
        problems.append(f"{flag}: choices must be {want}; not {', '.join(repr(v) for v in bad[:3])}")
        return None
    if len(set(values)) != len(values):
        problems.append(f"{flag}: a value is listed twice")
        return None
    out_of_bounds = [v for v in values if kind != "choice" and not _within(flag, v)]
    if out_of_bounds:
        problems.append(f"{flag}: {out_of_bounds[0]!r} is outside {_bounds_text(flag)}")
        return None
    return Param(flag, "choice", choices=tuple(float(v) if kind == "float" else v for v in values))


def _range(flag: str, kind: str, table: dict[str, Any], problems: list[str]) -> Param | None:
    missing = [k for k in ("low", "high") if k not in table]
    if missing:
        problems.append(f"{flag}: give {' and '.join(missing)} (or choices)")
        return None
    low, high, step, log = table["low"], table["high"], table.get("step"), table.get("log", False)
    problem = _type_problem(kind, low, high, step, log) or _shape_problem(flag, low, high, step, log)
    if problem:
        problems.append(f"{flag}: {problem}")
        return None
    number = int if kind == "int" else float
    return Param(flag, kind, number(low), number(high), log, number(step) if step is not None else None)


def _type_problem(kind: str, low: Any, high: Any, step: Any, log: Any) -> str | None:
    for key, value in (("low", low), ("high", high)) + ((("step", step),) if step is not None else ()):
        if not _of_kind(value, kind):
            return f"{key} must be a {'whole number' if kind == 'int' else 'number'}, not {value!r}"
    if not isinstance(log, bool):
        return f"log must be true or false, not {log!r}"
    return None


def _shape_problem(flag: str, low: float, high: float, step: float | None, log: bool) -> str | None:
    if not low < high:
        return f"empty range: low {low} is not below high {high}"
    if not (_within(flag, low) and _within(flag, high)):
        return f"{low}..{high} is outside {_bounds_text(flag)}"
    if log and low <= 0:
        return f"a log scale needs low above 0, not {low}"
    if step is None:
        return None
    if step <= 0:
        return f"step must be above 0, not {step}"
    if log:
        return "step and log do not go together (Optuna samples one or the other)"
    if step > high - low:
        return f"step {step} is wider than the range {low}..{high}"
    return None


def _grid_problems(params: list[Param], trials: int) -> list[str]:
    continuous = [p.flag for p in params if p.grid_points() is None]
    if continuous:
        return [f"{f}: a grid needs a step or choices for a float range" for f in continuous]
    size = Space(tuple(params)).grid_size()
    # The trainer's defaults run first (an enqueued trial, not a grid point): a grid of N
    # points needs N + 1 trials.
    if size is not None and size + 1 > trials:
        return [
            f"the grid has {size} points and --trials is {trials}: the defaults run first, so the grid needs "
            f"--trials {size + 1}; raise --trials or narrow the space"
        ]
    return []


def _of_kind(value: Any, kind: str) -> bool:
    if isinstance(value, bool):  # TOML's true is not a number to a sweep
        return False
    if kind == "int":
        return isinstance(value, int)
    if kind == "float":
        return isinstance(value, (int, float)) and math.isfinite(value)
    return value in model_presets()


def _within(flag: str, value: float) -> bool:
    low, high = BOUNDS.get(flag, (-math.inf, math.inf))
    return low <= value <= high


def _bounds_text(flag: str) -> str:
    low, high = BOUNDS[flag]
    return f"{low} or more" if high == math.inf else f"{low}..{high}"
