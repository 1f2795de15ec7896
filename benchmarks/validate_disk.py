"""Disk figures of the validate agent against hand-written fio command lines on the same
file, same run. Target: each of seq read, seq write and 4k random read within +-10%.

The agent runs its three-job file (bench_disk); the reference is three separate fio
commands written out by hand below. Runs alternate agent/reference and each side keeps its
best, so a busy neighbour hits both alike.

    .venv/bin/python benchmarks/validate_disk.py [--dir /data] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provision.validate import agent  # noqa: E402

TOLERANCE = 0.10
SIZE, SECONDS = "512M", 3  # the agent's quick mode


def hand_written(path: Path) -> dict[str, float]:
    base = [
        "fio",
        f"--filename={path}",
        f"--size={SIZE}",
        "--direct=1",
        "--ioengine=libaio",
        "--time_based",
        f"--runtime={SECONDS}",
        "--ramp_time=1",
        "--group_reporting",
        "--output-format=json",
    ]
    jobs = {
        "disk_seq_write_mibs": ["--name=w", "--rw=write", "--bs=1M", "--iodepth=16"],
        "disk_seq_read_mibs": ["--name=r", "--rw=read", "--bs=1M", "--iodepth=16"],
        "disk_rand_read_iops": [
            "--name=rr",
            "--rw=randread",
            "--bs=4k",
            "--iodepth=64",
            "--numjobs=4",
            "--norandommap",
        ],
    }
    out = {}
    for metric, args in jobs.items():
        report = json.loads(subprocess.run(base + args, capture_output=True, text=True, check=True, timeout=120).stdout)
        job = report["jobs"][0]
        side = job["write"] if "write" in metric else job["read"]
        out[metric] = side["iops"] if metric.endswith("iops") else side["bw_bytes"] / 2**20
    return out


def agent_run(directory: Path) -> dict[str, float]:
    res = agent.Results()
    agent.bench_disk({"fio_size": SIZE, "fio_s": SECONDS}, str(directory), res)
    return {r["metric"]: r["value"] for r in res.rows}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", default=None, help="directory on the volume to test (default: a tmp dir)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="validate-disk-bench-", dir=args.dir))
    try:
        best_a: dict[str, float] = {}
        best_h: dict[str, float] = {}
        spread: dict[str, list[float]] = {}  # every hand-written run: the machine's own noise
        for _ in range(args.rounds):
            for k, v in agent_run(work).items():
                best_a[k] = max(best_a.get(k, 0.0), v or 0.0)
            for k, v in hand_written(work / "hand.dat").items():
                best_h[k] = max(best_h.get(k, 0.0), v)
                spread.setdefault(k, []).append(v)
            (work / "hand.dat").unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ok = True
    for metric in ("disk_seq_read_mibs", "disk_seq_write_mibs", "disk_rand_read_iops"):
        ratio = best_a[metric] / best_h[metric]
        good = abs(ratio - 1) <= TOLERANCE
        ok &= good
        noise = min(spread[metric]) / max(spread[metric])
        print(
            f"{metric:>20}: agent {best_a[metric]:10.1f}  hand fio {best_h[metric]:10.1f}  "
            f"ratio {ratio:.3f} {'OK' if good else 'MISSED'}  "
            f"(hand fio alone, worst/best of {len(spread[metric])} runs: {noise:.2f})"
        )
    print(f"disk agent vs hand-written fio within +-{TOLERANCE:.0%}: {'OK' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
