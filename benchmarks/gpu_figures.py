"""The steps of benchmarks/gpu_check.sh that need Python, one subcommand each, and the
table of figures it prints last (issue 15's device check). Every step writes its figures
as JSON into the run's directory; ``table`` reads them all, prints figure, value, target
and OK/MISS, and exits 1 on any miss (a figure not measured is a miss).

    python3 benchmarks/gpu_figures.py names DIR      NVML names the agent and trainer use exist in pynvml
    python3 benchmarks/gpu_figures.py judge DIR      the real judge on the agent's quick GPU output
    python3 benchmarks/gpu_figures.py sweep DIR      bf16 GEMM mini-sweep on gpu0, against quick's best
    python3 benchmarks/gpu_figures.py burn DIR       20 s sustained burn on gpu0 with NVML telemetry
    python3 benchmarks/gpu_figures.py captures DIR   provision's GPU fact commands, timed, and raw driver
                                                     files, saved under DIR/captures for fixtures
    python3 benchmarks/gpu_figures.py table DIR      the table (reads every step's JSON, and the trainer's summary)

Needs only torch, nvidia-ml-py and this repository (pyinfra/fabric are not imported).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from provision.validate import agent, agent_stream, judge  # noqa: E402 (after the path above)

SWEEP_SHAPES = [(n, n, n) for n in (4096, 6144, 8192, 12288, 16384)] + [(8192, 8192, 16384), (16384, 8192, 8192)]
SWEEP_S = 30  # the mini-sweep's budget on gpu0
BURN_S = 20  # the sustained burn on gpu0


def save(out: Path, name: str, data: dict[str, Any]) -> None:
    (out / f"{name}.json").write_text(json.dumps(data, indent=1))


def load(out: Path, name: str) -> dict[str, Any]:
    try:
        data = json.loads((out / name).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def names(out: Path) -> int:
    """Every nvml* function and NVML_* constant agent.py and train_ddp.py name must exist
    in the installed nvidia-ml-py (a typo there fails every GPU node)."""
    import pynvml

    used: set[str] = set()
    for path in (ROOT / "provision/validate/agent.py", ROOT / "training/train_ddp.py"):
        used |= set(re.findall(r"\b(nvml[A-Z]\w+|NVML_[A-Z0-9_]+)\b", path.read_text()))
    missing = sorted(n for n in used if not hasattr(pynvml, n))
    save(out, "names", {"used": len(used), "missing": missing})
    print(f"{len(used)} NVML names used; missing from pynvml: {', '.join(missing) or 'none'}")
    return 1 if missing else 0


def judge_quick(out: Path) -> int:
    """The agent's quick GPU output through the controller's parser and the real judge."""
    report = agent_stream.agent_output((out / "agent-quick.jsonl").read_text(), "this-node")
    node = judge.NodeInput("this-node", list(report.measurements), list(report.gpus), True)
    (result,) = judge.judge([node])
    for f in result.findings:
        where = f"[{f.device}]" if f.device else ""
        print(f"{f.verdict.upper():8} {f.metric}{where}: {f.value} {f.unit}  {f.reason}")
    print(f"verdict: {result.verdict.upper()} (SKU {result.sku or 'none'})")
    best = max((m.value for m in report.measurements if m.metric == "gpu_bf16_tflops" and m.value), default=None)
    hbm = max((m.value for m in report.measurements if m.metric == "gpu_hbm_gbs" and m.value), default=None)
    save(out, "judge", {"verdict": result.verdict, "sku": result.sku, "bf16_best": best, "hbm_best": hbm})
    return 0 if result.verdict in ("pass", "warn") else 1


def sweep(out: Path) -> int:
    """More shapes than quick mode's three, on gpu0, within SWEEP_S."""
    import torch

    res = agent.Results()
    cfg = {**agent.MODES["quick"], "gemm_shapes": SWEEP_SHAPES}
    agent._gemm(torch, cfg, 0, agent.GEMM_DTYPES[0], agent.Budget(SWEEP_S), agent.Sink(res, "sweep"))
    row = res.rows[0]
    print(f"bf16 sweep on gpu0: {row['value']} TFLOP/s ({row['detail']})")
    save(out, "sweep", {"bf16_best": row["value"], "detail": row["detail"]})
    return 0


def burn(out: Path) -> int:
    """BURN_S of bf16 GEMMs on gpu0, NVML sampled meanwhile."""
    import torch

    res = agent.Results()
    cfg = {**agent.MODES["quick"], "burn_s": BURN_S}
    agent._burn(torch, cfg, 0, agent.Budget(BURN_S + agent.GRACE_S), agent.Sink(res, "burn"))
    rows = {r["metric"]: r for r in res.rows}
    for r in res.rows:
        print(f"{r['metric']}: {r['value']} {r['not_run']} {r['detail']}")
    save(out, "burn", {m: rows[m]["value"] if m in rows else None for m in agent_burn_metrics()})
    return 0


# The fact commands that reach the GPU, as `up`, `facts` and the Slurm health check run them.
# The GPU image has no pyinfra, so they are kept here; tests/unit/test_gpu_fact_commands.py
# holds this file equal to the fact classes' own command() text.
FACT_COMMANDS = ROOT / "benchmarks" / "gpu_fact_commands.json"
# Raw driver views for fixtures (tests/fixtures/SOURCES.md): NVML's full XML (the NVML
# stand-in reads it), the device files and the driver's per-GPU information (its minor
# number, which names /dev/nvidiaN and is not among nvidia-smi's --query-gpu fields).
RAW_COMMANDS = {
    "nvidia-smi-q-x.xml": "nvidia-smi -q -x",
    "dev-nvidia.txt": "ls -l /dev/nvidia* /dev/nvidia-caps 2>&1",
    "proc-driver-nvidia.txt": "cat /proc/driver/nvidia/version; for f in /proc/driver/nvidia/gpus/*/information; "
    'do echo "== $f"; cat "$f"; done',
    "help-query-gpu.txt": "nvidia-smi --help-query-gpu",
}


def captures(out: Path) -> int:
    """Each GPU fact command under sh, timed (a health check runs them and must answer in
    seconds), and the raw driver files, all saved under out/captures."""
    import subprocess
    import time

    where = out / "captures"
    where.mkdir(exist_ok=True)
    commands = json.loads(FACT_COMMANDS.read_text())
    timings: dict[str, float] = {}
    for name, command in {**{f"fact-{k}.txt": v for k, v in commands.items()}, **RAW_COMMANDS}.items():
        start = time.monotonic()
        p = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
        timings[name] = round(time.monotonic() - start, 3)
        (where / name).write_text(
            f"$ {command}\n# exit {p.returncode}\n{p.stdout}" + (f"# stderr\n{p.stderr}" if p.stderr else "")
        )
        print(f"{name}: exit {p.returncode}, {timings[name]} s, {len(p.stdout.splitlines())} lines")
    slowest = max(v for k, v in timings.items() if k.startswith("fact-"))
    save(out, "captures", {"seconds": timings, "slowest_fact_s": slowest})
    return 0


def agent_burn_metrics() -> tuple[str, ...]:
    return ("gpu_burn_mismatches", "gpu_burn_throughput_ratio", "gpu_hw_slowdown")


Row = tuple[str, float | None, str, bool]


def _at_least(name: str, value: Any, floor: float) -> Row:
    ok = isinstance(value, int | float) and value >= floor
    return name, value if isinstance(value, int | float) else None, f">= {floor:g}", ok


def _at_most(name: str, value: Any, ceiling: float) -> Row:
    ok = isinstance(value, int | float) and value <= ceiling
    return name, value if isinstance(value, int | float) else None, f"<= {ceiling:g}", ok


def figures(out: Path) -> list[Row]:
    names_, verdict = load(out, "names.json"), load(out, "judge.json")
    sweep_, burn_, train = load(out, "sweep.json"), load(out, "burn.json"), load(out, "train-summary.json")
    steps = load(out, "steps.json")  # step name -> exit code, from the shell script
    facts = load(out, "captures.json")
    quick_s = load(out, "agent-quick.time.json").get("seconds")
    q, s = verdict.get("bf16_best"), sweep_.get("bf16_best")
    ratio = q / s if isinstance(q, float) and isinstance(s, float) and s else None
    rows = [
        _at_most("NVML names missing from pynvml", len(names_["missing"]) if "missing" in names_ else None, 0),
        ("judge verdict on quick GPU output", None, "pass or warn", verdict.get("verdict") in ("pass", "warn")),
        _at_most("agent --quick --only gpu, wall s", quick_s, 110),
        _at_least("bf16 GEMM quick / mini-sweep best", ratio, 0.97),
        _at_least("bf16 GEMM quick, TFLOP/s (H200: 760)", q, 760),
        _at_least("HBM copy, GB/s (H200: 3900)", verdict.get("hbm_best"), 3900),
        _at_most("burn 20 s: mismatches", burn_.get("gpu_burn_mismatches"), 0),
        _at_least("burn 20 s: last/first window throughput", burn_.get("gpu_burn_throughput_ratio"), 0.9),
        _at_most("burn 20 s: HW slowdown reasons (>1 sample)", burn_.get("gpu_hw_slowdown"), 0),
        _at_most("pytest -m gpu tests/gpu exit code", steps.get("pytest"), 0),
        _at_least("trainer gpt2 preset, bf16 + compile, MFU", train.get("mfu"), 0.45),
        _at_most("GPU fact commands, slowest, wall s", facts.get("slowest_fact_s"), 5),
    ]
    return rows


def table(out: Path) -> int:
    rows = figures(out)
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':{width}}  {'value':>12}  {'target':>14}  result")
    for name, value, target, ok in rows:
        shown = "not measured" if value is None else f"{value:.4g}"
        if name.startswith("judge verdict"):
            shown = load(out, "judge.json").get("verdict", "not measured")
        print(f"{name:{width}}  {shown:>12}  {target:>14}  {'OK' if ok else 'MISS'}")
    return 0 if all(ok for *_, ok in rows) else 1


COMMANDS = {"names": names, "judge": judge_quick, "sweep": sweep, "burn": burn, "captures": captures, "table": table}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in COMMANDS:
        print(__doc__)
        return 2
    return COMMANDS[argv[1]](Path(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
