"""Where the end-to-end tier's time went: the table in BENCHMARKS.md, from the timing log
that tests/e2e/clock.py writes during a run.

    PROVISION_E2E_TIMINGS=/tmp/e2e.jsonl .venv/bin/pytest -m "not gpu" tests/e2e
    .venv/bin/python benchmarks/e2e_breakdown.py /tmp/e2e.jsonl

Rows: the shared testbed (image build, wheelhouse, each node's boot), each step of the
shared `up` (a step ends when its last host is done: steps run one after another over all
hosts), then every test module (setup + call + teardown of its tests, so module-scoped
fixtures count where they ran), slowest first. Seconds are wall time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def testbed_rows(events: list[dict]) -> list[tuple[str, float]]:
    """Image build (first to last image event), wheelhouse, and each node's boot."""
    tb = [e for e in events if e["kind"] == "testbed"]
    span = [e for e in events if e["kind"] == "phase" and e["name"] == "testbed up"]
    rows: list[tuple[str, float]] = []
    image = [e["t"] for e in tb if e["name"] == "image"]
    if image:
        rows.append(("testbed: image build (debootstrap, initrd, mkfs)", max(image) - min(image)))
    probe = [e["t"] for e in tb if e["name"] == "accel"]
    if len(probe) >= 2:
        rows.append(("testbed: KVM probe (once per cache; the verdict is cached)", probe[-1] - probe[0]))
    starts: dict[str, float] = {}  # node -> its latest qemu start (nodes boot again after a snapshot)
    for e in tb:
        if e["text"] == "starting qemu":
            starts[e["name"]] = e["t"]
        elif e["text"].startswith("SSH answered") and e["name"] in starts:
            rows.append((f"testbed: {e['name']} boot to SSH", e["t"] - starts.pop(e["name"])))
    wheel = [e["t"] for e in tb if e["name"] == "wheelhouse"]
    ends = [e["t"] for e in span if e.get("at") == "end"]
    if wheel and ends:
        rows.append(("testbed: wheelhouse download and inventory", ends[0] - wheel[0]))
    if len(span) == 2:
        rows.append(("testbed up, in all", span[1]["t"] - span[0]["t"]))
    return rows


def up_rows(events: list[dict], label: str = "shared up") -> list[tuple[str, float]]:
    """Each step's wall time: from the previous step's end (or the run's start) to the
    last host's done/skipped line for it."""
    span = [e for e in events if e["kind"] == "phase" and e["name"] == label]
    start = next((e["t"] for e in span if e.get("at") == "start"), None)
    if start is None:
        cached = [e for e in span if e.get("at") == "from snapshot"]
        return [(f"{label}: from the snapshot {cached[0].get('key')} (not run)", 0.0)] if cached else []
    last_done: dict[str, float] = {}
    for e in events:
        if e["kind"] != "up" or e["name"] != label:
            continue
        # "base: done, 15 changed", "nvidia: skipped (no NVIDIA GPU...)": a host's last line of a step
        step, _, status = e["text"].partition(": ")
        if status.startswith(("done", "skipped")):
            last_done[step] = max(last_done.get(step, 0.0), e["t"])
    rows, before = [], start
    for step, end in sorted(last_done.items(), key=lambda kv: kv[1]):
        rows.append((f"{label}: {step}", end - before))
        before = end
    end = next((e["t"] for e in span if e.get("at") == "end"), None)
    if end is not None:
        rows.append((f"{label}, in all", end - start))
        saved = [e["t"] for e in events if e["kind"] == "phase" and e["name"] == "snapshot saved"]
        if saved:
            rows.append(("snapshot saved (power off, copy the disks, boot again)", saved[0] - end))
        for e in events:
            if e["kind"] == "snapshot" and e["name"] == "save" and e.get("saved") is False:
                rows.append((f"snapshot not saved: {e.get('why', '')}", 0.0))
    return rows


def shared_span(events: list[dict]) -> tuple[float, float] | None:
    """From the testbed's start to the end of the shared `up` (and its snapshot): the
    session fixtures' time, which the first test's setup would otherwise be charged."""
    marks = [e["t"] for e in events if e["kind"] == "phase"]
    return (min(marks), max(marks)) if marks else None


def _outside(start: float, end: float, span: tuple[float, float] | None) -> float:
    if span is None:
        return end - start
    overlap = max(0.0, min(end, span[1]) - max(start, span[0]))
    return end - start - overlap


def module_rows(events: list[dict]) -> list[tuple[str, float, int, str]]:
    """(module, seconds, tests, outcomes) for every test module, slowest first; the shared
    fixtures' time is not charged to the module that happened to need them first."""
    span = shared_span(events)
    seconds: dict[str, float] = defaultdict(float)
    tests: dict[str, set[str]] = defaultdict(set)
    outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for e in events:
        if e["kind"] != "test":
            continue
        module = e["name"].split("::", 1)[0]
        seconds[module] += _outside(e["t"] - e["seconds"], e["t"], span)
        tests[module].add(e["name"])
        if e["phase"] == "call" or e["outcome"] != "passed":
            outcomes[module][e["outcome"]] += 1
    rows = [
        (m, s, len(tests[m]), ", ".join(f"{n} {o}" for o, n in sorted(outcomes[m].items()))) for m, s in seconds.items()
    ]
    return sorted(rows, key=lambda r: -r[1])


def op_rows(events: list[dict], top: int = 12) -> list[tuple[str, float]]:
    """The slowest operations of every run a test timed op by op (kind "op"): an event's
    time on its host is until that host's next event (the run's last one has no end)."""
    by_run: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for e in events:
        if e["kind"] == "op":
            by_run[(e["name"], e["host"])].append(e)
    spans: dict[tuple[str, str], list[float]] = defaultdict(list)  # (run, event text) -> seconds per host
    for (run, _host), seq in by_run.items():
        for this, after in itertools.pairwise(seq):
            spans[(run, this["text"])].append(after["t"] - this["t"])
    rows = [(f"{run}: {text} (slowest host)", max(s)) for (run, text), s in spans.items()]
    return sorted(rows, key=lambda r: -r[1])[:top]


def table(events: list[dict]) -> str:
    lines = ["| part | seconds |", "|---|---|"]
    lines += [f"| {name} | {s:.0f} |" for name, s in testbed_rows(events) + up_rows(events)]
    lines += ["", "| test module (setup + call + teardown, shared fixtures apart) | seconds | tests | outcomes |"]
    lines += ["|---|---|---|---|"]
    modules = module_rows(events)
    lines += [f"| {m} | {s:.0f} | {n} | {o} |" for m, s, n, o in modules]
    ops = op_rows(events)
    if ops:
        lines += ["", "| operation (until the host's next event) | seconds |", "|---|---|"]
        lines += [f"| {name} | {s:.0f} |" for name, s in ops]
    total = max((e["t"] for e in events), default=0.0)
    lines += ["", f"e2e tier, first event to last: {total:.0f} s ({total / 60:.1f} min)"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="the JSON-lines file PROVISION_E2E_TIMINGS named")
    args = parser.parse_args()
    if not args.log.is_file():
        print(f"error: {args.log}: no such file (run the e2e tier with PROVISION_E2E_TIMINGS set)", file=sys.stderr)
        return 2
    print(table(load(args.log)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
