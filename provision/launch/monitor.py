"""Sample each node while it trains: GPU utilisation and memory through nvidia-smi (NVML)
where there are GPUs, CPU and RAM from /proc always. One short command per sample over
the run's own SSH connection; the parsers are pure."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

SAMPLE_COMMAND = (
    "head -n1 /proc/stat; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo; echo '--gpu--'; "
    "nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total "
    "--format=csv,noheader,nounits 2>/dev/null || true"
)


@dataclass(frozen=True)
class Raw:
    """One reading of a node, before differencing."""

    t: float  # controller clock, seconds
    cpu_busy: int  # jiffies not idle/iowait since boot
    cpu_total: int  # all jiffies since boot
    mem_used_pct: float  # (MemTotal - MemAvailable) / MemTotal * 100
    gpus: tuple[tuple[float, float, float], ...]  # per GPU: (util %, mem used MiB, mem total MiB)


def parse_sample(text: str, t: float) -> Raw:
    """Parse SAMPLE_COMMAND's output."""
    head, _, gpu_part = text.partition("--gpu--")
    busy = total = 0
    mem: dict[str, int] = {}
    for line in head.splitlines():
        parts = line.split()
        if parts and parts[0] == "cpu":
            jiffies = [int(x) for x in parts[1:9]]  # user nice system idle iowait irq softirq steal
            total = sum(jiffies)
            busy = total - jiffies[3] - jiffies[4]
        elif parts and parts[0].rstrip(":") in ("MemTotal", "MemAvailable"):
            mem[parts[0].rstrip(":")] = int(parts[1])
    mem_pct = 100.0 * (1 - mem["MemAvailable"] / mem["MemTotal"]) if len(mem) == 2 else 0.0
    gpus = []
    for line in gpu_part.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        try:
            gpus.append((float(cells[1]), float(cells[2]), float(cells[3])))
        except (IndexError, ValueError):
            continue  # "[N/A]" or an error line
    return Raw(t, busy, total, mem_pct, tuple(gpus))


@dataclass(frozen=True)
class Sample:
    """Utilisation over the interval between two readings."""

    t: float  # controller clock at the later reading
    cpu_pct: float  # busy share of all CPUs
    mem_pct: float  # RAM in use
    gpu_util: float | None  # mean over the node's GPUs; None without GPUs
    gpu_mem_pct: float | None  # mean GPU memory in use


def difference(a: Raw, b: Raw) -> Sample:
    dt = b.cpu_total - a.cpu_total
    cpu = 100.0 * (b.cpu_busy - a.cpu_busy) / dt if dt > 0 else 0.0
    util = mem = None
    if b.gpus:
        util = sum(g[0] for g in b.gpus) / len(b.gpus)
        mem = sum(100.0 * g[1] / g[2] for g in b.gpus if g[2]) / len(b.gpus)
    return Sample(b.t, cpu, b.mem_used_pct, util, mem)


@dataclass(frozen=True)
class Usage:
    """Mean and peak over a run, per node."""

    samples: int  # how many intervals were measured
    cpu_mean: float
    cpu_peak: float
    mem_peak: float
    gpu_util_mean: float | None
    gpu_util_peak: float | None
    gpu_mem_peak: float | None


def usage(samples: list[Sample]) -> Usage | None:
    if not samples:
        return None
    cpu = [s.cpu_pct for s in samples]
    gpu = [s.gpu_util for s in samples if s.gpu_util is not None]
    gmem = [s.gpu_mem_pct for s in samples if s.gpu_mem_pct is not None]
    return Usage(
        len(samples),
        sum(cpu) / len(cpu),
        max(cpu),
        max(s.mem_pct for s in samples),
        sum(gpu) / len(gpu) if gpu else None,
        max(gpu) if gpu else None,
        max(gmem) if gmem else None,
    )


@dataclass
class Monitor:
    """Samples every node every ``interval`` seconds until stopped."""

    sample: Callable[[str], str | None]  # host -> SAMPLE_COMMAND output, None on failure
    hosts: list[str]  # node names
    interval: float  # seconds between readings
    series: dict[str, list[Sample]] = field(default_factory=dict)  # host -> samples
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._loop, args=(h,), daemon=True) for h in self.hosts]
        for t in threads:
            t.start()
        return threads

    def stop(self) -> None:
        self._stop.set()

    def _loop(self, host: str) -> None:
        self.series[host] = []
        last: Raw | None = None
        while not self._stop.is_set():
            text = self.sample(host)
            if text:
                try:
                    raw = parse_sample(text, time.monotonic())
                except (KeyError, ValueError, IndexError):
                    raw = None
                if raw and last:
                    self.series[host].append(difference(last, raw))
                last = raw or last
            self._stop.wait(self.interval)
