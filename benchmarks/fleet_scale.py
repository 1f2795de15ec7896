"""The controller's cost at 10, 100, 300 (and 1,000) simulated hosts: wall time, CPU time,
peak RSS and open file descriptors for `inventory check`, `facts`, `status`, `plan` and
`up` on converged hosts (copies of a provisioned testbed node, fleet_profiles/
testbed-converged.json), and
validate's judge and reports (JSON, HTML, JUnit) on 8-GPU nodes; and the time headless
Chromium takes to open the HTML report and draw its first screen (where it is installed;
its CPU is the browser's, its RSS and fds are not counted).

Hosts are the fleet stand-in (tests/standins/fleet_standin.py): a pyinfra connector
answering every command from outputs captured on a real Debian 12 host after a fixed
latency (50 ms by default), so only the controller's own work is measured. The judge's
inputs are H100 nodes as NVML describes them (tests/helpers/validate_records.h100, 8 per
node) with measurements near the datasheet and a 1 % spread; one node in 50 has a slow GPU.

Each (step, fleet size) runs in a fresh child process, so peak RSS is that step's alone
(it includes the interpreter and imports: see the baseline row). A step whose run passes
--budget-s is not run at larger sizes (said in the table).

    .venv/bin/python benchmarks/fleet_scale.py                     # 10, 100, 300
    .venv/bin/python benchmarks/fleet_scale.py --sizes 10,100,300,1000 --budget-s 120
    .venv/bin/python benchmarks/fleet_scale.py --steps facts --sizes 1000 --parallel 100
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("baseline", "inventory_check", "facts", "status", "plan_up", "judge_reports")
CONVERGED = "testbed-converged"  # tests/standins/fleet_profiles: copies of a provisioned testbed node


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _cli(*args: str) -> int:
    """`provision ARGS` in this process, its output thrown away; the exit code."""
    from provision.cli import main

    sys.argv = ["provision", *args]
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        try:
            main()
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 0
    return 0


def _timed(work: Callable[[], Any]) -> tuple[dict[str, float], Any]:
    """Wall and CPU seconds of work(), and the most file descriptors open while it ran
    (sampled by a greenlet, so during the gevent-driven steps)."""
    import gevent

    peak = [_fds()]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], _fds())
            gevent.sleep(0.02)

    sampler = gevent.spawn(sample)
    wall, cpu = time.monotonic(), time.process_time()
    value = work()
    figures = {"wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu}
    sampler.kill()
    figures["fds"] = max(peak[0], _fds())
    return figures, value


def _exit_in(timed: tuple[dict[str, float], Any]) -> dict[str, float]:
    """The figures, with the command's exit code (0: every simulated host answered)."""
    figures, code = timed
    return {**figures, "exit": code}


def _fleet_inventory(n: int, tmp: Path, latency_s: float, parallel: int) -> tuple[Any, Path]:
    from tests.standins.fleet_standin import SimulatedFleet

    fleet = SimulatedFleet.spread(n, latency_s=latency_s)
    return fleet, fleet.write_inventory(tmp / "fleet.py", parallel=parallel)


def _up_steps() -> str:
    """The steps a converged copy runs (fleet_profiles/capture_up.py); frameworks only where
    the captured node's wheelhouse is on this machine (the controller checks its wheels)."""
    from tests.standins.fleet_profiles.capture_up import STEPS as CAPTURED
    from tests.standins.fleet_standin import profile_doc

    house = Path(profile_doc(CONVERGED)["host_data"]["wheelhouse"])
    return CAPTURED if house.is_dir() else CAPTURED.replace(",frameworks", "")


def _plan_up(n: int, tmp: Path, latency_s: float, parallel: int) -> dict[str, Any]:
    """`plan` (CLI) and `up` (the pipeline: the CLI's host locks hold an SSH session per host,
    which the stand-in does not simulate) on n converged hosts. A first, untimed `up` writes
    what is the fleet's own (known_hosts of every node, the training key); the timed `up`
    must change nothing and fail nothing, else the figures are not of a converged fleet."""
    from provision import inventory
    from provision.up import pipeline
    from tests.standins.fleet_standin import SimulatedFleet, simulated

    os.environ["PROVISION_STATE_DIR"] = str(tmp / "provision-state")
    fleet = SimulatedFleet.spread(n, latency_s=latency_s, profile=CONVERGED)
    inv = fleet.write_inventory(tmp / "fleet.py", parallel=parallel, command_timeout_s=60)
    steps = _up_steps()
    with simulated(fleet):
        first = pipeline.up(inventory.load(inv), pipeline.select(only=steps))
        failed = {name: r.failures for name, r in first.hosts.items() if r.failures}
        if failed:
            raise SystemExit(f"the converging up failed on {len(failed)} hosts: {list(failed.items())[:3]}")
        parts: dict[str, Any] = {}
        parts["plan (converged)"] = _exit_in(_timed(lambda: _cli("plan", str(inv), "--only", steps)))
        timed, report = _timed(lambda: pipeline.up(inventory.load(inv), pipeline.select(only=steps)))
    changed = {name: (r.changed, r.failures) for name, r in report.hosts.items() if r.changed or r.failures}
    if changed:
        raise SystemExit(f"the converged up changed or failed {len(changed)} hosts: {list(changed.items())[:3]}")
    parts["up (converged)"] = timed | {"steps": steps}
    return parts


def _node_inputs(n: int) -> list[Any]:
    """n 8-GPU H100 nodes with near-datasheet measurements; one in 50 has a slow GPU."""
    from provision.validate.judge import NodeInput
    from provision.validate.records import Measurement
    from tests.helpers.validate_records import h100

    rng = random.Random(20)
    node_metrics = {
        "cpu_gemm_gflops": 2500.0,
        "ram_copy_gbs": 300.0,
        "ram_scale_gbs": 300.0,
        "ram_add_gbs": 320.0,
        "ram_triad_gbs": 320.0,
        "disk_seq_read_mibs": 6000.0,
        "disk_seq_write_mibs": 4000.0,
        "disk_rand_read_iops": 900000.0,
        "net_gbits": 180.0,
        "gpu_allreduce_busbw_gbs": 360.0,
    }
    gpu_metrics = {
        "gpu_bf16_tflops": 750.0,
        "gpu_fp16_tflops": 750.0,
        "gpu_tf32_tflops": 380.0,
        "gpu_fp32_tflops": 50.0,
        "gpu_hbm_gbs": 2900.0,
        "gpu_h2d_gbs": 52.0,
        "gpu_d2h_gbs": 52.0,
        "gpu_burn_mismatches": 0.0,
        "gpu_burn_throughput_ratio": 0.99,
        "gpu_pcie_gen": 5.0,
        "gpu_pcie_width": 16.0,
        "gpu_ecc_uncorrected": 0.0,
        "gpu_retired_pages": 0.0,
        "gpu_hw_slowdown": 0.0,
    }
    inputs = []
    for i in range(n):
        name = f"node-{i:04d}"
        ms = [Measurement(name, k, v * rng.uniform(0.99, 1.01)) for k, v in node_metrics.items()]
        for g in range(8):
            slow = 0.6 if (i % 50 == 7 and g == 3) else 1.0
            for k, v in gpu_metrics.items():
                value = v * (rng.uniform(0.99, 1.01) * slow if k.endswith(("tflops", "gbs")) else 1.0)
                ms.append(Measurement(name, k, value, device=f"gpu{g}"))
        gpus = [h100(g) for g in range(8)]
        # The report's GPU inventory, as the controller passes it on (controller._input).
        inventory = {"gpus": [asdict(g) for g in gpus]}
        inputs.append(NodeInput(name, ms, gpus, wants_gpu=True, inventory=inventory))
    return inputs


def _judge_reports(n: int, tmp: Path) -> dict[str, Any]:
    from provision.validate import judge, report_html, report_json, report_junit

    inputs = _node_inputs(n)
    parts: dict[str, Any] = {}
    parts["judge"], results = _timed(lambda: judge.judge(inputs))
    run = report_json.RunInfo(inventory="fleet.py", mode="quick", groups=[], exit_code=judge.exit_code(results))
    parts["json"], _ = _timed(lambda: report_json.write(tmp / "r.json", results, run))
    parts["html"], _ = _timed(lambda: report_html.write(tmp / "r.html", results))
    parts["junit"], _ = _timed(lambda: report_junit.write(tmp / "r.xml", results))
    parts["html"]["bytes"] = (tmp / "r.html").stat().st_size
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        parts["html in chromium"] = _chromium_open(tmp / "r.html", tmp)
    return parts


def _chromium_open(page: Path, tmp: Path) -> dict[str, float]:
    """Headless Chromium opens the report and screenshots its first screen: wall seconds and
    the browser's CPU seconds (all its processes, as this process's children)."""
    from tests.helpers import chromium

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic()
    chromium.screenshot(page, tmp / "shot.png", tmp / "chromium", timeout_s=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"wall_s": time.monotonic() - wall, "cpu_s": cpu, "fds": _fds()}


def worker(step: str, n: int, latency_s: float, parallel: int) -> dict[str, Any]:
    """One step at one fleet size, in this (fresh) process."""
    import pyinfra_cli  # noqa: F401  # patches threading with gevent first, as the CLI and tests do

    import provision.cli
    import provision.engine  # noqa: F401  # imports are not the step's cost: done before the clock
    from tests.standins.fleet_standin import simulated

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        os.environ["XDG_STATE_HOME"] = str(tmp / "state")  # status reads validate history here
        fleet, inv = _fleet_inventory(n, tmp, latency_s, parallel)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        if step == "baseline":
            parts = {step: _timed(lambda: None)[0]}
        elif step == "inventory_check":
            parts = {step: _exit_in(_timed(lambda: _cli("inventory", "check", str(inv), "--json")))}
        elif step in ("facts", "status"):
            with simulated(fleet):
                parts = {step: _exit_in(_timed(lambda: _cli(step, str(inv), "--json")))}
        elif step == "plan_up":
            parts = _plan_up(n, tmp, latency_s, parallel)
            fleet.most_busy = 0  # another fleet: its own count is not kept
        else:
            parts = _judge_reports(n, tmp)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"step": step, "n": n, "parts": parts, "rss_before_mib": rss_before, "peak_rss_mib": rss}
    return out | {"most_hosts_at_once": fleet.most_busy}


def _run_child(step: str, n: int, latency_s: float, budget_s: float, parallel: int) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--worker", step, str(n), str(latency_s), str(parallel)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=budget_s * 3, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None
    if p.returncode != 0:
        raise SystemExit(f"{step} at {n} hosts failed:\n{p.stderr[-3000:]}")
    figures: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return figures


def measure(
    sizes: list[int], latency_s: float, budget_s: float, steps: tuple[str, ...] = STEPS, parallel: int = 0
) -> tuple[list[dict[str, Any]], list[str]]:
    rows, skipped = [], []
    for step in steps:
        for n in sizes:
            figures = _run_child(step, n, latency_s, budget_s, parallel)
            if figures is None:
                skipped.append(f"{step}: killed at {n} hosts after {budget_s * 3:.0f} s; larger sizes not run")
                break
            rows.append(figures)
            print(json.dumps(figures), file=sys.stderr, flush=True)
            slowest = max(p["wall_s"] for p in figures["parts"].values())
            if slowest > budget_s and n != sizes[-1]:
                skipped.append(
                    f"{step}: {slowest:.0f} s at {n} hosts, over the {budget_s:.0f} s budget; larger sizes not run"
                )
                break
    return rows, skipped


def table(rows: list[dict[str, Any]], sizes: list[int]) -> str:
    """A markdown table: one line per (part, size), with the growth of wall and CPU time
    from the previous size against the fleet's own growth."""
    lines = [
        "| step | hosts | wall s | CPU s | peak RSS MiB | max open fds | wall growth (fleet growth) | CPU growth |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_part: dict[str, list[tuple[int, dict[str, float], float]]] = {}
    for r in rows:
        for part, f in r["parts"].items():
            by_part.setdefault(part, []).append((r["n"], f, r["peak_rss_mib"]))
    for part, seen in by_part.items():
        prev: tuple[int, dict[str, float], float] | None = None
        for n, f, rss in seen:
            growth = cpu_growth = ""
            if prev is not None:
                growth = f"x{f['wall_s'] / max(prev[1]['wall_s'], 1e-6):.1f} (x{n / prev[0]:.1f})"
                cpu_growth = f"x{f['cpu_s'] / max(prev[1]['cpu_s'], 1e-6):.1f}"
            figures = f"{f['wall_s']:.3f} | {f['cpu_s']:.3f} | {rss:.0f} | {f['fds']:.0f}"
            lines.append(f"| {part} | {n} | {figures} | {growth} | {cpu_growth} |")
            prev = (n, f, rss)
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 20's targets at 1,000 hosts, where measured: facts and the converged up within 4x
    their 100-host time and under 5 minutes, the judge and the HTML report in Chromium under
    10 s, peak RSS under 2 GiB. The misses."""
    wall = {(part, r["n"]): f["wall_s"] for r in rows for part, f in r["parts"].items()}
    missed = [
        f"peak RSS {r['peak_rss_mib']:.0f} MiB > 2 GiB ({r['step']}, {r['n']} hosts)"
        for r in rows
        if r["peak_rss_mib"] > 2048
    ]
    for part in ("facts", "up (converged)"):
        if (part, 1000) in wall and (part, 100) in wall:
            ratio = wall[part, 1000] / wall[part, 100]
            if ratio > 4 or wall[part, 1000] > 300:
                missed.append(
                    f"{part} at 1000 hosts: {wall[part, 1000]:.1f} s, x{ratio:.1f} its 100-host time (target x4)"
                )
    if wall.get(("judge", 1000), 0) > 10:
        missed.append(f"judge at 1000 hosts: {wall['judge', 1000]:.1f} s (target 10 s)")
    if wall.get(("html in chromium", 1000), 0) > 10:
        missed.append(f"HTML report in Chromium at 1000 hosts: {wall['html in chromium', 1000]:.1f} s (target 10 s)")
    return missed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10,100,300", help="fleet sizes, comma separated")
    p.add_argument("--latency-s", type=float, default=0.05, help="each simulated command's latency")
    p.add_argument("--budget-s", type=float, default=60.0, help="a step over this is not run at larger sizes")
    p.add_argument("--steps", default=",".join(STEPS), help=f"steps to measure, comma separated ({', '.join(STEPS)})")
    p.add_argument("--parallel", type=int, default=0, help="the fleet's parallel setting (0: pyinfra's choice)")
    p.add_argument("--worker", nargs=4, metavar=("STEP", "N", "LATENCY", "PARALLEL"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        step, n, latency, parallel = args.worker
        print(json.dumps(worker(step, int(n), float(latency), int(parallel))))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    start = time.monotonic()
    steps = tuple(args.steps.split(","))
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        p.error(f"--steps: unknown {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    rows, skipped = measure(sizes, args.latency_s, args.budget_s, steps, args.parallel)
    print(table(rows, sizes))
    for line in skipped:
        print(f"- not run: {line}")
    print(f"\n{len(rows)} runs in {time.monotonic() - start:.0f} s; {os.cpu_count()} CPUs")
    missed = targets(rows)
    for line in missed:
        print(f"- target missed: {line}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
