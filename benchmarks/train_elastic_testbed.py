"""An elastic `provision train --min-nodes 1` on the provisioned 2-VM testbed (TCG): the
recovery from a lost VM with a checkpoint every 10 steps, and the lost VM booted again
during the run and admitted back (the world goes 2, 1, 2).

    .venv/bin/python benchmarks/train_elastic_testbed.py [--budget-s 1500] [--ckpt-every 10]

Needs the e2e tier's provisioned snapshot for this tree (`./scripts/test tests/e2e` saves
it; tests/e2e/snapshot.py): the VMs boot from it, so nothing is provisioned here. Trials
run until the budget is spent (at least one), each:

1. the run starts on both VMs (the tiny trainer, a stop file on each VM ends it);
2. after step 1.5 x the checkpoint interval, node2's VM is killed (SIGKILL to qemu);
3. once node1 trains alone, node2's VM is booted again (on the same SSH port: the run knows
   only that one); the launcher admits it at its next try, and both VMs train together again;
4. after a few steps at world 2 the stop file ends the run.

Printed from each report.json: seconds from the loss to the next training step, the steps
trained again, seconds from node2 answering SSH to the first step with it back, and the
world sizes in order. Every VM started here is taken down again before the script exits.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import snapshot_testbed

from provision import inventory
from provision.testbed import Testbed
from tests.e2e.storage_helpers import sh
from tests.e2e.test_train_e2e import report_of, start

STOP = "/var/tmp/provision-bench-elastic-stop"  # on every VM: rank 0 (wherever it is) reads it
TRAINER = ["--", "--data-max-mb", "1", "--eval-interval", "4", "--eval-samples", "8", "--stop-file", STOP]


def _said(cwd: Path) -> str:
    return (cwd / "err.txt").read_text()


def _wait(cwd: Path, what: str, ok, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = _said(cwd)
        if ok(text):
            return text
        time.sleep(1)
    raise SystemExit(f"no {what} within {timeout:.0f} s: {_said(cwd)[-2000:]}")


def _steps(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"rank0 \| step (\d+)/\d+ \| train loss", text)]


def trial(tb: Testbed, inv: Path, cwd: Path, ckpt_every: int) -> dict:
    cluster = inventory.load(inv)
    survivor, victim = cluster.nodes[0], cluster.nodes[-1]
    for n in cluster.nodes:
        sh(n, f"rm -f {STOP}")
    cwd.mkdir()
    proc = start(inv, cwd, "--min-nodes", "1", "--steps", "100000", "--ckpt-every", str(ckpt_every), *TRAINER)
    try:
        kill_after = ckpt_every + ckpt_every // 2
        _wait(cwd, f"step {kill_after}", lambda t: any(s >= kill_after for s in _steps(t)), 900)
        tb.stop_node(victim.name, hard=True)
        alone = lambda t: "; world 1 on cpu" in t and bool(_steps(t.rsplit("; world 1 on cpu", 1)[-1]))  # noqa: E731
        _wait(cwd, "a step at world 1", alone, 900)
        tb.start_node(victim.name)
        answered = time.monotonic()
        port = next(n.ssh.port for n in inventory.load(inv).nodes if n.name == victim.name)
        if port != victim.ssh.port:
            raise SystemExit(f"{victim.name} came back on SSH port {port}, not {victim.ssh.port}: unreachable")
        back = lambda t: t.count("; world 2 on cpu") >= 2 and len(_steps(t.rsplit("; world 2 on cpu", 1)[-1])) >= 2  # noqa: E731
        _wait(cwd, "two steps at world 2 again", back, 900)
        rejoined_s = time.monotonic() - answered
        for n in (survivor, victim):
            sh(n, f"echo 'the benchmark saw the world back at 2' > {STOP} && chmod 644 {STOP}")
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=300)
        tb.start_node(victim.name)
    report = report_of(cwd)
    if code != 0:
        raise SystemExit(f"the run failed: exit {code}: {report.get('failure')}")
    restarts = report["restarts"]
    worlds = [restarts[0]["world_before"]] + [r["world_after"] for r in restarts]
    lost = next(r for r in restarts if r["lost"])
    return {
        "recovery_s": lost["recovery_s"],
        "resumed_from_step": lost["resumed_from_step"],
        "steps_recomputed": lost["steps_recomputed"],
        "ssh_to_step_at_world_2_s": round(rejoined_s, 1),
        "worlds": worlds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=1500, help="no new trial starts after this")
    ap.add_argument("--ckpt-every", type=int, default=10)
    args = ap.parse_args()
    started = time.monotonic()
    with snapshot_testbed.booted("train-elastic-testbed-") as (tb, inv, root):
        trials = []
        while not trials or time.monotonic() - started < args.budget_s:
            trials.append(trial(tb, inv, root / f"t{len(trials)}", args.ckpt_every))
            print(json.dumps(trials[-1]), flush=True)
    print(
        f"{len(trials)} trial(s), checkpoint every {args.ckpt_every} steps: loss -> next step median "
        f"{statistics.median(t['recovery_s'] for t in trials):.1f} s, "
        f"{statistics.median(t['steps_recomputed'] for t in trials):.0f} step(s) recomputed; node2 answering SSH -> "
        f"its first step back median {statistics.median(t['ssh_to_step_at_world_2_s'] for t in trials):.1f} s; "
        f"worlds {[t['worlds'] for t in trials]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
