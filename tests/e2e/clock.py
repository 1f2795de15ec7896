"""Where the end-to-end tier's time goes: one JSON line per event, with seconds since the
session started, in the file PROVISION_E2E_TIMINGS names (default
.pytest_cache/e2e-timings.jsonl). `benchmarks/e2e_breakdown.py` turns it into the
table in BENCHMARKS.md. Recording never fails a test: it only appends lines."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

_START = time.monotonic()
_LOCK = threading.Lock()


def path() -> Path:
    return Path(os.environ.get("PROVISION_E2E_TIMINGS", ".pytest_cache/e2e-timings.jsonl"))


_started: list[bool] = []  # set by the first record: a session starts a new log


def record(kind: str, name: str, **fields: object) -> None:
    line = {"t": round(time.monotonic() - _START, 1), "kind": kind, "name": name, **fields}
    with _LOCK:
        p = path()
        if not _started:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("")  # the previous run's lines would mislead
            _started.append(True)
        with p.open("a") as f:
            f.write(json.dumps(line) + "\n")


def testbed_progress(subject: str, text: str) -> None:
    """Testbed.up's progress callback: image build phases and each node's boot."""
    record("testbed", subject, text=text)


def up_events(label: str):
    """An on_event for pipeline.up that records when each host finishes each step."""

    def on_event(host: str, text: str) -> None:
        if ": done" in text or text.endswith(": skipped") or "reboot" in text:
            record("up", label, host=host, text=text)

    return on_event
