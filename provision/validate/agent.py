"""provision validate node agent: measure this machine and print one JSON document.

This file is uploaded to each node and run there with the node's framework venv python
(fallback: python3). It must stay ONE self-contained file using only the standard library,
plus torch / numpy / pynvml when they are installed; it needs no network. That is why it
is longer than our other modules: splitting it would mean shipping a package.

Nothing missing is ever a crash or a pass: every metric is either a value or a
``not_run`` reason that names what to do ("torch missing: run the `up` step frameworks").

Usage (on the node):
    python agent.py --mode quick --only cpu,ram,disk,gpu,allreduce --data-dir /data
    torchrun ... agent.py allreduce-worker --mb 256      # one rank of the multi-node all-reduce
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SCHEMA = 2  # agent_stream.AGENT_SCHEMA on the controller must match
NO_GPU = "not run: no GPU"
NO_TORCH = "not run: torch missing in this python (run the `up` step frameworks)"
GPU_METRICS = (
    "gpu_bf16_tflops",
    "gpu_fp16_tflops",
    "gpu_tf32_tflops",
    "gpu_fp32_tflops",
    "gpu_hbm_gbs",
    "gpu_h2d_gbs",
    "gpu_d2h_gbs",
    "gpu_burn_mismatches",
    "gpu_burn_throughput_ratio",
    "gpu_pcie_gen",
    "gpu_pcie_width",
)

# Run lengths. Sizes and repetition counts are upper bounds: every measurement also stops
# at its phase's time budget (BUDGETS_S), and sizes shrink on a node too slow for them.
MODES = {
    "quick": {
        "cpu_n": 1536,
        "cpu_reps": 4,
        "stream_reps": 6,
        "fio_size": "512M",
        "fio_s": 3,
        "gemm_shapes": [(8192, 8192, 8192), (4096, 4096, 4096), (6144, 6144, 6144)],
        "gemm_iters": 10,
        "gemm_preheat_s": 1.5,
        "gemm_warmup_s": 0.1,
        "copy_mb": 1024,
        "h2d_mb": 512,
        "burn_n": 8192,
        "burn_s": 15,
        "allreduce_mb": 256,
    },
    "full": {
        "cpu_n": 3072,
        "cpu_reps": 8,
        "stream_reps": 12,
        "fio_size": "4G",
        "fio_s": 15,
        "gemm_shapes": [
            (m, n, k) for m in (4096, 8192, 12288, 16384) for n in (4096, 8192, 16384) for k in (4096, 8192, 16384)
        ],
        "gemm_iters": 20,
        "gemm_preheat_s": 3.0,
        "gemm_warmup_s": 0.1,
        "copy_mb": 4096,
        "h2d_mb": 2048,
        "burn_n": 8192,
        "burn_s": 90,
        "allreduce_mb": 1024,
    },
}

# Seconds each phase may take, per mode. A phase past its budget (plus GRACE_S) is cut
# off and reported "not run: timed out"; the agent moves on. gemm is shared by the four
# dtypes, copies by all GPUs (they run one at a time), so the sum does not grow with the
# GPU count; gemm, hbm and burn run on every GPU at once, each GPU its own phase.
BUDGETS_S: dict[str, dict[str, float]] = {
    "quick": {"cpu": 30, "ram": 30, "disk": 45, "gemm": 40, "hbm": 10, "copies": 20, "burn": 25, "allreduce": 40},
    "full": {"cpu": 90, "ram": 90, "disk": 150, "gemm": 240, "hbm": 30, "copies": 60, "burn": 110, "allreduce": 120},
}
GRACE_S = 5  # a phase may overrun its budget by this much (a rep that started in time)
# Outside the phases: starting python, importing torch, reading the inventory and NVML,
# and each phase's grace. Generous: importing torch alone takes ~30 s on a starved VM.
MARGIN_S = {"quick": 240, "full": 300}
# Share of a phase's budget one repetition may take when the size is chosen, so a phase
# gets several repetitions and a rep that starts in time ends near it.
REP_SHARE = 0.1


def outer_deadline_s(mode: str, budgets: dict[str, float] | None = None) -> int:
    """The agent's whole run on one node: its phase budgets plus the margin around them."""
    return int(sum((budgets or BUDGETS_S[mode]).values()) + MARGIN_S[mode])


class Budget:
    """One phase's time budget. ``clock`` is injectable so tests need no real waiting."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = seconds, clock
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def part(self, share: float) -> Budget:
        """A budget of ``share`` of what is left now, on the same clock."""
        return Budget(max(self.left(), 0.0) * share, self.clock)


def repeat(fn: Callable[[], Any], budget: Budget, max_reps: int) -> list[float]:
    """Seconds of each fn() call, repeated until max_reps, or until the next call would
    end past the budget (judged by the slowest call so far), whichever comes first."""
    times: list[float] = []
    while len(times) < max_reps and budget.left() > (max(times) if times else 0.0):
        t0 = budget.clock()
        fn()
        times.append(budget.clock() - t0)
    return times


def probe_seconds(fn: Callable[[], Any], budget: Budget) -> float:
    """Mean seconds of fn() over 5 % of the budget: long enough to see a CPU quota (a
    cgroup runs at full speed for a slice of each 100 ms period, then waits), so a probe
    on a throttled node is not mistaken for a fast one."""
    times = repeat(fn, budget.part(0.05), 10_000)
    return max(sum(times) / len(times), 1e-9) if times else max(budget.seconds, 1e-9)


def reps_note(got: int, wanted: int, budget: Budget) -> str:
    """ "best of 4 reps", or why fewer ran: "2 of 4 reps (20 s budget reached)"."""
    if got >= wanted:
        return f"best of {got} reps"
    return f"{got} of {wanted} reps ({budget.seconds:g} s budget reached)"


class Results:
    """Collects metric values and not-run reasons; thread-safe for the phase threads.

    With a ``stream``, every row is also written there as one JSON line the moment it is
    added, so the controller keeps it even when the agent is killed later."""

    def __init__(self, stream: Any = None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.stream = stream
        self._lock = threading.Lock()

    def emit(self, line: dict[str, Any]) -> None:
        if self.stream is not None:
            with self._lock:
                self.stream.write(json.dumps(line) + "\n")
                self.stream.flush()

    def add(
        self, metric: str, value: float | None, device: str = "", not_run: str = "", detail: str = "", phase: str = ""
    ) -> None:
        row = {"metric": metric, "device": device, "value": value, "not_run": not_run if value is None else ""}
        row.update(detail=detail, phase=phase)
        with self._lock:
            self.rows.append(row)
        self.emit({"type": "row", **row})

    def skip(self, metrics: tuple[str, ...] | list[str], reason: str, device: str = "", phase: str = "") -> None:
        for m in metrics:
            self.add(m, None, device, reason, phase=phase)

    def error(self, where: str, exc: BaseException) -> str:
        line = f"{where}: {type(exc).__name__}: {exc}"
        with self._lock:
            self.errors.append(line)
        return f"not run: {line}"

    def reported(self, phase: str) -> set[tuple[str, str]]:
        with self._lock:
            return {(r["metric"], r["device"]) for r in self.rows if r["phase"] == phase}


class Sink:
    """What a phase writes its rows to: the run's Results until the phase is closed (cut
    off at its deadline); rows its abandoned thread adds after that are dropped."""

    def __init__(self, res: Results, phase: str) -> None:
        self.res, self.phase, self.closed = res, phase, False
        self._lock = threading.Lock()  # a row is either in before close() or dropped

    def add(self, metric: str, value: float | None, device: str = "", not_run: str = "", detail: str = "") -> None:
        with self._lock:
            if not self.closed:
                self.res.add(metric, value, device, not_run, detail, self.phase)

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def skip(self, metrics: tuple[str, ...] | list[str], reason: str, device: str = "") -> None:
        for m in metrics:
            self.add(m, None, device, reason)

    def error(self, where: str, exc: BaseException) -> str:
        return self.res.error(where, exc)


@dataclass
class Phase:
    """One bounded piece of the run."""

    name: str  # "cpu", "disk", "gpu0 gemm bf16", "gpu1 burn", "allreduce"
    budget_s: float  # seconds before it is cut off (plus GRACE_S)
    metrics: tuple[str, ...]  # the rows it owes
    device: str  # "" for the node, "gpu0".. for a GPU
    fn: Callable[[Budget, Sink], None]  # the measurement; reads the budget, writes the sink
    not_run: str = ""  # set when it cannot run at all: every row gets this reason

    def plan(self) -> dict[str, Any]:
        return {"phase": self.name, "budget_s": self.budget_s, "metrics": list(self.metrics), "device": self.device}


def timed_out(phase: str, seconds: float) -> str:
    return f"not run: timed out after {seconds:g} s (phase {phase})"


def run_phases(phases: list[Phase], res: Results, clock: Callable[[], float] = time.monotonic) -> None:
    """Run phases side by side (one thread each), each cut off at its own deadline; rows a
    phase owes but never sent get "timed out" (cut off) or the error that stopped it."""
    started: list[tuple[Phase, Sink, threading.Thread, Budget]] = []
    for p in phases:
        res.emit({"type": "phase", "phase": p.name, "state": "start", "budget_s": p.budget_s})
        sink, budget = Sink(res, p.name), Budget(p.budget_s, clock)
        if p.not_run:
            sink.skip(p.metrics, p.not_run, p.device)
        thread = threading.Thread(target=_guarded, args=(p, budget, sink), daemon=True)
        if not p.not_run:
            thread.start()
        started.append((p, sink, thread, budget))
    for p, sink, thread, budget in started:
        if thread.is_alive():
            thread.join(max(budget.left() + GRACE_S, 0.0))
        sink.close()
        owed = [m for m in p.metrics if (m, p.device) not in res.reported(p.name)]
        if thread.is_alive():
            res.skip(owed, timed_out(p.name, p.budget_s), p.device, p.name)
        elif owed:
            res.skip(owed, f"not run: phase {p.name} ended without a result", p.device, p.name)
        res.emit({"type": "phase", "phase": p.name, "state": "end", "seconds": round(budget.elapsed(), 3)})


def _guarded(p: Phase, budget: Budget, sink: Sink) -> None:
    try:
        p.fn(budget, sink)
    except Exception as e:  # e.g. out of memory, Xid: the phase gets a reason, not a crash
        done = sink.res.reported(p.name)
        sink.skip([m for m in p.metrics if (m, p.device) not in done], sink.error(p.name, e), p.device)
        with sink.res._lock:
            sink.res.errors.append(traceback.format_exc(limit=3))


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _cpulist(text: str) -> list[int]:
    """'0-3,8-11' -> [0, 1, 2, 3, 8, 9, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus += range(int(lo), int(hi) + 1)
        elif part:
            cpus.append(int(part))
    return cpus


# --- inventory ---------------------------------------------------------------------------


def cpu_inventory() -> dict[str, Any]:
    info = _read("/proc/cpuinfo")
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    blocks = [dict(re.findall(r"^([^:\n]+?)\s*:\s*(.*)$", b, re.M)) for b in info.split("\n\n")]
    sockets = {b.get("physical id") for b in blocks if "processor" in b}
    cores = {(b.get("physical id"), b.get("core id")) for b in blocks if "core id" in b}
    usable = len(os.sched_getaffinity(0))
    numa = sorted(glob.glob("/sys/devices/system/node/node[0-9]*"))
    return {
        "model": model.group(1).strip() if model else platform.processor(),
        "sockets": max(len(sockets), 1),
        "cores": len(cores) or usable,
        "threads": usable,
        "numa_nodes": max(len(numa), 1),
        "ghz": _cpu_ghz(info),
        "isa": _isa(set(flags.group(1).split()) if flags else set(), _amd_family(info)),
        "llc_bytes": _llc_bytes(),
    }


def _cpu_ghz(cpuinfo: str) -> float | None:
    """Sustained clock for the peak estimate: cpufreq max, else the current MHz (VMs)."""
    khz = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
    if khz.isdigit():
        return int(khz) / 1e6
    mhz = re.search(r"^cpu MHz\s*:\s*([\d.]+)", cpuinfo, re.M)
    return float(mhz.group(1)) / 1000 if mhz else None


# fp32 FLOP per cycle per core: vector lanes x 2 (FMA) x 2 FMA ports (Skylake-SP and newer,
# Zen 2+). AVX without FMA: 8 lanes x (1 add + 1 mul port). SSE: 4 lanes x 2.
_ISA_FLOPS = [("avx512f", 64), ("avx2+fma", 32), ("avx", 16), ("sse2", 8), ("asimd", 16)]
# Zen 4 (AMD family 0x19) runs AVX-512 on 256-bit units, two passes per instruction: the
# same 32 FLOP/cycle as AVX2. Counting 64 there would halve every Zen 4 server's fraction
# and warn on healthy hardware. Zen 5 (0x1A) has full 512-bit units.
_ZEN4_FAMILY = 0x19


def _amd_family(cpuinfo: str) -> int | None:
    if not re.search(r"^vendor_id\s*:\s*AuthenticAMD", cpuinfo, re.M):
        return None
    family = re.search(r"^cpu family\s*:\s*(\d+)", cpuinfo, re.M)
    return int(family.group(1)) if family else None


def _isa(flags: set[str], amd_family: int | None = None) -> dict[str, Any]:
    have = {
        "avx512f": "avx512f" in flags,
        "avx2+fma": {"avx2", "fma"} <= flags,
        "avx": "avx" in flags,
        "sse2": "sse2" in flags,
        "asimd": "asimd" in flags,
    }
    for name, flops in _ISA_FLOPS:
        if have[name]:
            if name == "avx512f" and amd_family == _ZEN4_FAMILY:
                flops = 32
            return {
                "best": name,
                "fp32_flops_per_cycle": flops,
                "flags": sorted(f for f in flags if f.startswith(("avx", "fma", "amx", "sse4"))),
            }
    return {"best": "scalar", "fp32_flops_per_cycle": 2, "flags": []}


def _llc_bytes() -> int:
    """Total last-level cache: the highest cache level, summed over its distinct instances."""
    best_level, total = 0, 0
    seen: set[str] = set()
    for idx in glob.glob("/sys/devices/system/cpu/cpu*/cache/index*"):
        level = int(_read(f"{idx}/level") or 0)
        size = _read(f"{idx}/size").strip()
        shared = _read(f"{idx}/shared_cpu_list").strip()
        if not size or _read(f"{idx}/type").strip() == "Instruction":
            continue
        nbytes = int(size[:-1]) * 1024 if size.endswith("K") else int(size.rstrip("M")) << 20
        if level > best_level:
            best_level, seen, total = level, set(), 0
        if level == best_level and shared not in seen:
            seen.add(shared)
            total += nbytes
    return total or 32 << 20


def ram_inventory() -> dict[str, Any]:
    m = re.search(r"^MemTotal:\s*(\d+) kB", _read("/proc/meminfo"), re.M)
    return {"total_bytes": int(m.group(1)) * 1024 if m else None}


def disk_inventory(data_dir: str) -> dict[str, Any]:
    if not os.path.isdir(data_dir):
        return {"path": data_dir, "exists": False}
    st = os.statvfs(data_dir)
    return {
        "path": data_dir,
        "exists": True,
        "free_bytes": st.f_bavail * st.f_frsize,
        "size_bytes": st.f_blocks * st.f_frsize,
        "device": _mount_source(data_dir),
    }


def _mount_source(path: str) -> str:
    best, source = "", ""
    for line in _read("/proc/mounts").splitlines():
        dev, mnt = line.split()[:2]
        if path.startswith(mnt) and len(mnt) > len(best):
            best, source = mnt, dev
    return source


def nic_inventory() -> list[dict[str, Any]]:
    nics = []
    for path in sorted(glob.glob("/sys/class/net/*")):
        name = os.path.basename(path)
        if name == "lo":
            continue
        speed = _read(f"{path}/speed").strip()
        nics.append(
            {
                "name": name,
                "mac": _read(f"{path}/address").strip(),
                "state": _read(f"{path}/operstate").strip(),
                "speed_mbits": int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None,
            }
        )
    return nics


# --- CPU: fp32 GEMM ------------------------------------------------------------------------

CPU_METRICS = ("cpu_gemm_gflops", "cpu_gemm_peak_fraction")
PROBE_N = 128  # the first GEMM, small enough for any node; it sizes the real one


def cpu_threads(torch: Any, cpu: dict[str, Any]) -> int:
    # One thread per physical core: hyper-threads share the FMA ports, and oversubscribing
    # them makes a GEMM slower, not faster (the peak below counts physical cores too).
    threads = int(min(cpu["cores"], cpu["threads"]))
    torch.set_num_threads(threads)
    return threads


def cpu_gemm_n(cfg: dict[str, Any], threads: int, probe_gflops: float, budget: Budget) -> int:
    """The GEMM size: the mode's n (grown with the cube root of the core count so many-core
    servers reach their FMA units' steady state; 1536 is sized for ~8 cores), reduced so
    one rep takes at most REP_SHARE of the budget at the speed the probe measured."""
    n = max(cfg["cpu_n"], int(cfg["cpu_n"] * (threads / 8) ** (1 / 3)) // 256 * 256)
    fits = int((REP_SHARE * max(budget.left(), 0.0) * probe_gflops * 1e9 / 2) ** (1 / 3)) // 64 * 64
    return int(max(min(n, fits), PROBE_N))


def bench_cpu(torch: Any, cfg: dict[str, Any], cpu: dict[str, Any], budget: Budget, out: Sink) -> None:
    threads = cpu_threads(torch, cpu)
    probe = torch.randn(PROBE_N, PROBE_N)
    torch.mm(probe, probe)  # warm-up: thread pool and BLAS kernels
    t = probe_seconds(lambda: torch.mm(probe, probe), budget)
    wanted = cfg["cpu_n"]
    n = cpu_gemm_n(cfg, threads, 2 * PROBE_N**3 / max(t, 1e-9) / 1e9, budget)
    a, b = torch.randn(n, n), torch.randn(n, n)
    times = repeat(lambda: torch.mm(a, b), budget, cfg["cpu_reps"])
    if not times:
        return out.skip(CPU_METRICS, f"not run: no GEMM fitted in the {budget.seconds:g} s budget")
    gflops = 2 * n**3 / min(times) / 1e9
    note = f"n={n}, {threads} threads, {reps_note(len(times), cfg['cpu_reps'], budget)}"
    if n < wanted:
        note += (
            f"; n reduced from {wanted} to fit the {budget.seconds:g} s budget on this node (slow, emulated or busy)"
        )
    out.add("cpu_gemm_gflops", gflops, detail=note)
    peak = _cpu_peak_gflops(cpu)
    if peak:
        out.add(
            "cpu_gemm_peak_fraction",
            gflops / peak,
            detail=f"peak {peak:.0f} GFLOP/s = {cpu['cores']} cores x {cpu['ghz']:.2f} GHz x "
            f"{cpu['isa']['fp32_flops_per_cycle']} FLOP/cycle ({cpu['isa']['best']})",
        )
    else:
        out.add("cpu_gemm_peak_fraction", None, not_run="not run: CPU clock unknown")


def _cpu_peak_gflops(cpu: dict[str, Any]) -> float | None:
    if not cpu.get("ghz"):
        return None
    # Hyper-threads share the FMA ports: the peak counts physical cores we may run on.
    cores = min(cpu["cores"], cpu["threads"])
    return float(cores * cpu["ghz"] * cpu["isa"]["fp32_flops_per_cycle"])


# --- RAM: STREAM-style --------------------------------------------------------------------

# Bytes moved per element, as STREAM counts them (reads + writes, no write-allocate).
_STREAM_BYTES = {"copy": 16, "scale": 16, "add": 24, "triad": 24}
RAM_METRICS = tuple(f"ram_{k}_gbs" for k in _STREAM_BYTES)
PROBE_ELEMENTS = 1 << 18  # 2 MiB per array: sizes the real arrays on a slow node


def bench_ram(
    torch: Any, cfg: dict[str, Any], cpu: dict[str, Any], ram: dict[str, Any], budget: Budget, out: Sink
) -> None:
    torch.set_num_threads(cpu["threads"])
    wanted = _stream_elements(cpu["llc_bytes"], ram.get("total_bytes"))
    probe_gbs = _stream_probe_gbs(torch, budget)
    # One rep (4 kernels, 80 bytes per element) within REP_SHARE of the budget, and the
    # arrays' first touch (another pass) counted too.
    fits = int(REP_SHARE * max(budget.left(), 0.0) * probe_gbs * 1e9 / (80 + 24))
    n = max(min(wanted, fits), PROBE_ELEMENTS)
    kernels, best, reps = _stream_kernels(torch, n), dict.fromkeys(_STREAM_BYTES, float("inf")), 0
    next(iter(kernels.values()))()  # the first pass pays page faults and thread start-up
    while reps < cfg["stream_reps"] and budget.left() > 0:
        for name, kernel in kernels.items():
            t0 = budget.clock()
            kernel()
            best[name] = min(best[name], budget.clock() - t0)
        reps += 1
    if not reps:
        return out.skip(RAM_METRICS, f"not run: no STREAM pass fitted in the {budget.seconds:g} s budget")
    detail = f"{n} doubles per array ({n * 8 >> 20} MiB), {reps_note(reps, cfg['stream_reps'], budget)}"
    if n < wanted:
        detail += (
            f"; arrays reduced from {wanted * 8 >> 20} MiB (under 4x the LLC) to fit the {budget.seconds:g} s "
            "budget on this node (slow, emulated or busy)"
        )
    for name, dt in best.items():
        out.add(f"ram_{name}_gbs", _STREAM_BYTES[name] * n / max(dt, 1e-12) / 1e9, detail=detail)


def _stream_kernels(torch: Any, n: int) -> dict[str, Callable[[], Any]]:
    a = torch.full((n,), 1.0, dtype=torch.float64)
    b = torch.full((n,), 2.0, dtype=torch.float64)
    c = torch.zeros(n, dtype=torch.float64)
    s = 3.0
    return {
        "copy": lambda: c.copy_(a),
        "scale": lambda: torch.mul(c, s, out=b),
        "add": lambda: torch.add(a, b, out=c),
        "triad": lambda: torch.add(b, c, alpha=s, out=a),
    }


def _stream_probe_gbs(torch: Any, budget: Budget) -> float:
    """Triad bandwidth on small arrays: an upper bound of what the big ones reach."""
    triad = _stream_kernels(torch, PROBE_ELEMENTS)["triad"]
    triad()
    return 24 * PROBE_ELEMENTS / probe_seconds(triad, budget) / 1e9


def _stream_elements(llc_bytes: int, total_bytes: int | None) -> int:
    """Each array >= 4x the last-level cache (STREAM's rule), at least 16M doubles, and the
    three arrays within an eighth of RAM."""
    n = max(4 * llc_bytes // 8, 16 << 20)
    if total_bytes:
        n = min(n, total_bytes // 8 // 24)
    return n


# --- disk: fio ----------------------------------------------------------------------------

DISK_METRICS = ("disk_seq_write_mibs", "disk_seq_read_mibs", "disk_rand_read_iops")


def fio_jobfile(path: str, size: str, runtime_s: int, direct: bool, ramp_s: int = 1) -> str:
    """seq write 1M, seq read 1M, rand read 4k; one after the other (stonewall)."""
    common = (
        f"[global]\nfilename={path}\nsize={size}\ndirect={int(direct)}\nioengine=libaio\n"
        f"time_based=1\nruntime={runtime_s}\nramp_time={ramp_s}\ngroup_reporting=1\n"
        "invalidate=1\n"
    )
    jobs = [
        ("seq_write", "rw=write\nbs=1M\niodepth=16\n"),
        ("seq_read", "rw=read\nbs=1M\niodepth=16\n"),
        ("rand_read", "rw=randread\nbs=4k\niodepth=64\nnumjobs=4\nnorandommap=1\n"),
    ]
    return common + "".join(f"[{name}]\nstonewall\n{body}" for name, body in jobs)


def bench_disk(cfg: dict[str, Any], data_dir: str, budget: Budget, out: Sink) -> None:
    if not shutil.which("fio"):
        return out.skip(DISK_METRICS, "not run: fio missing (run the `up` step base)")
    if not os.path.isdir(data_dir):
        return out.skip(DISK_METRICS, f"not run: data volume {data_dir} does not exist (run the `up` step volumes)")
    unmounted = _unmounted_volume(data_dir)
    if unmounted:  # fio would measure the root disk under the empty mount point
        why = f"not run: {unmounted} is not mounted (the volumes step of provision up makes it)"
        return out.skip(DISK_METRICS, why)
    workdir = tempfile.mkdtemp(prefix=".provision-validate-", dir=data_dir)
    try:
        plan = fio_plan(cfg, _write_probe_mibs(workdir), budget.left())
        report, direct = _run_fio(workdir, plan, budget)
        _disk_results(report, direct, plan, out)
    except subprocess.TimeoutExpired:
        out.skip(DISK_METRICS, timed_out("disk", budget.seconds))
    except Exception as e:  # fio failed: say why instead of reporting a number
        out.skip(DISK_METRICS, out.error("fio", e))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass(frozen=True)
class FioPlan:
    """fio's file size and per-job runtime, from the mode and the time left."""

    size_mib: int  # file size; reads need it laid out first, so a slow disk gets less
    runtime_s: int  # each of the 3 jobs runs this long, after its ramp
    ramp_s: int  # fio's ramp_time per job (not measured)
    note: str  # what was reduced and why, "" when nothing was


def fio_plan(cfg: dict[str, Any], probe_mibs: float, seconds_left: float) -> FioPlan:
    """Laying the file out takes at most a fifth of the time left at the probed write speed;
    the three jobs share half of it (fio's own runtime bound, like its time_based mode)."""
    wanted_mib = _mib(cfg["fio_size"])
    size = max(min(wanted_mib, int(probe_mibs * seconds_left / 5)), 16)
    ramp = 1 if seconds_left >= 30 else 0  # a short budget has no second to spare per job
    runtime = max(min(cfg["fio_s"], int(seconds_left / 2 / 3) - ramp), 1)
    reduced = []
    if size < wanted_mib:
        reduced.append(f"file {size} MiB instead of {wanted_mib} (writes at {probe_mibs:.0f} MiB/s)")
    if runtime < cfg["fio_s"]:
        reduced.append(f"{runtime} s per job instead of {cfg['fio_s']}")
    note = "; reduced to fit the time budget: " + ", ".join(reduced) if reduced else ""
    return FioPlan(size, runtime, ramp, note)


def _mib(size: str) -> int:
    return int(size[:-1]) << 10 if size.endswith("G") else int(size.rstrip("M"))


def _write_probe_mibs(workdir: str, mib: int = 8) -> float:
    """Write speed of a small synced file: sizes fio's file on a slow disk."""
    path, block = os.path.join(workdir, "probe.dat"), os.urandom(1 << 20)
    t0 = time.monotonic()
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.monotonic() - t0
    os.unlink(path)
    return mib / max(seconds, 1e-6)


def _unmounted_volume(data_dir: str) -> str:
    """The /etc/fstab mount point holding ``data_dir`` that is not mounted now, or "".

    The volumes step mounts the data volume with ``nofail``: when the mount fails the node
    still boots, and its empty mount point is a directory on the root disk."""
    path = os.path.realpath(data_dir)
    for mnt in _fstab_mount_points(_read("/etc/fstab")):
        inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
        if mnt != "/" and inside and not os.path.ismount(mnt):
            return mnt
    return ""


def _fstab_mount_points(text: str) -> list[str]:
    points = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and not fields[0].startswith("#") and fields[1].startswith("/"):
            # fstab writes a space in a path as \040
            points.append(os.path.normpath(re.sub(r"\\(\d{3})", lambda m: chr(int(m.group(1), 8)), fields[1])))
    return points


def _run_fio(workdir: str, plan: FioPlan, budget: Budget) -> tuple[dict[str, Any], bool]:
    target = os.path.join(workdir, "fio.dat")
    for direct in (True, False):  # tmpfs and some FUSE mounts refuse O_DIRECT
        jobfile = os.path.join(workdir, "jobs.fio")
        with open(jobfile, "w") as f:
            f.write(fio_jobfile(target, f"{plan.size_mib}M", plan.runtime_s, direct, plan.ramp_s))
        # Killed at the phase's deadline (TimeoutExpired): the caller says it timed out.
        p = subprocess.run(
            ["fio", "--output-format=json", jobfile], capture_output=True, text=True, timeout=max(budget.left(), 1)
        )
        start = p.stdout.find("{")
        if p.returncode == 0 and start >= 0:
            return json.loads(p.stdout[start:]), direct
        refused_direct = "direct" in p.stderr.lower() or "Invalid argument" in p.stderr
        if not (direct and refused_direct):
            raise RuntimeError(f"fio exited {p.returncode}: {p.stderr.strip()[-300:]}")
    raise RuntimeError("fio did not run")


def _disk_results(report: dict[str, Any], direct: bool, plan: FioPlan, out: Sink) -> None:
    jobs = {j["jobname"]: j for j in report["jobs"]}
    note = ("O_DIRECT" if direct else "buffered: the filesystem refused O_DIRECT") + (
        f", {plan.size_mib} MiB file, {plan.runtime_s} s per job{plan.note}"
    )
    for metric, job, side, key in (
        ("disk_seq_write_mibs", "seq_write", "write", "bw_bytes"),
        ("disk_seq_read_mibs", "seq_read", "read", "bw_bytes"),
        ("disk_rand_read_iops", "rand_read", "read", "iops"),
    ):
        j = jobs[job]
        if j.get("error"):
            out.add(metric, None, not_run=f"not run: fio job {job} error {j['error']}")
            continue
        value = float(j[side][key])
        out.add(metric, value / 2**20 if key == "bw_bytes" else value, detail=note)


# --- GPU ---------------------------------------------------------------------------------


def gpu_inventory() -> tuple[list[dict[str, Any]], str, str]:
    """(GPUs from NVML, nvidia-smi -q -x text when NVML is unavailable, why neither).

    A GPU NVML cannot read (NVML_ERROR_GPU_IS_LOST: it fell off the bus) is listed as
    ``{"index": i, "error": ...}`` and the others are kept. Raises only when NVML started
    but cannot even count the GPUs; run() turns that into a not-run reason."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        xml = _nvidia_smi_xml()
        if xml:
            return [], xml, ""
        devices = nvidia_pci_devices()
        if devices:  # the GPUs are there and the driver cannot reach them: never "no GPU"
            raise BrokenDriver(devices, e) from e
        return [], "", f"no NVML ({type(e).__name__}) and no nvidia-smi"
    try:
        driver = _nv(pynvml.nvmlSystemGetDriverVersion)
        cuda = _nv(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        cuda_s = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        count = pynvml.nvmlDeviceGetCount()
        return [_nvml_gpu_or_lost(pynvml, i, _s(driver) if driver else None, cuda_s) for i in range(count)], "", ""
    finally:
        _nv(pynvml.nvmlShutdown)


class BrokenDriver(RuntimeError):
    """NVIDIA GPUs in sysfs, but neither NVML nor nvidia-smi answers: the driver is broken."""

    def __init__(self, devices: list[str], cause: BaseException) -> None:
        what = f"{type(cause).__name__}: {cause}"
        hint = (
            "the loaded kernel module and the NVIDIA libraries differ: reboot after a driver upgrade"
            if "mismatch" in what.lower()
            else "load or reinstall the NVIDIA driver (run the `up` step nvidia)"
        )
        super().__init__(f"NVIDIA GPU at {', '.join(devices)} but NVML failed ({what}): {hint}")


def nvidia_pci_devices(root: str = "/sys/bus/pci/devices") -> list[str]:
    """PCI addresses of NVIDIA display controllers (vendor 0x10de, class 0x03xxxx): GPUs
    the kernel sees whatever state the driver is in."""
    found = []
    for dev in sorted(glob.glob(f"{root}/*")):
        vendor, cls = _read(f"{dev}/vendor").strip(), _read(f"{dev}/class").strip()
        if vendor == "0x10de" and cls.startswith("0x03"):
            found.append(os.path.basename(dev))
    return found


def _nvml_gpu_or_lost(nv: Any, i: int, driver: str | None, cuda: str | None) -> dict[str, Any]:
    try:
        return _nvml_gpu(nv, i, driver, cuda)
    except Exception as e:  # this GPU only: the rest of the node is still measured
        return {"index": i, "error": f"{type(e).__name__}: {e}"}


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nv(fn: Any, *args: Any) -> Any:
    """An NVML query, or None when this GPU or driver does not support it."""
    try:
        return fn(*args)
    except Exception:
        return None


def _nvml_gpu(nv: Any, i: int, driver: str | None, cuda: str | None) -> dict[str, Any]:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    pci = nv.nvmlDeviceGetPciInfo(h)
    mem = _nv(nv.nvmlDeviceGetMemoryInfo, h)
    bus = _s(pci.busId)
    return {
        "index": i,
        "name": _s(nv.nvmlDeviceGetName(h)),
        "pci_device_id": (pci.pciDeviceId >> 16) & 0xFFFF,
        "memory_mib": mem.total >> 20 if mem else None,
        "driver_version": driver,
        "cuda_version": cuda,
        "pcie_gen_current": _nv(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
        "pcie_gen_max": _nv(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
        "pcie_gen_device_max": _nv(nv.nvmlDeviceGetGpuMaxPcieLinkGeneration, h),
        "pcie_width_current": _nv(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
        "pcie_width_max": _nv(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
        **_nvml_health(nv, h),
        "persistence_mode": _nv(nv.nvmlDeviceGetPersistenceMode, h) == 1,
        "bus_id": bus,
        "numa_node": _pci_numa(bus),
        "clocks_mhz": {
            "sm": _nv(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            "sm_max": _nv(lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
        },
        **_nvlinks(nv, h),
        **_nvml_mig(nv, h),
        "compute_mode": _compute_mode(nv, h),
        "processes": _gpu_processes(nv, h),
    }


def _nvml_health(nv: Any, h: Any) -> dict[str, Any]:
    """Memory health as NVIDIA's "GPU Memory Error Management" guide reads it: volatile
    (since boot) and aggregate (lifetime) ECC counts, row remapping (Ampere and newer) or
    page retirement (older GPUs), and the SRAM error threshold flag. Every constant is read
    inside the guard: a name this pynvml lacks costs one value, not the GPU."""
    remap = _nv(nv.nvmlDeviceGetRemappedRows, h)  # (correctable, uncorrectable, pending, failure)
    retired = [
        _nv(lambda: nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)),
        _nv(lambda: nv.nvmlDeviceGetRetiredPages(h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)),
    ]
    known = [len(r) for r in retired if r is not None]
    pending_pages = _nv(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    reasons = (
        _nv(nv.nvmlDeviceGetCurrentClocksEventReasons, h) or _nv(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h) or 0
    )
    return {
        **_ecc(nv, h),
        "retired_pages": sum(known) if known else None,
        "retired_pages_pending": None if pending_pages is None else pending_pages == 1,
        "remapped_rows_correctable": remap[0] if remap else None,
        "remapped_rows_uncorrectable": remap[1] if remap else None,
        "remap_pending": bool(remap[2]) if remap else None,
        "remap_failure": bool(remap[3]) if remap else None,
        "sram_threshold_exceeded": _sram_threshold(nv, h),
        "throttle_active": _throttle_names(reasons),
    }


def _ecc(nv: Any, h: Any) -> dict[str, Any]:
    """ECC mode ("enabled"/"disabled"; None: the GPU has no ECC) and its four counts.
    ``ecc_uncorrected``/``ecc_corrected`` stay the aggregate (lifetime) counts, as the
    controller has read them since schema 1; the volatile (since boot) ones are new keys."""

    def count(uncorrected: bool, aggregate: bool) -> Any:
        def read() -> Any:  # the constants are looked up inside the guard too
            kind = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED if uncorrected else nv.NVML_MEMORY_ERROR_TYPE_CORRECTED
            counter = nv.NVML_AGGREGATE_ECC if aggregate else nv.NVML_VOLATILE_ECC
            return nv.nvmlDeviceGetTotalEccErrors(h, kind, counter)

        return _nv(read)

    mode = _nv(nv.nvmlDeviceGetEccMode, h)  # [current, pending]
    return {
        "ecc_mode": _feature(mode[0]) if mode else None,
        "ecc_mode_pending": _feature(mode[1]) if mode else None,
        "ecc_uncorrected": count(uncorrected=True, aggregate=True),
        "ecc_corrected": count(uncorrected=False, aggregate=True),
        "ecc_uncorrected_volatile": count(uncorrected=True, aggregate=False),
        "ecc_corrected_volatile": count(uncorrected=False, aggregate=False),
    }


def _feature(state: int) -> str:
    return "enabled" if state == 1 else "disabled"


def _sram_threshold(nv: Any, h: Any) -> bool | None:
    """NVML's SRAM error threshold flag (newer GPUs and drivers): SRAM errors past the
    threshold NVIDIA sets for replacing the GPU. None where NVML has no such query."""

    def read() -> bool:
        import ctypes

        status = nv.c_nvmlEccSramErrorStatus_v1_t()
        nv.nvmlDeviceGetSramEccErrorStatus(h, ctypes.byref(status))
        return bool(status.bThresholdExceeded)

    result: bool | None = _nv(read)
    return result


# NVML clock event reason bits that mean the GPU is held back (idle, app clocks and sync
# boost are normal). Values from nvml.h.
_THROTTLE_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


def _throttle_names(bits: int) -> list[str]:
    return [name for bit, name in _THROTTLE_BITS.items() if bits & bit]


def _nvlinks(nv: Any, h: Any) -> dict[str, int | None]:
    """NVLink links up, and links NVML reports on this GPU (None: no NVLink, or NVML
    cannot say: MIG mode hides them). A link past the GPU's last one is an error."""
    up = links = 0
    for link in range(_nv(lambda: nv.NVML_NVLINK_MAX_LINKS) or 18):
        state = _nv(nv.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            break
        links += 1
        up += int(state == 1)
    return {"nvlink_up": up if links else None, "nvlink_links": links or None}


def _nvml_mig(nv: Any, h: Any) -> dict[str, Any]:
    """MIG mode (current, pending) and the MIG devices that exist, with their memory."""
    mode = _nv(nv.nvmlDeviceGetMigMode, h)  # [current, pending]
    if not mode:
        return {"mig_mode": None, "mig_mode_pending": None, "mig_devices": []}
    slots = (_nv(nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0) if mode[0] == 1 else 0
    devices = []
    for k in range(slots):
        mig = _nv(nv.nvmlDeviceGetMigDeviceHandleByIndex, h, k)
        if mig is None:  # NVML_ERROR_NOT_FOUND: no device in this slot
            continue
        mem = _nv(nv.nvmlDeviceGetMemoryInfo, mig)
        devices.append(
            {
                "index": k,
                "gpu_instance_id": _nv(nv.nvmlDeviceGetGpuInstanceId, mig),
                "memory_mib": mem.total >> 20 if mem else None,
                "uuid": _s(_nv(nv.nvmlDeviceGetUUID, mig) or ""),
            }
        )
    return {"mig_mode": _feature(mode[0]), "mig_mode_pending": _feature(mode[1]), "mig_devices": devices}


_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}  # nvml.h


def _compute_mode(nv: Any, h: Any) -> str | None:
    mode = _nv(nv.nvmlDeviceGetComputeMode, h)
    return None if mode is None else _COMPUTE_MODES.get(mode, f"mode {mode}")


def _gpu_processes(nv: Any, h: Any) -> list[dict[str, Any]] | None:
    """Compute processes on the GPU other than this agent: pid, name and memory. The name
    comes from NVML (it sees processes of other containers), else from /proc."""
    procs = _nv(nv.nvmlDeviceGetComputeRunningProcesses, h)
    if procs is None:
        return None
    out = []
    for p in procs:
        if p.pid == os.getpid():
            continue
        name = _nv(nv.nvmlSystemGetProcessName, p.pid) or _read(f"/proc/{p.pid}/comm").strip()
        used = getattr(p, "usedGpuMemory", None)
        out.append({"pid": p.pid, "name": _s(name) or "?", "used_mib": used >> 20 if used else None})
    return out


def _pci_numa(bus_id: str) -> int | None:
    # NVML's bus id has an 8-digit domain; sysfs uses 4 digits, lower case.
    short = bus_id.lower()[-12:] if len(bus_id) > 12 else bus_id.lower()
    text = _read(f"/sys/bus/pci/devices/{short}/numa_node").strip()
    return int(text) if text.lstrip("-").isdigit() and int(text) >= 0 else None


def _nvidia_smi_xml() -> str:
    if not shutil.which("nvidia-smi"):
        return ""
    try:
        p = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    # Only a real report: anything else (a stand-in or broken nvidia-smi) would make the
    # controller's XML parser refuse the whole document, CPU results included.
    return p.stdout if p.returncode == 0 and "<nvidia_smi_log" in p.stdout else ""


# (metric, torch dtype name, TF32 allowed): GEMM phases run in this order, every GPU at
# once; the TF32 switch is process-wide, so all GPUs run the same dtype at a time.
GEMM_DTYPES = (
    ("gpu_bf16_tflops", "bfloat16", False),
    ("gpu_fp16_tflops", "float16", False),
    ("gpu_tf32_tflops", "float32", True),
    ("gpu_fp32_tflops", "float32", False),
)


def gpu_phases(
    torch: Any, cfg: dict[str, Any], budgets: dict[str, float], gpus: list[dict[str, Any]]
) -> list[list[Phase]]:
    """The GPU phases, in groups: the phases of a group run side by side, one per GPU.
    GEMM, HBM copy and burn on every GPU at once; host copies one GPU at a time (GPUs
    behind one PCIe switch would otherwise share its bandwidth)."""
    lost = {g["index"] for g in gpus if g.get("error")}  # already reported not run
    devs = [i for i in range(torch.cuda.device_count()) if i not in lost]
    by_index = {g["index"]: g for g in gpus}
    groups: list[list[Phase]] = []
    for kind in GEMM_DTYPES:

        def one(i: int, b: Budget, o: Sink, k: tuple[str, str, bool] = kind) -> None:
            _gemm(torch, cfg, i, k, b, o)

        gemm = _bind(one)
        groups.append(_per_gpu(f"gemm {kind[0].split('_')[1]}", budgets["gemm"] / 4, kind[:1], devs, gemm))
    groups.append(
        _per_gpu("hbm", budgets["hbm"], ("gpu_hbm_gbs",), devs, _bind(lambda i, b, o: _hbm(torch, cfg, i, b, o)))
    )
    burn = _bind(lambda i, b, o: _burn(torch, cfg, i, b, o))
    groups.append(_per_gpu("burn", budgets["burn"], ("gpu_burn_mismatches", "gpu_burn_throughput_ratio"), devs, burn))
    copies = _bind(lambda i, b, o: _host_copies(torch, cfg, i, by_index.get(i, {}), b, o))
    for i in devs:
        groups.append(_per_gpu("copies", budgets["copies"] / len(devs), ("gpu_h2d_gbs", "gpu_d2h_gbs"), [i], copies))
    return groups


PhaseFn = Callable[[Budget, Sink], None]


def _bind(fn: Callable[[int, Budget, Sink], None]) -> Callable[[int], PhaseFn]:
    """fn(gpu index, budget, sink) -> for each index, the phase function of that GPU."""
    return lambda i: lambda budget, out: fn(i, budget, out)


def _per_gpu(
    what: str, seconds: float, metrics: tuple[str, ...], devs: list[int], fn: Callable[[int], PhaseFn]
) -> list[Phase]:
    return [Phase(f"gpu{i} {what}", seconds, metrics, f"gpu{i}", fn(i)) for i in devs]


def _timed(torch: Any, dev: int, fn: Any, iters: int, budget: Budget, before: Any = None) -> tuple[float, int]:
    """Median seconds of fn() by CUDA events, and how many ran: up to ``iters``, stopping
    when the next would end past the budget. ``before`` runs outside the timed region.
    Each rep is synchronized, so a slow GPU is seen after one rep, not after all of them."""
    times: list[float] = []
    wall = 0.0
    while len(times) < iters and budget.left() > wall:
        t0 = budget.clock()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before:
            before()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        wall = max(wall, budget.clock() - t0)
    if not times:
        raise TimeoutError(f"no repetition fitted in the {budget.seconds:g} s budget")
    return float(sorted(times)[len(times) // 2]), len(times)


def _gemm(torch: Any, cfg: dict[str, Any], i: int, kind: tuple[str, str, bool], budget: Budget, out: Sink) -> None:
    """mamf-finder style: several shapes, L2 flushed before each timed matmul, best shape
    wins; the shapes share the budget, and those it does not reach are said so.

    The first shape is run back to back for ``gemm_preheat_s`` before it is timed, so that
    every shape is measured at the power-capped steady state a training run lives in. An
    H200 SXM measured cold reached 793 TFLOP/s bf16 for about a second, then held 600-720
    at its 700 W cap (sw_power_cap): measured cold, a phase's figure depended on what ran
    just before it, and fp16 fell from 724 to 620 between two runs (BENCHMARKS.md)."""
    metric, dtype_name, tf32 = kind
    torch.backends.cuda.matmul.allow_tf32 = tf32  # the same value in every GPU's thread
    torch.backends.cudnn.allow_tf32 = tf32
    shapes = cfg["gemm_shapes"]
    with torch.cuda.device(i):
        l2 = torch.cuda.get_device_properties(i).L2_cache_size or (64 << 20)
        flush = torch.empty(2 * l2 // 4, dtype=torch.int32, device=i)
        best, best_shape, tried, measured, reps = 0.0, None, 0, 0, 0
        for shape in shapes:
            share = budget.part(1 / (len(shapes) - tried))
            if share.seconds <= 0:
                break
            warm_s = cfg.get("gemm_preheat_s" if tried == 0 else "gemm_warmup_s", 0.0)
            tried += 1
            try:
                tflops, got = _gemm_shape(torch, cfg, i, shape, getattr(torch, dtype_name), share, flush, warm_s)
            except TimeoutError:  # its allocation and warm-up used its share: the next may fit
                continue
            measured, reps = measured + 1, reps + got
            if tflops > best:
                best, best_shape = tflops, shape
        del flush
        torch.cuda.empty_cache()
    if best_shape is None:
        return out.add(metric, None, f"gpu{i}", f"not run: no GEMM fitted in the {budget.seconds:g} s budget")
    reached = "" if measured == len(shapes) else f" ({budget.seconds:g} s budget reached)"
    detail = f"best shape {best_shape}, {measured} of {len(shapes)} shapes{reached}, {reps} reps"
    out.add(metric, best, f"gpu{i}", detail=detail)


def _gemm_shape(
    torch: Any,
    cfg: dict[str, Any],
    i: int,
    shape: tuple[int, int, int],
    dtype: Any,
    budget: Budget,
    flush: Any,
    warm_s: float = 0.0,
) -> tuple[float, int]:
    """TFLOP/s of one shape (median rep) and how many reps fitted its share of the budget,
    after ``warm_s`` of back-to-back products (at most a third of the share)."""
    m, n, k = shape
    a = torch.randn(m, k, device=i, dtype=dtype)
    b = torch.randn(k, n, device=i, dtype=dtype)
    c = torch.empty(m, n, device=i, dtype=dtype)
    # The first call is cuBLAS choosing its kernel; the rest bring the GPU to the state it is
    # measured in (see _gemm).
    warm = budget.clock() + min(warm_s, budget.left() / 3)
    torch.mm(a, b, out=c)
    while budget.clock() < warm:
        for _ in range(4):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize(i)
    t, got = _timed(torch, i, lambda: torch.mm(a, b, out=c), cfg["gemm_iters"], budget, flush.zero_)
    return 2 * m * n * k / t / 1e12, got


def _hbm(torch: Any, cfg: dict[str, Any], i: int, budget: Budget, out: Sink) -> None:
    """Device-to-device copy; counts read + write bytes."""
    with torch.cuda.device(i):
        n = cfg["copy_mb"] << 20
        src = torch.empty(n, dtype=torch.uint8, device=i)
        dst = torch.empty_like(src)
        dst.copy_(src)
        t, got = _timed(torch, i, lambda s=src, d=dst: d.copy_(s), 10, budget)
        out.add(
            "gpu_hbm_gbs", 2 * n / t / 1e9, f"gpu{i}", detail=f"{cfg['copy_mb']} MiB copy, {reps_note(got, 10, budget)}"
        )
        del src, dst
        torch.cuda.empty_cache()


# --- GPU under sustained load ----------------------------------------------------------------

# Clock event reasons that are the hardware slowing itself (names of _THROTTLE_BITS).
HW_SLOWDOWN = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
BURN_WINDOWS = 5  # throughput is compared between the first and the last of these


@dataclass
class BurnStats:
    """What a burn loop saw."""

    reps: int = 0  # GEMMs run
    mismatches: int = 0  # results that differed bitwise from the first
    seconds: float = 0.0  # how long it ran
    windows: list[float] = field(default_factory=list)  # GEMMs per second in each time window


def burn_loop(step: Callable[[], bool], budget: Budget, windows: int = BURN_WINDOWS) -> BurnStats:
    """Run ``step`` (one GEMM; True when its result equals the first) until the budget ends,
    counting mismatches and the rate of each of ``windows`` equal slices of the time."""
    stats, width = BurnStats(), budget.seconds / windows
    win_start, win_reps = budget.clock(), 0
    while budget.left() > 0:
        stats.mismatches += int(not step())
        stats.reps, win_reps = stats.reps + 1, win_reps + 1
        now = budget.clock()
        if now - win_start >= width:
            stats.windows.append(win_reps / (now - win_start))
            win_start, win_reps = now, 0
    if win_reps:  # the unfinished last slice still has a rate
        stats.windows.append(win_reps / max(budget.clock() - win_start, 1e-9))
    stats.seconds = budget.elapsed()
    return stats


def _burn(torch: Any, cfg: dict[str, Any], i: int, budget: Budget, out: Sink) -> None:
    """Repeat one GEMM for the burn time and compare every result with the first: a healthy
    GPU is bitwise deterministic for the same kernel and inputs; a marginal one is not.
    NVML is sampled meanwhile; the last window's throughput is compared with the first's
    (a GPU that heats up or power-brakes slows down as the burn goes on)."""
    n = cfg["burn_n"]
    seconds = min(cfg["burn_s"], max(budget.left() - GRACE_S, 0.0))
    with torch.cuda.device(i), Telemetry(i) as tel:
        stats = _burn_gemms(torch, i, n, Budget(seconds, budget.clock))
        torch.cuda.empty_cache()  # the burn's matrices are gone with _burn_gemms' frame
    _burn_rows(i, n, stats, tel, out)


def _burn_gemms(torch: Any, i: int, n: int, budget: Budget) -> BurnStats:
    g = torch.Generator(device=f"cuda:{i}").manual_seed(1234)
    a = torch.randn(n, n, device=i, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=i, dtype=torch.bfloat16, generator=g)
    ref = torch.mm(a, b)
    c = torch.empty_like(ref)

    def step() -> bool:
        torch.mm(a, b, out=c)
        return bool(torch.equal(c, ref))  # waits for the GEMM: the loop runs at GPU speed

    return burn_loop(step, budget)


def _burn_rows(i: int, n: int, stats: BurnStats, tel: Telemetry, out: Sink) -> None:
    dev, tflops = f"gpu{i}", [w * 2 * n**3 / 1e12 for w in stats.windows]
    out.add(
        "gpu_burn_mismatches",
        float(stats.mismatches),
        dev,
        detail=f"{stats.reps} x {n}^3 bf16 GEMMs in {stats.seconds:.1f} s, each compared bitwise with the first",
    )
    if len(tflops) >= 2 and tflops[0] > 0:
        detail = f"first window {tflops[0]:.1f} TFLOP/s, last {tflops[-1]:.1f} ({len(tflops)} windows)"
        out.add("gpu_burn_throughput_ratio", tflops[-1] / tflops[0], dev, detail=detail)
    else:
        out.add("gpu_burn_throughput_ratio", None, dev, f"not run: burn too short for two windows ({stats.reps} GEMMs)")
    if tel.samples:
        hw = tel.hw_slowdown()
        out.add("gpu_hw_slowdown", float(len(hw)), dev, detail=f"under load: {tel.summary()}")


class Telemetry:
    """NVML read from a thread every ``interval_s`` while a GPU is under load, and once at
    each end: SM clock, power, temperature and the active clock event reasons. Without
    NVML there are no samples (and no hardware-slowdown row)."""

    def __init__(self, index: int, interval_s: float = 0.5) -> None:
        self.index, self.interval_s = index, interval_s
        self.samples: list[dict[str, Any]] = []  # one dict per read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv: Any = None  # the pynvml module while NVML is up
        self._handle: Any = None  # NVML handle of the GPU

    def __enter__(self) -> Telemetry:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception:
            self._shutdown()
            return self
        self.sample()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        nv, h = self._nv, self._handle
        power = _nv(nv.nvmlDeviceGetPowerUsage, h)  # milliwatts
        self.samples.append(
            {
                "sm_mhz": _nv(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "power_w": power / 1000 if power is not None else None,
                "temp_c": _nv(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "reasons": _throttle_names(_nv(nv.nvmlDeviceGetCurrentClocksEventReasons, h) or 0),
            }
        )

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.sample()
        self._shutdown()

    def _shutdown(self) -> None:
        if self._nv is not None:
            _nv(self._nv.nvmlShutdown)
        self._nv = None

    def hw_slowdown(self) -> list[str]:
        """Hardware slowdown reasons seen in more than one sample (one is a transient)."""
        seen = [r for s in self.samples for r in s["reasons"] if r in HW_SLOWDOWN]
        return sorted({r for r in seen if seen.count(r) > 1})

    def summary(self) -> str:
        def span(key: str, unit: str) -> str:
            vals = [s[key] for s in self.samples if s[key] is not None]
            return f"{key.split('_')[0]} {min(vals):.0f}-{max(vals):.0f} {unit}" if vals else f"{key.split('_')[0]} n/a"

        reasons = sorted({r for s in self.samples for r in s["reasons"]})
        hw = self.hw_slowdown()
        return (
            f"{len(self.samples)} NVML samples, {span('sm_mhz', 'MHz')}, {span('power_w', 'W')}, "
            f"{span('temp_c', 'C')}; reasons seen: {', '.join(reasons) or 'none'}; "
            f"hardware slowdown in more than one sample: {', '.join(hw) or 'none'}"
        )


def _host_copies(torch: Any, cfg: dict[str, Any], i: int, gpu: dict[str, Any], budget: Budget, out: Sink) -> None:
    """Pinned host memory on the GPU's own NUMA node, both directions; the PCIe link is
    polled while copies run (an idle link drops to gen 1 to save power)."""
    n = cfg["h2d_mb"] << 20
    cpus = _read(f"/sys/devices/system/node/node{gpu.get('numa_node')}/cpulist")
    # torch's caching host allocator would hand back the previous GPU's pinned block, whose
    # pages sit on that GPU's NUMA node: drop the cached blocks so this one is new pages.
    _empty_host_cache(torch)
    old = os.sched_getaffinity(0)
    if gpu.get("numa_node") is not None and cpus:
        os.sched_setaffinity(0, _cpulist(cpus))  # first touch puts the pages on that node
    try:
        # Pinned pages are allocated and locked here, while this thread runs on the node.
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        host.fill_(1)
    finally:
        os.sched_setaffinity(0, old)
    with torch.cuda.device(i):
        dev = torch.empty(n, dtype=torch.uint8, device=i)
        with _LinkPoll(i) as link:  # NVML is up before the first copy is queued
            for _ in range(20):
                dev.copy_(host, non_blocking=True)
            # An event's wait releases the GIL (torch.cuda.synchronize may not), so the poll
            # thread keeps reading while the copies run.
            copied = torch.cuda.Event()
            copied.record()
            copied.synchronize()
        link.report(f"gpu{i}", out)
        h2d, h2d_reps = _timed(torch, i, lambda h=host, d=dev: d.copy_(h, non_blocking=True), 10, budget.part(0.5))
        d2h, d2h_reps = _timed(torch, i, lambda h=host, d=dev: h.copy_(d, non_blocking=True), 10, budget)
    del host, dev
    _empty_host_cache(torch)  # give the pinned pages back before the next GPU's turn
    where = (
        f"pinned on NUMA node {gpu.get('numa_node')}"
        if gpu.get("numa_node") is not None
        else "pinned (NUMA node unknown)"
    )
    out.add("gpu_h2d_gbs", n / h2d / 1e9, f"gpu{i}", detail=f"{where}, {reps_note(h2d_reps, 10, budget)}")
    out.add("gpu_d2h_gbs", n / d2h / 1e9, f"gpu{i}", detail=f"{where}, {reps_note(d2h_reps, 10, budget)}")


def _empty_host_cache(torch: Any) -> None:
    # Private, but the only way to release cached pinned blocks (torch 2.13 has it; guard).
    if hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()


class _LinkPoll:
    """The best PCIe generation and width NVML reports while the copies run.

    NVML starts before the copies (its init can outlast a short burst of copies), and a
    thread reads the link every few ms until the copies end, keeping the maximum: a link
    trains down when idle, so a single read at the wrong moment would look degraded.
    Without NVML nothing is reported; the judge then uses the inventory's max link values."""

    def __init__(self, index: int, interval_s: float = 0.005) -> None:
        self.index, self.interval_s = index, interval_s
        self.gen = self.width = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv: Any = None  # the pynvml module while NVML is up
        self._handle: Any = None  # NVML handle of the GPU

    def __enter__(self) -> _LinkPoll:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception:
            self._stop_nvml()
            return self
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while True:
            self._read()
            if self._stop.wait(self.interval_s):
                return

    def _read(self) -> None:
        gen = _nv(self._nv.nvmlDeviceGetCurrPcieLinkGeneration, self._handle)
        width = _nv(self._nv.nvmlDeviceGetCurrPcieLinkWidth, self._handle)
        self.gen, self.width = max(self.gen, gen or 0), max(self.width, width or 0)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._stop_nvml()

    def _stop_nvml(self) -> None:
        if self._nv is not None:
            _nv(self._nv.nvmlShutdown)
        self._nv = None

    def report(self, device: str, res: Results | Sink) -> None:
        if self.gen:
            res.add("gpu_pcie_gen", float(self.gen), device, detail="max polled during host copies")
        if self.width:
            res.add("gpu_pcie_width", float(self.width), device, detail="max polled during host copies")


# --- all-reduce ----------------------------------------------------------------------------


def allreduce_busbw(
    torch: Any, dist: Any, mb: int, device: Any, iters: int = 10, seconds: float | None = None
) -> dict[str, Any]:
    """nccl-tests' busbw: algbw x 2(n-1)/n, for one message size. With ``seconds``, fewer
    than ``iters`` iterations when the warm-up says they would not fit (every rank agrees
    on the smallest count: a collective needs the same number everywhere)."""
    world = dist.get_world_size()
    x = torch.ones((mb << 20) // 4, dtype=torch.float32, device=device)
    t0 = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(x)
    if x.is_cuda:
        torch.cuda.synchronize(device)
    if seconds is not None:
        fit = torch.tensor([max(1, min(iters, int(seconds / 2 / ((time.perf_counter() - t0) / 3))))], device=device)
        dist.all_reduce(fit, op=dist.ReduceOp.MIN)
        iters = int(fit.item())
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if x.is_cuda:
        torch.cuda.synchronize(device)
    took = (time.perf_counter() - t0) / iters
    algbw = (mb << 20) / took / 1e9
    return {
        "busbw_gbs": algbw * 2 * (world - 1) / world,
        "algbw_gbs": algbw,
        "world": world,
        "mb": mb,
        "iters": iters,
        "backend": dist.get_backend(),
    }


def _allreduce_rank(rank: int, world: int, port: int, mb: int, seconds: float, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        out = allreduce_busbw(torch, dist, mb, torch.device("cuda", rank), seconds=seconds)
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


RANK_STOP_S = 2.0  # a rank that ignores SIGTERM (stuck in a driver call) is killed after this


def bench_allreduce_local(
    torch: Any, cfg: dict[str, Any], budget: Budget, out: Sink, rank_main: Callable[..., None] | None = None
) -> None:
    """All-reduce between this node's GPUs (NCCL, one process per GPU). The ranks are
    processes: at the budget they are terminated (killed if they ignore it), so a hung
    NCCL costs only this phase. ``rank_main`` replaces the rank's code in tests."""
    count = torch.cuda.device_count()
    if count < 2:
        return out.add("gpu_allreduce_busbw_gbs", None, not_run="not run: one GPU")
    import torch.multiprocessing as mp

    queue = mp.get_context("spawn").SimpleQueue()
    args = (count, _free_port(), cfg["allreduce_mb"], budget.seconds / 2, queue)
    main = rank_main or _allreduce_rank
    ranks = mp.start_processes(main, args=args, nprocs=count, join=False, start_method="spawn")
    while not ranks.join(timeout=0.5):
        if budget.left() <= 0:
            _stop(ranks.processes)
            return out.add("gpu_allreduce_busbw_gbs", None, not_run=timed_out("allreduce", budget.seconds))
    res = queue.get()
    out.add(
        "gpu_allreduce_busbw_gbs",
        res["busbw_gbs"],
        detail=f"{count} GPUs, {res['mb']} MiB, {res['iters']} iterations, algbw {res['algbw_gbs']:.1f} GB/s, nccl",
    )


def _stop(processes: list[Any]) -> None:
    """Our own children, by their handles: SIGTERM, then SIGKILL for any still there after
    RANK_STOP_S, and each reaped."""
    for p in processes:
        p.terminate()
    deadline = time.monotonic() + RANK_STOP_S
    for p in processes:
        p.join(timeout=max(deadline - time.monotonic(), 0.0))
        if p.is_alive():
            p.kill()
            p.join(timeout=RANK_STOP_S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def allreduce_worker(mb: int, backend: str) -> int:
    """One rank under torchrun (env:// rendezvous); rank 0 prints one JSON line."""
    import torch
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend)
    try:
        out = allreduce_busbw(torch, dist, mb, device)
        if dist.get_rank() == 0:
            print(json.dumps({"allreduce": out}), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


# --- main --------------------------------------------------------------------------------


def _import_torch() -> tuple[Any, str]:
    try:
        import torch

        return torch, ""
    except ImportError:
        return None, NO_TORCH


def run(
    mode: str, only: set[str], data_dir: str, budgets: dict[str, float] | None = None, stream: Any = None
) -> dict[str, Any]:
    """Measure the node. With a ``stream``, write a JSON line there for the start, the
    inventory, the plan of phases, each phase's start and end, each row, and the end."""
    cfg, res = MODES[mode], Results(stream)
    budgets = {**BUDGETS_S[mode], **(budgets or {})}
    res.emit({"type": "start", "agent": SCHEMA, "mode": mode, "deadline_s": outer_deadline_s(mode, budgets)})
    torch, why = _import_torch()
    cpu, ram = cpu_inventory(), ram_inventory()
    try:
        gpus, smi_xml, no_gpu_why = gpu_inventory()
        absent = NO_GPU
    except Exception as e:  # NVML failed with GPUs there (or started, then failed): not "no GPU"
        gpus, smi_xml, no_gpu_why = [], "", f"NVML failed: {type(e).__name__}: {e}"
        absent = res.error("gpu inventory", e)
    counts: dict[str, Any] = {}
    gpu_groups: list[list[Phase]] = []
    if "gpu" in only or "allreduce" in only:
        counts, gpu_groups = _gpu_steps(torch, why, cfg, (gpus, smi_xml, absent), only, res, budgets)
    doc = {
        "agent": SCHEMA,
        "hostname": socket.gethostname(),
        "mode": mode,
        "python": sys.executable,
        "torch": getattr(torch, "__version__", None),
        "inventory": {
            "cpu": cpu,
            "ram": ram,
            "disk": disk_inventory(data_dir),
            "nics": nic_inventory(),
            "kernel": platform.release(),
            "gpu_note": no_gpu_why,
            "gpu_pci": nvidia_pci_devices(),  # judge: a host with NVIDIA GPUs must measure them
            "gpu_counts": counts,
        },
        "gpus": gpus,
        "nvidia_smi_xml": smi_xml,
    }
    res.emit({"type": "inventory", **doc})
    groups = _node_phases(torch, why, cfg, (cpu, ram, data_dir), only, budgets) + gpu_groups
    res.emit({"type": "plan", "phases": [p.plan() for g in groups for p in g]})
    for group in groups:
        run_phases(group, res)
    res.emit({"type": "end", "errors": res.errors})
    return {**doc, "results": res.rows, "errors": res.errors}


def _node_phases(
    torch: Any, why: str, cfg: dict[str, Any], node: tuple[Any, ...], only: set[str], budgets: dict[str, float]
) -> list[list[Phase]]:
    """cpu, ram and disk, one after the other; torch-less phases carry the reason."""
    cpu, ram, data_dir = node
    phases = [
        Phase("cpu", budgets["cpu"], CPU_METRICS, "", lambda b, o: bench_cpu(torch, cfg, cpu, b, o), why),
        Phase("ram", budgets["ram"], RAM_METRICS, "", lambda b, o: bench_ram(torch, cfg, cpu, ram, b, o), why),
        Phase("disk", budgets["disk"], DISK_METRICS, "", lambda b, o: bench_disk(cfg, data_dir, b, o)),
    ]
    return [[p] for p in phases if p.name in only]


def _gpu_steps(
    torch: Any,
    why: str,
    cfg: dict[str, Any],
    found: tuple[list[dict[str, Any]], str, str],
    only: set[str],
    res: Results,
    budgets: dict[str, float] | None = None,
) -> tuple[dict[str, Any], list[list[Phase]]]:
    """The GPU phases to run, after the rows of what cannot run (no GPU, no torch, a lost
    GPU). ``found``: NVML GPUs, nvidia-smi XML, the reason when neither found one.
    Returns how many GPUs NVML and CUDA see (the judge fails a node where they differ)."""
    budgets = budgets or BUDGETS_S["quick"]
    gpus, smi_xml, absent = found
    gpu_metrics = GPU_METRICS if "gpu" in only else ()
    ar = ("gpu_allreduce_busbw_gbs",) if "allreduce" in only else ()
    if not gpus and not smi_xml:
        res.skip(gpu_metrics + ar, absent)
        return {}, []
    for g in gpus:
        if g.get("error"):
            reason = f"not run: NVML cannot read gpu{g['index']}: {g['error']} (fallen off the bus? see dmesg for Xid)"
            res.skip(gpu_metrics, reason, f"gpu{g['index']}")
    if any(g.get("mig_mode") == "enabled" for g in gpus):
        _skip_mig(gpus, gpu_metrics, ar, res)
        return {}, []
    if torch is None:
        res.skip(gpu_metrics + ar, why)
        return {}, []
    if not torch.cuda.is_available():
        res.skip(gpu_metrics + ar, _no_cuda_reason(torch))
        return {}, []
    counts = {"nvml": len(gpus) or _smi_gpu_count(smi_xml), "cuda": torch.cuda.device_count()}
    groups = gpu_phases(torch, cfg, budgets, gpus) if gpu_metrics else []
    if ar:
        allreduce = Phase(
            "allreduce", budgets["allreduce"], ar, "", lambda b, o: bench_allreduce_local(torch, cfg, b, o)
        )
        groups.append([allreduce])
    return counts, groups


def _no_cuda_reason(torch: Any) -> str:
    """Why torch sees no CUDA device: a CPU-only build, or CUDA's own init error. Error 802
    (cudaErrorSystemNotReady) on NVSwitch systems means the fabric manager is not running."""
    if getattr(torch.version, "cuda", None) is None:
        return "not run: torch sees no CUDA device: CPU-only torch build (install a CUDA build of torch)"
    try:
        torch.cuda.init()
    except Exception as e:
        text = str(e).strip().splitlines()[-1][:300] if str(e).strip() else type(e).__name__
        if "802" in text or "system not yet initialized" in text:
            return (
                "not run: fabric manager is not running (CUDA error 802: system not yet initialized): "
                "start nvidia-fabricmanager, whose version must match the driver"
            )
        return f"not run: torch sees no CUDA device: CUDA init failed: {text}"
    return "not run: torch sees no CUDA device (the driver and torch's CUDA do not match?)"


MIG_NOT_RUN = "not run: MIG is enabled"  # judge.MIG_NOT_RUN: reported, never a silent pass


def _skip_mig(gpus: list[dict[str, Any]], gpu_metrics: tuple[str, ...], ar: tuple[str, ...], res: Results) -> None:
    """With MIG on, CUDA enumerates MIG devices instead of GPUs, and a slice measured against
    the whole GPU's datasheet would fail for no fault: say so on every GPU metric instead."""
    on = [g for g in gpus if g.get("mig_mode") == "enabled"]
    names = ", ".join(f"gpu{g['index']} ({len(g.get('mig_devices') or [])} MIG devices)" for g in on)
    for g in gpus:
        if g.get("error"):
            continue
        if g.get("mig_mode") == "enabled":
            sizes = "+".join(str(d.get("memory_mib")) for d in g.get("mig_devices") or []) or "none"
            why = (
                f"{MIG_NOT_RUN} on gpu{g['index']} (MIG devices of {sizes} MiB): a MIG slice is not benchmarked "
                f"against the whole GPU's datasheet; disable MIG (nvidia-smi -i {g['index']} -mig 0, then reset) "
                "to validate this GPU"
            )
        else:
            why = f"{MIG_NOT_RUN} on {names}: CUDA numbers MIG devices, not GPUs, so no GPU of this node is benchmarked"
        res.skip(gpu_metrics, why, f"gpu{g['index']}")
    res.skip(ar, f"{MIG_NOT_RUN} on {names}: the in-node all-reduce is not run")


def _smi_gpu_count(xml: str) -> int:
    m = re.search(r"<attached_gpus>\s*(\d+)", xml)
    return int(m.group(1)) if m else xml.count("<gpu id=")


def _budgets(text: str, mode: str) -> dict[str, float]:
    """--budget cpu=5,ram=5: seconds per phase, over the mode's defaults."""
    out: dict[str, float] = {}
    for part in filter(None, text.split(",")):
        name, _, seconds = part.partition("=")
        if name not in BUDGETS_S[mode]:
            raise SystemExit(f"--budget {part}: unknown phase; choose from {', '.join(BUDGETS_S[mode])}")
        out[name] = float(seconds)
    return out


def main(argv: list[str] | None = None) -> int:
    # NVML numbers GPUs by PCI bus; make CUDA agree so gpuN means the same GPU in both.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    # cuBLAS is only bitwise repeatable with a fixed workspace; the burn test relies on it.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", nargs="?", default="run", choices=["run", "allreduce-worker", "deadline"])
    p.add_argument("--mode", choices=sorted(MODES), default="quick")
    p.add_argument("--only", default="cpu,ram,disk,gpu,allreduce")
    p.add_argument("--data-dir", default="/data")
    p.add_argument("--budget", default="", help="seconds per phase over the mode's, e.g. cpu=5,ram=5,disk=10")
    p.add_argument("--mb", type=int, default=256, help="all-reduce message size")
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    args = p.parse_args(argv)
    if args.command == "allreduce-worker":
        return allreduce_worker(args.mb, args.backend)
    budgets = _budgets(args.budget, args.mode)
    if args.command == "deadline":  # for the shell: `timeout $(agent.py deadline) agent.py`
        print(outer_deadline_s(args.mode, {**BUDGETS_S[args.mode], **budgets}))
        return 0
    run(args.mode, set(args.only.split(",")), args.data_dir, budgets, sys.stdout)
    sys.stdout.flush()
    # A phase cut off at its deadline may still hold a thread (a CUDA call that never
    # returns): every row is out, so leave without waiting for it.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
