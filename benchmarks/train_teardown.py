"""How fast `provision train` stops a whole run after one rank dies, against the issue's
30 s budget: (kill -> no process of the run left on any host) / 30 s.

    .venv/bin/python benchmarks/train_teardown.py [--trials 3] [--target 1.0]

Needs root. Two network-namespace hosts (tests/helpers/netns.py). Each trial starts a
long run, waits for rank 0's second step, SIGKILLs the trainer process on ns1, and
polls /proc until no process's command line carries the run id. The figure is the
worst trial over the budget; the launcher's own view (first failure seen -> every
host's reaper done, report.json teardown_s) is printed beside it. Exits 1 when the
worst trial is over --target.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import netns
from tests.integration.test_train_launch import (
    TRAINER,
    finish,
    processes_of,
    run_dir,
    start,
    wait_for_steps,
    worker,
)

BUDGET_S = 30.0


def trial(inventory: Path, work: Path) -> tuple[float, float]:
    """(seconds from the kill until the run is gone everywhere, launcher's teardown_s)."""
    work.mkdir()
    proc = start(inventory, work, "--steps", "100000", "--quiet", *TRAINER)
    run = run_dir(work)
    wait_for_steps(run, 2)
    pid, _ = worker(run.name, "ns1")
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while processes_of(run.name) and time.monotonic() - killed < 120:
        time.sleep(0.05)
    gone = time.monotonic() - killed
    code, report = finish(proc, work)
    if code != 1 or processes_of(run.name):
        raise SystemExit(f"trial failed: exit {code}, left {processes_of(run.name)}")
    return gone, report["teardown_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--target", type=float, default=1.0)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory(prefix="train-teardown-") as tmp:
        tmp_path = Path(tmp)
        cluster = netns.start(2, tmp_path / "hosts", {"venv_path": sys.prefix, "train_dir": str(tmp_path / "nodes")})
        try:
            results = [trial(cluster.inventory, tmp_path / f"t{i}") for i in range(args.trials)]
        finally:
            cluster.stop()
    for i, (gone, own) in enumerate(results):
        print(f"trial {i}: kill -> clean on every host {gone:.1f}s (launcher: failure seen -> reapers done {own:.1f}s)")
    worst = max(g for g, _ in results) / BUDGET_S
    print(f"teardown time / {BUDGET_S:.0f}s budget (worst of {args.trials}): {worst:.2f} (target <= {args.target})")
    return 0 if worst <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
