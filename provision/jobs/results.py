"""What a job leaves: its metrics (JSON lines), its outputs (copied here when small), each
node's exit status, and its TensorBoard events. Everything in the job directory is the
job user's, so it is read as that user (a link planted there never makes root read a file
of its own choosing) and parsed as data, bounded."""

from __future__ import annotations

import json
import math
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provision.jobs import bundle

METRICS_MAX_BYTES = 4 << 20  # of metrics.jsonl read back
OUTPUTS_COPY_MAX = 256 << 20  # outputs past this stay on the cluster, named by their path
READ_TIMEOUT_S = 120


@dataclass
class Metrics:
    """The job's metric lines."""

    last: dict[str, float] = field(default_factory=dict)  # each metric's last value
    best: dict[str, float] = field(default_factory=dict)  # each metric's lowest value (loss-like)
    lines: int = 0  # lines read
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # (step or line, value)


def parse_metrics(text: str) -> Metrics:
    """JSON objects, one a line; numbers kept per key (bools, strings and non-finite values
    dropped), against ``step`` when the line has one. Lines that are not objects are skipped."""
    m = Metrics()
    for i, line in enumerate(text.splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        m.lines += 1
        step = obj.get("step")
        at = step if type(step) is int else i
        for key, value in obj.items():
            if key == "step" or type(value) not in (int, float) or not math.isfinite(value):
                continue
            if not isinstance(key, str) or len(key) > 128:
                continue
            m.last[key] = float(value)
            m.best[key] = min(m.best.get(key, float(value)), float(value))
            m.series.setdefault(key, []).append((at, float(value)))
    return m


def as_user(user: str | None, command: str) -> str:
    """``command`` run as the job's user (root reaches it with runuser)."""
    return shlex.join(["runuser", "-u", user, "--", "sh", "-c", command]) if user else command


def exits_command(job_dir: str) -> str:
    """Each node's exit status file: "<node> <status>" lines."""
    d = shlex.quote(f"{job_dir}/exit")
    return f'for f in {d}/*; do [ -f "$f" ] && echo "${{f##*/}} $(head -c 16 "$f" | tr -dc 0-9-)"; done; true'


def parse_exits(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        name, _, code = line.partition(" ")
        try:
            out[name] = int(code)
        except ValueError:
            continue
    return out


def events_command(job_dir: str) -> str:
    """How many TensorBoard event files the job wrote under its tb/ directory."""
    return f"find {shlex.quote(job_dir + '/tb')} -name 'events.out.tfevents.*' -type f 2>/dev/null | wc -l"


def metrics_command(job_dir: str) -> str:
    return f"head -c {METRICS_MAX_BYTES} {shlex.quote(job_dir + '/metrics.jsonl')} 2>/dev/null; true"


def outputs_size_command(job_dir: str) -> str:
    """ "<files> <bytes>" of the outputs directory's regular files (links not followed)."""
    d = shlex.quote(job_dir + "/outputs")
    return f"find {d} -type f -printf '%s\\n' 2>/dev/null | awk '{{n++; s+=$1}} END {{print n+0, s+0}}'"


def parse_size(text: str) -> tuple[int, int] | None:
    parts = text.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def outputs_tar_command(job_dir: str) -> str:
    return f"tar -C {shlex.quote(job_dir + '/outputs')} -czf - ."


def fetch(
    conn: Any, user: str | None, job_dir: str, dest: Path, copy_max: int = OUTPUTS_COPY_MAX
) -> tuple[str | None, list[str]]:
    """The outputs directory copied into ``dest`` when it holds at most ``copy_max`` bytes:
    (the local directory or None, notes)."""
    r = conn.run(as_user(user, outputs_size_command(job_dir)), hide=True, warn=True, timeout=READ_TIMEOUT_S)
    counted = parse_size(r.stdout)
    where = f"{job_dir}/outputs"
    if counted is None:
        return None, [f"outputs: {where} could not be read"]
    files, size = counted
    if not files:
        return None, [f"outputs: nothing in {where}"]
    if size > copy_max:
        return None, [f"outputs: {size / 2**20:.0f} MiB, left on the cluster at {where} (over {copy_max >> 20} MiB)"]
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as tmp:
        with open(tmp.name, "wb") as sink:
            r = conn.run(
                as_user(user, outputs_tar_command(job_dir)),
                hide=True,
                warn=True,
                timeout=READ_TIMEOUT_S,
                out_stream=_Bytes(sink),
                encoding="latin-1",
            )
        if r.exited != 0:
            return None, [f"outputs: the copy failed ({r.stderr.strip()[-200:]})"]
        try:
            copied = bundle.unpack(Path(tmp.name), dest)
        except Exception as e:  # a hostile member (a link out, an absolute path): refused
            return None, [f"outputs: refused ({type(e).__name__}: {e}); they stay at {where}"]
    return str(dest), [f"outputs: {copied} file(s) copied from {where}"]


class _Bytes:
    """An out_stream for binary output: invoke decodes with the given encoding; latin-1
    maps every byte to one character and back."""

    def __init__(self, sink: Any):
        self._sink = sink

    def write(self, data: str) -> int:
        self._sink.write(data.encode("latin-1"))
        return len(data)

    def flush(self) -> None:
        self._sink.flush()
