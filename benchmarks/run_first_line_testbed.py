"""`provision run` on the provisioned 2-VM testbed (TCG), against the same script run by
hand with `sbatch` + `srun`, measured in one run:

1. **first line**: from the command to the job's first line on 2 nodes, with the job's env
   cached: `provision run --nodes 2` (its Slurm path: probe, upload, salloc, srun prepare,
   srun run; timed on this machine from the CLI's start to the line in its output) against
   `sbatch --nodes 2 --wrap 'srun python3 first.py'` typed on node1 as the training user
   (timed on node1 from sbatch to the line in the job's output file). Target: at most 1.5x.
2. **env**: a whole `provision run` whose requirements were never built (a new hash: venv
   made, pip run, a wheel installed) against the same run with them cached.

    .venv/bin/python benchmarks/run_first_line_testbed.py [--budget-s 900]

Needs the e2e tier's provisioned snapshot for this tree (benchmarks/snapshot_testbed.py).
Rounds run until the budget is spent (at least one); each prints its figures, then the
medians and the ratios. Exits 1 when the first-line ratio misses its target.
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import snapshot_testbed

from provision import inventory
from tests.e2e.storage_helpers import sh
from tests.helpers.user_job import wheel

TARGET = 1.5
FIRST = 'import time\nprint("first line", time.time(), flush=True)\ntime.sleep(2)\n'
HAND_DIR = "/shared/scratch/bench-first-line"


def _as_train(command: str) -> str:
    return f"runuser -u train -- sh -c {shlex.quote(command)}"


def by_hand(head) -> float:
    """sbatch + srun of first.py on 2 nodes, timed on node1: submission to the first line."""
    script = (
        f"cd {HAND_DIR} && rm -f out-*.txt && t0=$(date +%s.%N) && "
        "id=$(sbatch --parsable --nodes=2 --ntasks-per-node=1 --output=out-%j.txt --wrap 'srun python3 first.py') && "
        'until grep -q "first line" "out-$id.txt" 2>/dev/null; do sleep 0.05; done; '
        't1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" \'BEGIN {printf "took %.3f\\n", b - a}\'; '
        'while squeue -h -j "$id" | grep -q .; do sleep 0.2; done'
    )
    out = sh(head, _as_train(script), timeout_s=600)
    return float(out.split("took", 1)[1].split()[0])


def provision_run(inv: Path, work: Path, *extra: str) -> tuple[float, float]:
    """(seconds to the job's first line, seconds in all) of one `provision run`."""
    cmd = [sys.executable, "-m", "provision", "run", str(inv), "--nodes", "2", "--workdir", str(work / "code"),
           "--runs-dir", str(work / "runs"), *extra, "--", "python first.py"]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    first = None
    for line in proc.stderr:
        if first is None and "first line" in line:
            first = time.monotonic() - start
    code = proc.wait(timeout=900)
    total = time.monotonic() - start
    if code != 0 or first is None:
        raise SystemExit(f"provision run failed (exit {code})")
    return first, total


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-s", type=float, default=900)
    args = parser.parse_args()
    with snapshot_testbed.booted("bench-run-") as (_, inv, root):
        head = inventory.load(inv).head_node()[0]
        sh(head, _as_train(f"mkdir -p {HAND_DIR} && printf '%s' {shlex.quote(FIRST)} > {HAND_DIR}/first.py"))
        code = root / "code"
        code.mkdir()
        (code / "first.py").write_text(FIRST)
        wheel(code / "wheels")
        requirements = "--find-links wheels\nprovision-demo-extra==1.0\n"
        (code / "requirements.txt").write_text(requirements)
        provision_run(inv, root)  # the env built once: the first-line rounds run with it cached
        hand, ours, cold, warm = [], [], [], []
        deadline = time.monotonic() + args.budget_s
        while not hand or time.monotonic() < deadline:
            hand.append(by_hand(head))
            first, total = provision_run(inv, root)
            ours.append(first)
            warm.append(total)
            (code / "requirements.txt").write_text(f"{requirements}# round {secrets.token_hex(4)}\n")  # a new hash
            cold.append(provision_run(inv, root)[1])
            (code / "requirements.txt").write_text(requirements)
            print(f"round {len(hand)}: first line by hand {hand[-1]:.1f} s, provision run {ours[-1]:.1f} s; "
                  f"whole run with the env cached {warm[-1]:.1f} s, built {cold[-1]:.1f} s", flush=True)  # fmt: skip
    h, o, c, w = (statistics.median(x) for x in (hand, ours, cold, warm))
    ratio = o / h
    print(f"first line on 2 nodes, median of {len(hand)}: sbatch+srun by hand {h:.1f} s, provision run {o:.1f} s: "
          f"{ratio:.2f}x (target <= {TARGET}x)")  # fmt: skip
    print(f"whole run, median: env cached {w:.1f} s, env built {c:.1f} s: cached/built {w / c:.2f}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
