"""Validate results kept per host, so a slow decline shows before it becomes a failure.

One JSON line per run and host in ``<state>/validate/<host>.jsonl``, where ``<state>`` is
the controller's state directory (provision.state: $PROVISION_STATE_DIR, else
$XDG_STATE_HOME/provision, else ~/.local/state/provision). ``trend()`` turns a host's lines into
rows: first, previous and latest value per metric, and the change since the previous run.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision import verdicts
from provision.errors import InputError, Problem
from provision.validate.records import NodeResult


def state_dir() -> Path:
    """Where the history lives: validate/ in the controller's state directory."""
    return verdicts.state_dir()


def _file(host: str, base: Path) -> Path:
    path = verdicts.host_file(host, base)
    if path is None:
        raise InputError(Problem(f"--history {host}", "not a host name", "use the inventory name"))
    return path


def entry(result: NodeResult, created: str, mode: str) -> dict[str, Any]:
    """One history line: verdict and every measured value, keyed metric or metric[device]."""
    values = {
        (f"{f.metric}[{f.device}]" if f.device else f.metric): f.value for f in result.findings if f.value is not None
    }
    return {"created": created, "mode": mode, "verdict": result.verdict, "sku": result.sku, "values": values}


def append(results: list[NodeResult], created: str, mode: str, base: Path | None = None) -> None:
    base = base or state_dir()
    base.mkdir(parents=True, exist_ok=True)
    for r in results:
        _append_line(_file(r.node, base), json.dumps(entry(r, created, mode)))


def _append_line(path: Path, line: str) -> None:
    """One line added in one write, and on disk before validate reports. A crash mid-write
    leaves a last line without its newline (read() skips it); the next line then starts on
    a line of its own instead of being glued to the torn one and lost with it."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        os.write(fd, (("\n" if torn else "") + line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read(host: str, base: Path | None = None) -> list[dict[str, Any]]:
    path = _file(host, base or state_dir())
    if not path.is_file():
        raise InputError(
            Problem(
                str(path),
                f"no validate history for {host}",
                "run `provision validate` on an inventory with this host first",
            )
        )
    return verdicts.lines(path)


def last_run(host: str, base: Path | None = None) -> tuple[str, str] | None:
    """(verdict, created) of the host's latest recorded run; None when it has none."""
    return verdicts.last_run(host, base or state_dir())


@dataclass(frozen=True)
class TrendRow:
    """One metric across a host's runs."""

    key: str  # metric or metric[device]
    runs: int  # runs that measured it
    first: float  # oldest value
    previous: float | None  # the run before the latest
    latest: float  # newest value
    change: float | None  # latest / previous - 1


def trend(lines: list[dict[str, Any]]) -> list[TrendRow]:
    series: dict[str, list[float]] = {}
    for line in lines:
        values = line.get("values") if isinstance(line, dict) else None
        # A line another version wrote, or a hand edit: what is not a number is skipped.
        for key, value in values.items() if isinstance(values, dict) else ():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                series.setdefault(str(key), []).append(float(value))
    rows = []
    for key in sorted(series):
        v = series[key]
        prev = v[-2] if len(v) > 1 else None
        change = (v[-1] / prev - 1) if prev else None
        rows.append(TrendRow(key, len(v), v[0], prev, v[-1], change))
    return rows
