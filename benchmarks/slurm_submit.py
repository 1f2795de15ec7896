"""Submit-to-first-step of a 2-node `provision train` through Slurm, against the same run
launched over SSH, measured in one run (issue 16's figure, target <= 1.2).

    .venv/bin/python benchmarks/slurm_submit.py INVENTORY [--pairs 3] [--budget-s 1800] [--target 1.2]

INVENTORY: a provisioned cluster whose slurm step ran (the testbed after `provision up`).
Each pair runs the same short train twice, over SSH then through Slurm (alternating which
goes first, so drift cancels), and times each from the command's start to the first
"step 1/" line of rank 0 in its live output. The figure is the median of the per-pair
ratios slurm / ssh. Pairs stop early once --budget-s has passed (bounded by time, not
work: a TCG testbed is far slower on some hosts than others). Exits 1 past --target.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = ["--steps", "2", "--model", "tiny", "--timeout", "900"]
TRAINER = ["--", "--data-max-mb", "1", "--eval-interval", "100", "--eval-samples", "8"]


def first_step_s(inventory: Path, scheduler: str, runs: Path) -> float:
    """Seconds from starting `provision train` to rank 0's first step line; the run must end 0."""
    cmd = [sys.executable, "-m", "provision", "train", str(inventory), "--runs-dir", str(runs)]
    cmd += [*TRAIN, "--scheduler", scheduler, *TRAINER]
    start = time.monotonic()
    seen: float | None = None
    with subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stderr is not None
        for line in proc.stderr:
            if seen is None and "rank0" in line and "step 1/" in line:
                seen = time.monotonic() - start
        code = proc.wait()
    if code != 0 or seen is None:
        raise SystemExit(f"{scheduler} run failed (exit {code}, first step {'seen' if seen else 'never seen'})")
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inventory", type=Path)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=1800)
    ap.add_argument("--target", type=float, default=1.2)
    args = ap.parse_args()
    began = time.monotonic()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            if i and time.monotonic() - began > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s reached after {i} pairs")
                break
            order = ("ssh", "slurm") if i % 2 == 0 else ("slurm", "ssh")
            took = {s: first_step_s(args.inventory, s, Path(tmp) / f"{i}-{s}") for s in order}
            ratios.append(took["slurm"] / took["ssh"])
            print(f"pair {i + 1}: ssh {took['ssh']:.1f} s, slurm {took['slurm']:.1f} s, ratio {ratios[-1]:.3f}")
    figure = statistics.median(ratios)
    ok = figure <= args.target
    print(f"submit-to-first-step, slurm / ssh, median of {len(ratios)}: {figure:.3f} (target <= {args.target})")
    print("OK" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
