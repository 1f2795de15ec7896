"""Trainer and torchrun output: split into prefixed lines, and parse what the report needs.

Every parser here is a pure function of text, tested on real captured output.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

_RANK = re.compile(r"^\[rank(\d+)\]:(.*)$")
_STEP = re.compile(r"^step (\d+)/\d+ \| train loss ([\d.]+) .*\| (\d+) tok/s")
_VAL = re.compile(r"^step (\d+)/\d+ \| val loss ([\d.]+)")
_RESUMED = re.compile(r"^resumed from .* at step (\d+)")
_MODEL = re.compile(r"^model \S+: .*; world (\d+) on ")  # the trainer's line at every start


def split_rank(line: str) -> tuple[str, str]:
    """('rank3', text) for a worker line (torchrun's --tee prefix), ('torchrun', line) else."""
    m = _RANK.match(line)
    return (f"rank{m.group(1)}", m.group(2)) if m else ("torchrun", line)


SUMMARY_MAX_CHARS = 64_000  # a longer "summary" line is not the trainer's


@dataclass(frozen=True)
class Start:
    """One start of the trainer's workers: the first, and each restart (elastic, requeue)."""

    at: float  # controller monotonic clock when its first line arrived
    world: int  # ranks
    resumed_from: int  # the checkpoint step it continued from; 0: from the start
    last_step: int  # the last step logged before it (steps past resumed_from are done again)
    first_step_at: float | None = None  # when its first training step was logged


@dataclass
class Curves:
    """Loss and throughput curves from rank 0's lines."""

    train: list[tuple[int, float]] = field(default_factory=list)  # (step, train loss)
    val: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    tokens_per_s: list[tuple[int, float]] = field(default_factory=list)  # (step, global tok/s)
    summary: dict[str, Any] | None = None  # the trainer's closing "summary {...}" line
    starts: list[Start] = field(default_factory=list)  # every start of the workers, in order
    _resumed: int = 0  # the step of the last "resumed from" line, for the start line after it
    _last_step: int = 0  # the highest step logged so far

    def feed(self, text: str, at: float | None = None) -> None:
        """One rank-0 line; ``at``: when it arrived (default: now, on the monotonic clock)."""
        now = time.monotonic() if at is None else at
        if m := _RESUMED.match(text):
            self._resumed = int(m.group(1))
        elif m := _MODEL.match(text):
            self.starts.append(Start(now, int(m.group(1)), self._resumed, self._last_step))
            self._resumed = 0
        elif m := _STEP.match(text):
            if self.starts and self.starts[-1].first_step_at is None:
                self.starts[-1] = replace(self.starts[-1], first_step_at=now)
            step = int(m.group(1))
            self._last_step = max(self._last_step, step)
            if self.train and step <= self.train[-1][0]:
                # A restart (a requeued Slurm job) trains again from its checkpoint: the
                # steps since then are the new attempt's, the earlier ones are dropped.
                self.train = [p for p in self.train if p[0] < step]
                self.tokens_per_s = [p for p in self.tokens_per_s if p[0] < step]
                self.val = [p for p in self.val if p[0] < step]
            self.train.append((step, float(m.group(2))))
            self.tokens_per_s.append((step, float(m.group(3))))
        elif m := _VAL.match(text):
            self.val.append((int(m.group(1)), float(m.group(2))))
        elif text.startswith("summary {") and len(text) <= SUMMARY_MAX_CHARS:
            with contextlib.suppress(json.JSONDecodeError, RecursionError):  # a line cut short: keep going
                doc = json.loads(text[len("summary ") :])
                if isinstance(doc, dict):
                    self.summary = doc


@dataclass(frozen=True)
class RankFailure:
    """One "Root Cause" entry of torchrun's failure report."""

    rank: int  # global rank
    exitcode: int  # negative: killed by that signal
    time: str  # torchrun's time stamp, YYYY-mm-dd_HH:MM:SS

    @property
    def by_signal(self) -> bool:
        return self.exitcode < 0


_FIELD = re.compile(r"^\s*(time|rank|exitcode)\s*:\s*(\S+)")


def rank_failures(torchrun_output: str) -> list[RankFailure]:
    """Every failed rank torchrun reports (Root Cause and Failures sections)."""
    out, cur = [], {}
    for line in torchrun_output.splitlines():
        m = _FIELD.match(line)
        if not m:
            continue
        cur[m.group(1)] = m.group(2)
        if m.group(1) == "exitcode" and {"time", "rank"} <= cur.keys():
            with contextlib.suppress(ValueError):  # "<N/A>" fields
                out.append(RankFailure(int(cur["rank"]), int(cur["exitcode"]), cur["time"]))
            cur = {}
    return out


def first_failure(by_host: dict[str, list[RankFailure]]) -> tuple[str, RankFailure] | None:
    """The failure that started it: a rank killed by a signal (nothing else kills a rank
    with a signal during a run) before one that raised, then the earliest time stamp.
    The ranks that lost a peer fail afterwards with errors, so they sort later."""
    every = [(host, f) for host, fs in by_host.items() for f in fs]
    if not every:
        return None
    return min(every, key=lambda hf: (not hf[1].by_signal, hf[1].time))


def blame(
    failure: str | None, host: str | None, torchrun_text: dict[str, str]
) -> tuple[str | None, str | None, int | None]:
    """(failure, host, rank) after reading torchrun's reports from every host.

    Not for Ctrl-C or a timeout (host None: the cause is known). SIGTERM deaths are left
    out: that is what the teardown sends. After a lost connection only a rank killed by a
    signal outranks it; ranks that exited with an error had lost their peer.
    """
    if not failure or host is None:
        return failure, host, None
    lost = "connection lost" in failure
    reports = {
        h: [f for f in rank_failures(text) if f.exitcode != -15 and (f.by_signal or not lost)]
        for h, text in torchrun_text.items()
    }
    first = first_failure(reports)
    if not first:
        return failure, host, None
    first_host, f = first
    how = f"killed by signal {-f.exitcode}" if f.by_signal else f"exit code {f.exitcode}"
    return f"{first_host} rank {f.rank} failed first ({how}); {failure}", first_host, f.rank


class LineSink:
    """A file-like that invoke writes remote output into: cuts it into lines, saves each
    to the host's log file and hands it to a callback (console, parsers). ``unprefixed``:
    who a line without a [rankN]: prefix is from (plan.RunPlan.unprefixed)."""

    def __init__(self, host: str, log: IO[str], on_line: Callable[[str, str, str], None], unprefixed: str = "torchrun"):
        self.host, self._log, self._on_line, self._unprefixed = host, log, on_line, unprefixed
        self._buf = ""
        self._lock = threading.Lock()

    def write(self, data: str) -> int:
        with self._lock:
            self._buf += data
            *lines, self._buf = self._buf.split("\n")
        for line in lines:
            self._emit(line.rstrip("\r"))
        return len(data)

    def _emit(self, line: str) -> None:
        self._log.write(line + "\n")
        who, text = split_rank(line)
        self._on_line(self.host, self._unprefixed if who == "torchrun" else who, text)

    def flush(self) -> None:
        self._log.flush()

    def close(self) -> None:
        if self._buf:
            self._emit(self._buf)
            self._buf = ""
        self._log.flush()


def unwritable(directory: Path) -> str | None:
    """Why files cannot be written under ``directory`` (made if missing), or None. A real
    file is tried: access() says yes to root on a read-only filesystem."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def open_log(runs_dir: Path, host: str, append: bool = False) -> IO[str]:
    runs_dir.mkdir(parents=True, exist_ok=True)
    return open(runs_dir / f"{host}.log", "a" if append else "w", buffering=1)
