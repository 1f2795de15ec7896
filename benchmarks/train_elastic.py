"""What an elastic `provision train --min-nodes 1` costs when a node is lost, and what
`--drop-stragglers` buys when one node is slow. Two network-namespace hosts (needs root;
tests/helpers/netns.py), the tiny trainer on CPU.

    .venv/bin/python benchmarks/train_elastic.py [--budget-s 600] [--ckpt-every 10]
        [--part both|recovery|stragglers] [--stopped-ms 30] [--straggler-steps 120] [--model tiny]

1. Recovery, trials until the time budget's first half is spent (at least one): a run
   with a checkpoint every --ckpt-every steps; at step 1.5 x that, ns1 dies (its run
   and SSH sessions killed, its sshd frozen until the run ends, so it is not admitted
   again). Printed from report.json: seconds from the loss to the next training step, and
   the steps trained again, per trial, and their median.
2. Stragglers, in the same run of this script: the same fixed number of steps three times,
   each bounded by --timeout: both at full speed (the reference), ns1 slowed (its workers
   stopped with SIGSTOP 30 ms out of every 40, about 4x slower) without the flag, and
   slowed with --drop-stragglers 1.5 (a 10-step window). With two nodes, dropping one
   halves the capacity: it pays when the straggler is more than 2x slower, as here. The
   figure is each run's wall time from its first training step to its end, and throughput
   against the reference as a ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import netns
from tests.integration.test_train_elastic import frozen_sshd, kill_host, throttled
from tests.integration.test_train_launch import TRAINER, finish, run_dir, start, wait_for_steps

STRAGGLER_STEPS = 120  # default of --straggler-steps


def recovery(cluster, work: Path, ckpt_every: int) -> dict:
    work.mkdir()
    proc = start(
        cluster.inventory, work, "--quiet", "--min-nodes", "1", "--steps", str(ckpt_every * 4),
        "--ckpt-every", str(ckpt_every), "--timeout", "600", *TRAINER,
    )  # fmt: skip
    run = run_dir(work)
    wait_for_steps(run, ckpt_every + ckpt_every // 2, timeout=300)
    with frozen_sshd(cluster, 1):  # gone until the run ends: not admitted again
        kill_host(cluster, 1, run.name)
        code, report = finish(proc, work)
    if code != 0 or len(report["restarts"]) != 1:
        raise SystemExit(f"recovery trial failed: exit {code}, restarts {report['restarts']}")
    return report["restarts"][0]


def straggler_run(
    cluster, work: Path, slow: bool, drop: bool, stopped_s: float = 0.03, steps: int = STRAGGLER_STEPS, model="tiny"
) -> tuple[float, dict]:
    """(seconds from the first training step's line to the run's end, report)."""
    work.mkdir()
    flags = ["--min-nodes", "1", "--drop-stragglers", "1.5"] if drop else ["--min-nodes", "1"]
    proc = start(
        cluster.inventory, work, *flags, "--steps", str(steps), "--ckpt-every", "10", "--model", model,
        "--timeout", "900", *TRAINER, "--straggler-window", "10",
    )  # fmt: skip
    run = run_dir(work)
    wait_for_steps(run, 1, timeout=300)
    first = time.monotonic()
    with throttled(run.name, "ns1", stopped_s, 0.04 - stopped_s) if slow else contextlib.nullcontext():
        code, report = finish(proc, work)
    elapsed = time.monotonic() - first
    if code != 0:
        raise SystemExit(f"straggler run failed: exit {code}: {report.get('failure')}")
    return elapsed, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=600, help="the recovery trials stop after half of it")
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--part", choices=("both", "recovery", "stragglers"), default="both")
    ap.add_argument("--stopped-ms", type=float, default=30, help="of every 40 ms, the slow node is stopped this long")
    ap.add_argument("--straggler-steps", type=int, default=STRAGGLER_STEPS, help="steps of each straggler run")
    ap.add_argument("--model", default="tiny", help="the trainer's size preset for the straggler runs")
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="train-elastic-") as tmp:
        tmp_path = Path(tmp)
        cluster = netns.start(2, tmp_path / "hosts", {"venv_path": sys.prefix, "train_dir": str(tmp_path / "nodes")})
        try:
            trials = []
            while args.part != "stragglers" and (not trials or time.monotonic() - started < args.budget_s / 2):
                trials.append(recovery(cluster, tmp_path / f"r{len(trials)}", args.ckpt_every))
            runs = {
                name: straggler_run(
                    cluster, tmp_path / name, slow, drop, args.stopped_ms / 1000, args.straggler_steps, args.model
                )
                for name, slow, drop in (("reference", False, False), ("slow", True, False), ("slow+drop", True, True))
                if args.part != "recovery"
            }
        finally:
            cluster.stop()
    for i, r in enumerate(trials):
        print(
            f"recovery trial {i}: loss -> next step {r['recovery_s']:.1f} s, resumed from step "
            f"{r['resumed_from_step']}, {r['steps_recomputed']} step(s) recomputed"
        )
    if trials:
        print(
            f"recovery, median of {len(trials)} (checkpoint every {args.ckpt_every} steps): "
            f"{statistics.median(r['recovery_s'] for r in trials):.1f} s, "
            f"{statistics.median(r['steps_recomputed'] for r in trials):.0f} step(s) recomputed"
        )
    ref = runs["reference"][0] if runs else 0.0
    for name, (elapsed, report) in runs.items():
        dropped = [x["host"] for x in report["lost"]]
        at = [r["resumed_from_step"] for r in report["restarts"]]
        print(
            f"{name:10s} {args.straggler_steps} steps in {elapsed:6.1f} s: "
            f"throughput {ref / elapsed:.2f} x the reference"
            + (f"; dropped {', '.join(dropped)}, resumed at step {at}" if dropped else "")
        )
    print(json.dumps({"trials": trials, "runs": {k: v[0] for k, v in runs.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
