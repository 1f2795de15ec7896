"""RAM triad of the validate agent against a C/OpenMP reference, same arrays, same run.

Target: agent triad / C triad >= 0.90. The agent's array size rule (>= 4x LLC) is used for
both; runs alternate (C, agent, C, agent, ...) and each side keeps its best, so a noisy
neighbour on a shared machine hits both alike.

    .venv/bin/python benchmarks/validate_ram.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provision.validate import agent  # noqa: E402

TARGET = 0.90


def build(tmp: Path) -> Path:
    exe = tmp / "stream"
    subprocess.run(
        ["gcc", "-O3", "-fopenmp", "-o", str(exe), str(ROOT / "benchmarks" / "stream.c")], check=True, timeout=120
    )
    return exe


def c_triad(exe: Path, n: int, threads: int, reps: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "true"}
    out = subprocess.run(
        [str(exe), str(n), str(reps)], capture_output=True, text=True, check=True, timeout=300, env=env
    ).stdout
    return {k: float(v) for k, v in (part.split("=") for part in out.split())}


def agent_triad(cpu: dict, ram: dict, reps: int) -> dict[str, float]:
    res = agent.Results()
    agent.bench_ram(torch, {"stream_reps": reps}, cpu, ram, res)
    return {r["metric"].removeprefix("ram_").removesuffix("_gbs"): r["value"] for r in res.rows}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=6)
    args = p.parse_args()
    cpu, ram = agent.cpu_inventory(), agent.ram_inventory()
    n = agent._stream_elements(cpu["llc_bytes"], ram["total_bytes"])
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        best_c: dict[str, float] = {}
        best_a: dict[str, float] = {}
        for _ in range(args.rounds):
            for k, v in c_triad(exe, n, cpu["threads"], args.reps).items():
                best_c[k] = max(best_c.get(k, 0.0), v)
            for k, v in agent_triad(cpu, ram, args.reps).items():
                best_a[k] = max(best_a.get(k, 0.0), v)
    print(f"arrays: {n} doubles ({n * 8 >> 20} MiB each), LLC {cpu['llc_bytes'] >> 20} MiB, {cpu['threads']} threads")
    for k in ("copy", "scale", "add", "triad"):
        print(f"{k:>6}: agent {best_a[k]:7.2f} GB/s  C/OpenMP {best_c[k]:7.2f} GB/s  ratio {best_a[k] / best_c[k]:.3f}")
    ratio = best_a["triad"] / best_c["triad"]
    ok = ratio >= TARGET
    print(f"RAM triad agent/C = {ratio:.3f} (target >= {TARGET}) {'OK' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
