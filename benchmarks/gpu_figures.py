"""The GPU figures issues 5 and 6 ask for, from the files benchmarks/gpu_check.sh writes
into one directory on a GPU machine. Prints each figure against its target and exits 1
when one is missed (or could not be read).

- quick bf16 GEMM / best of the full shape sweep, same GPU, same call: >= 0.97
- quick bf16 GEMM: >= 760 TFLOP/s (H200)
- HBM copy bandwidth: >= 3900 GB/s (H200)
- the GPU part of quick mode: <= 60 s (wall time of `agent --mode quick --only gpu`)
- reference trainer, bf16 with torch.compile: MFU >= 0.45

Run: python3 benchmarks/gpu_figures.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def best(doc: dict, metric: str) -> float | None:
    """The best value of a metric over the GPUs of one agent document."""
    values = [r["value"] for r in doc.get("results", []) if r["metric"] == metric and r["value"] is not None]
    return max(values) if values else None


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def figures(out: Path) -> list[tuple[str, float | None, str, bool]]:
    quick, full = load(out / "agent-quick.json"), load(out / "agent-full.json")
    train = load(out / "train-summary.json")
    seconds_text = (out / "agent-quick.seconds").read_text().strip() if (out / "agent-quick.seconds").is_file() else ""
    seconds = float(seconds_text) if seconds_text else None
    q_bf16, f_bf16, hbm = best(quick, "gpu_bf16_tflops"), best(full, "gpu_bf16_tflops"), best(quick, "gpu_hbm_gbs")
    ratio = q_bf16 / f_bf16 if q_bf16 and f_bf16 else None
    mfu = train.get("mfu")
    rows = [
        ("bf16 GEMM quick / best of full sweep", ratio, ">= 0.97", ratio is not None and ratio >= 0.97),
        ("bf16 GEMM quick, TFLOP/s", q_bf16, ">= 760", q_bf16 is not None and q_bf16 >= 760),
        ("HBM copy, GB/s", hbm, ">= 3900", hbm is not None and hbm >= 3900),
        ("GPU part of quick mode, s", seconds, "<= 60", seconds is not None and seconds <= 60),
        ("trainer MFU, bf16 + torch.compile", mfu, ">= 0.45", mfu is not None and mfu >= 0.45),
    ]
    return rows


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else ".")
    rows = figures(out)
    for name, value, target, ok in rows:
        shown = "not measured" if value is None else f"{value:.3f}"
        print(f"{name}: {shown} (target {target}) {'OK' if ok else 'MISSED'}")
    return 0 if all(ok for *_, ok in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
