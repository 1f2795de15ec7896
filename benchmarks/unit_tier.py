"""The unit tier's wall time against a reference revision's, measured in the same run.

Each revision is checked out into a temporary git worktree and its unit tier (tests/unit)
is run with this checkout's virtualenv, the reference first and then this tree's HEAD,
alternating for --rounds rounds; the figure is the median of HEAD's times over the median of
the reference's. Exits 1 when HEAD's unit tier takes longer than --target seconds.

    .venv/bin/python benchmarks/unit_tier.py --base a2af2f5 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_tier(tree: Path) -> tuple[float, str]:
    """Seconds for one run of tree's unit tier, and pytest's closing line."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    seconds = time.monotonic() - start
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: unit tier failed:\n" + "\n".join(lines[-20:]))
    return seconds, lines[-1] if lines else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="reference revision, e.g. the commit before a change")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating")
    parser.add_argument("--target", type=float, default=120.0, help="most seconds HEAD's unit tier may take")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="unit-tier-") as tmp:
        trees = {}
        for name, rev in (("base", args.base), ("head", "HEAD")):
            trees[name] = Path(tmp) / name
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(trees[name]), rev], cwd=ROOT, check=True)
        try:
            times: dict[str, list[float]] = {"base": [], "head": []}
            for _ in range(args.rounds):
                for name in ("base", "head"):
                    seconds, summary = run_tier(trees[name])
                    times[name].append(seconds)
                    print(f"{name:4} {seconds:7.1f} s  {summary}", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    base, head = statistics.median(times["base"]), statistics.median(times["head"])
    print(f"unit tier: HEAD {head:.1f} s, {args.base} {base:.1f} s, HEAD / base = {head / base:.2f}")
    return 0 if head <= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
