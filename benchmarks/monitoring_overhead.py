"""What monitoring costs on the provisioned 2-VM testbed (TCG): the CPU share of the node
exporter, the node collector and Prometheus on each node over a window (CPU seconds /
wall seconds, and against the node's whole CPU time in the same window), and
Prometheus' disk use per node per day, extrapolated from the window.

    .venv/bin/python benchmarks/monitoring_overhead.py [--window-s 600] [--host-window-s 120]

Needs the e2e tier's provisioned snapshot for this tree (tests/e2e/snapshot.py): the VMs
boot from it, nothing is provisioned here, and they are taken down before the script
exits. The window is bounded by time, not work. Nothing else runs on the VMs: the figures
are the idle fleet's, i.e. what monitoring adds.

- Long-running services (exporter, Prometheus): systemd's CPUUsageNSec of the unit at the
  window's start and end.
- The node collector (a oneshot, every 60 s) and, beside it, the Slurm health check
  (slurmd's, every 60 s): the median CPU time of three runs of each by hand as a
  transient unit (systemd's per-cgroup accounting), after the window; the collector's
  share of the window is that times the runs a window holds.
- The host: each VM's qemu CPU time (utime + stime, /proc/PID/stat) over the window, then
  over a second window of the same length with the monitoring units stopped on every node:
  the ratio is what monitoring costs the machine that runs the testbed (TCG), measured
  against a reference in the same run.
- Disk: the growth of Prometheus' data directory (WAL and blocks) over the window, per
  node scraped, times 86400 / window. A 10-minute window sees the WAL only; blocks
  compacted from it are smaller (Prometheus' documentation: 1-2 bytes a sample), so this
  is an upper bound, printed with the samples a node adds a day.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import snapshot_testbed

from provision import inventory
from provision.rules import monitoring
from provision.rules import slurm as slurm_rules
from tests.e2e.prometheus_helpers import query
from tests.e2e.storage_helpers import sh

LONG_RUNNING = ("prometheus-node-exporter.service", "prometheus.service")


def _usage(node, units: tuple[str, ...]) -> dict[str, float]:
    """CPU seconds each unit has used so far (systemd's accounting, one unit at a time: a
    unit that is not there reads 0), and the node's busy CPU seconds."""
    asks = "; ".join(f"systemctl show -p CPUUsageNSec --value {u}" for u in units)
    lines = sh(node, f"{asks}; head -n1 /proc/stat; getconf CLK_TCK").splitlines()
    usage = {u: int(v) / 1e9 if v.isdigit() else 0.0 for u, v in zip(units, lines, strict=False)}
    cpu = next(line for line in lines if line.startswith("cpu "))
    ticks = int(lines[-1])
    # busy time: user nice system irq softirq steal (idle and iowait are not CPU spent)
    fields = [int(v) for v in cpu.split()[1:9]]
    usage["node_total"] = (sum(fields) - fields[3] - fields[4]) / ticks
    return usage


CONSUMED = re.compile(r"CPU time consumed: ([\d.]+)(ms|s|min)")


def _per_run_cpu_s(node, program: str, runs: int = 3) -> float:
    """The median CPU time of ``runs`` runs of ``program`` as a transient unit (systemd
    counts every process of its cgroup, detached probes included)."""
    seen = []
    for _ in range(runs):
        out = sh(node, f"systemd-run --wait -p CPUAccounting=yes {program} 2>&1 || true")
        m = CONSUMED.search(out)
        if m:
            seen.append(float(m[1]) * {"ms": 1e-3, "s": 1.0, "min": 60.0}[m[2]])
    return sorted(seen)[len(seen) // 2] if seen else float("nan")


def _qemu_cpu_s(pids: list[int]) -> float:
    """CPU seconds the VMs' qemu processes have used so far, on this host."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def _data_bytes(head) -> int:
    return int(sh(head, f"du -sb {monitoring.STORAGE} | cut -f1").strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window-s", type=float, default=600, help="seconds measured inside the VMs")
    ap.add_argument("--host-window-s", type=float, default=120, help="seconds of each host window (on, then off)")
    args = ap.parse_args()
    with snapshot_testbed.booted("monitoring-overhead-") as (tb, inv, _root):
        cluster = inventory.load(inv)
        head = monitoring.prometheus_node(cluster)
        assert head is not None
        time.sleep(60)  # a scrape or two after boot before the window opens
        before = {n.name: _usage(n, LONG_RUNNING) for n in cluster.nodes}
        disk_before = _data_bytes(head)
        samples_before = float(query(head, "sum(prometheus_tsdb_head_samples_appended_total)")[0]["value"][1])
        started = time.monotonic()
        time.sleep(args.window_s)
        wall = time.monotonic() - started
        after = {n.name: _usage(n, LONG_RUNNING) for n in cluster.nodes}
        disk_after = _data_bytes(head)
        samples_after = float(query(head, "sum(prometheus_tsdb_head_samples_appended_total)")[0]["value"][1])
        for node in cluster.nodes:
            used = {u: after[node.name][u] - before[node.name][u] for u in after[node.name]}
            collector = _per_run_cpu_s(node, monitoring.NODE_COLLECTOR)
            health = _per_run_cpu_s(node, slurm_rules.HEALTH_PROGRAM)
            row = {
                "node": node.name,
                "wall_s": round(wall, 1),
                "exporter_cpu_s": round(used["prometheus-node-exporter.service"], 2),
                "prometheus_cpu_s": round(used["prometheus.service"], 2),
                "collector_cpu_s_per_run": round(collector, 3),
                "collector_cpu_s_in_window": round(collector * wall / monitoring.NODE_COLLECTOR_EVERY_S, 2),
                "slurm_health_cpu_s_per_run": round(health, 3),
                "node_busy_cpu_s": round(used["node_total"], 1),
            }
            monitored = row["exporter_cpu_s"] + row["collector_cpu_s_in_window"] + row["prometheus_cpu_s"]
            row["monitoring_share_of_wall"] = round(monitored / wall, 5)
            row["monitoring_share_of_node_busy_cpu"] = round(monitored / max(row["node_busy_cpu_s"], 1e-9), 4)
            print(json.dumps(row), flush=True)
        per_day = 86400 / wall / len(cluster.nodes)
        disk = {
            "nodes_scraped": len(cluster.nodes),
            "data_dir_growth_bytes": disk_after - disk_before,
            "bytes_per_node_per_day_upper_bound": round((disk_after - disk_before) * per_day),
            "samples_per_node_per_day": round((samples_after - samples_before) * per_day),
        }
        print(json.dumps(disk), flush=True)
        # The host's reference: the same VMs, the same length of window, monitoring stopped.
        pids = [n.pid for n in tb.status() if n.pid]
        host_on = _qemu_cpu_s(pids)
        time.sleep(args.host_window_s)
        host_on = _qemu_cpu_s(pids) - host_on
        stop = " ".join(
            [f"{monitoring.NODE_COLLECTOR_UNIT}.timer", f"{monitoring.GPU_COLLECTOR_UNIT}.timer", *LONG_RUNNING]
        )
        for node in cluster.nodes:
            sh(node, f"systemctl stop {stop} 2>/dev/null || true")
        time.sleep(30)  # a collector run under way ends
        host_off = _qemu_cpu_s(pids)
        time.sleep(args.host_window_s)
        host_off = _qemu_cpu_s(pids) - host_off
        host = {
            "window_s": args.host_window_s,
            "host_cpu_s_monitoring_on": round(host_on, 1),
            "host_cpu_s_monitoring_off": round(host_off, 1),
            "host_cores_on": round(host_on / args.host_window_s, 3),
            "host_cores_off": round(host_off / args.host_window_s, 3),
            "on_over_off": round(host_on / max(host_off, 1e-9), 2),
        }
        print(json.dumps(host), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
