"""One PNG beside the logs: loss curves, throughput over the run, per-node throughput,
and per-node utilisation from the monitor. matplotlib with the Agg backend (no display)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from provision.launch.monitor import Sample
from provision.launch.report import TrainReport
from provision.launch.session import Outcome


def plot(out: Outcome, report: TrainReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ((loss, speed), (nodes, util)) = plt.subplots(2, 2, figsize=(12, 8))
    curves = out.curves
    if curves.train:
        loss.plot(*zip(*curves.train, strict=True), label="train")
    if curves.val:
        loss.plot(*zip(*curves.val, strict=True), "o-", label="validation")
    loss.set(title="loss", xlabel="step", ylabel="cross-entropy (nats/byte)")
    loss.legend()
    if curves.tokens_per_s:
        speed.plot(*zip(*curves.tokens_per_s, strict=True))
    speed.set(title="cluster throughput", xlabel="step", ylabel="tokens/s")
    names = [n.name for n in report.nodes]
    nodes.bar(names, [n.tokens_per_s or 0 for n in report.nodes])
    nodes.set(title="throughput per node (own pace)", ylabel="tokens/s")
    for name in names:
        _utilisation(util, name, out.samples.get(name, []))
    util.set(title="utilisation per node (GPU where present, else CPU)", xlabel="s", ylabel="%", ylim=(0, 105))
    if any(out.samples.values()):
        util.legend()
    fig.suptitle(f"{report.run_id}: {'ok' if report.ok else 'FAILED'}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _utilisation(ax: Any, name: str, samples: list[Sample]) -> None:
    if not samples:
        return
    t0 = samples[0].t
    gpu = all(s.gpu_util is not None for s in samples)
    values = [(s.gpu_util if gpu else s.cpu_pct) for s in samples]
    ax.plot([s.t - t0 for s in samples], values, label=f"{name} {'GPU' if gpu else 'CPU'}")
