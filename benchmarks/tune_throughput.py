"""`provision tune`'s trials per hour on two hosts against one, in one run, same study
settings, one thread per trial.

Each configuration runs the same study (random sampler with one seed, no pruner, so every
trial is the same amount of work whatever was sampled) for a fixed window of wall time;
then the sweep is stopped with SIGINT, as a user's Ctrl-C. Trials per hour counts the
trials that completed within the window from the first trial's start. A trial in flight at
the end is not counted (at most one per slot: the window should be many trials long).

Hosts: an inventory (--inventory, e.g. a testbed's), each configuration limited to its
hosts; or, without one, two network-namespace hosts on this machine started by the
script (needs root; tests/helpers/netns.py), which share this machine's cores.

    sudo .venv/bin/python benchmarks/tune_throughput.py --window 240
    .venv/bin/python benchmarks/tune_throughput.py --inventory inv.py --hosts node1,node2 --window 900
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPACE = "[lr]\nlow = 1e-4\nhigh = 3e-3\nlog = true\n[warmup-steps]\nlow = 0\nhigh = 8\n"


def study(inventory: Path, hosts: list[str], window: float, work: Path, trial: list[str]) -> dict:
    """One configuration: the sweep over ``hosts`` for ``window`` seconds."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "space.toml").write_text(SPACE)
    cmd = [
        sys.executable, "-m", "provision", "tune", str(inventory), "--space", str(work / "space.toml"),
        "--trials", "10000", "--parallel", str(len(hosts)), "--limit", ",".join(hosts), "--sampler", "random",
        "--pruner", "none", "--seed", "1", "--study", "bench", "--runs-dir", str(work / "runs"), "--json", *trial,
    ]  # fmt: skip
    with open(work / "out.txt", "w") as out, open(work / "err.txt", "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=work, env={**os.environ, "OMP_NUM_THREADS": "1"})
        started = time.monotonic()
        while time.monotonic() - started < window and proc.poll() is None:
            time.sleep(1)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from provision.tune import study as study_lib

    st = optuna.load_study(study_name="bench", storage=study_lib.storage(work / "runs" / "tune" / "bench"))
    trials = st.get_trials(deepcopy=False)
    t0 = min(t.datetime_start for t in trials if t.datetime_start)
    done = [
        t for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE and (t.datetime_complete - t0).total_seconds() <= window
    ]  # fmt: skip
    seconds = [t.user_attrs.get("seconds", 0) for t in done]
    return {
        "hosts": hosts,
        "window_s": window,
        "complete": len(done),
        "trials_per_hour": len(done) * 3600 / window,
        "median_trial_s": sorted(seconds)[len(seconds) // 2] if seconds else None,
        "failed": sum(t.state == optuna.trial.TrialState.FAIL and not t.user_attrs.get("interrupted") for t in trials),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inventory", type=Path, help="hosts to use (default: two netns hosts started here)")
    ap.add_argument("--hosts", default="", help="two host names of --inventory, comma-separated")
    ap.add_argument("--window", type=float, default=240, help="seconds each configuration runs")
    ap.add_argument("--steps", type=int, default=300, help="trainer steps per trial")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    trial = ["--steps", str(args.steps), "--eval-interval", str(max(1, args.steps // 4)), "--threads", "1"]
    trial += ["--", "--data-max-mb", "1", "--eval-samples", "8"]
    with tempfile.TemporaryDirectory(prefix="tune-bench-") as tmp, contextlib.ExitStack() as stack:
        if args.inventory:
            inventory, hosts = args.inventory, [h for h in args.hosts.split(",") if h]
        else:
            from tests.helpers import netns

            node_dir = Path(tmp) / "node"
            cluster = netns.start(2, Path(tmp) / "netns", {"venv_path": sys.prefix, "train_dir": str(node_dir)})
            stack.callback(cluster.stop)
            inventory, hosts = cluster.inventory, [h.name for h in cluster.hosts]
        if len(hosts) != 2:
            raise SystemExit("give two hosts (--hosts a,b with --inventory)")
        one = study(inventory, hosts[:1], args.window, Path(tmp) / "one", trial)
        two = study(inventory, hosts, args.window, Path(tmp) / "two", trial)
    ratio = two["trials_per_hour"] / one["trials_per_hour"] if one["trials_per_hour"] else None
    result = {"one": one, "two": two, "ratio": ratio, "cpus": os.cpu_count(), "trial": trial}
    print("| hosts | window s | trials complete | trials/hour | median trial s | failed |")
    print("|---|---|---|---|---|---|")
    for r in (one, two):
        print(
            f"| {len(r['hosts'])} ({', '.join(r['hosts'])}) | {r['window_s']:.0f} | {r['complete']} | "
            f"{r['trials_per_hour']:.0f} | {r['median_trial_s']} | {r['failed']} |"
        )
    print(f"ratio, 2 hosts / 1 host: {ratio:.2f}" if ratio else "ratio: n/a (no trial completed on one host)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
