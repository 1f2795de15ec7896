"""What monitoring costs on the provisioned 2-VM testbed (TCG): the CPU share of the node
exporter, the node collector and Prometheus on each node over a window (CPU seconds /
wall seconds, and against the node's whole CPU time in the same window), and
Prometheus' disk use per node per day, extrapolated from the window.

    .venv/bin/python benchmarks/monitoring_overhead.py [--window-s 600]

Needs the e2e tier's provisioned snapshot for this tree (tests/e2e/snapshot.py): the VMs
boot from it, nothing is provisioned here, and they are taken down before the script
exits. The window is bounded by time, not work. Nothing else runs on the VMs: the figures
are the idle fleet's, i.e. what monitoring adds.

- Long-running services (exporter, Prometheus): systemd's CPUUsageNSec of the unit at the
  window's start and end.
- The node collector (a oneshot, every 60 s): each run's "Consumed ... CPU time" line in
  the journal within the window (systemd's per-run accounting).
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
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from provision import inventory
from provision.rules import monitoring
from provision.testbed import Testbed
from tests.e2e import snapshot
from tests.e2e.conftest import NODES, SHAPE, _wait_for_boot
from tests.e2e.prometheus_helpers import query
from tests.e2e.storage_helpers import sh

LONG_RUNNING = ("prometheus-node-exporter.service", "prometheus.service")
CONSUMED = re.compile(r"Consumed (?:(\d+)min )?(?:([\d.]+)s )?(?:(\d+)ms )?CPU time")


def _consumed_s(line: str) -> float:
    m = CONSUMED.search(line)
    if not m:
        return 0.0
    minutes, seconds, millis = m.groups()
    return 60 * float(minutes or 0) + float(seconds or 0) + float(millis or 0) / 1000


def _usage(node, units: tuple[str, ...]) -> dict[str, float]:
    """CPU seconds each unit has used so far (systemd's accounting), and the node's total."""
    out = sh(node, "systemctl show -p Id -p CPUUsageNSec " + " ".join(units) + "; head -n1 /proc/stat; getconf CLK_TCK")
    usage: dict[str, float] = {}
    unit = None
    lines = out.splitlines()
    for line in lines:
        if line.startswith("Id="):
            unit = line[3:]
        elif line.startswith("CPUUsageNSec=") and unit:
            value = line.split("=", 1)[1]
            usage[unit] = int(value) / 1e9 if value.isdigit() else 0.0
    cpu = next(line for line in lines if line.startswith("cpu "))
    ticks = int(lines[-1])
    # busy time: user nice system irq softirq steal (idle and iowait are not CPU spent)
    fields = [int(v) for v in cpu.split()[1:9]]
    usage["node_total"] = (sum(fields) - fields[3] - fields[4]) / ticks
    return usage


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
    ap.add_argument("--window-s", type=float, default=600, help="seconds measured")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="monitoring-overhead-") as tmp:
        root = Path(tmp)
        inv = root / "inventories" / "testbed.py"
        tb = Testbed(root / "state", inventory_path=inv)
        names = [f"node{i}" for i in range(1, NODES + 1)]
        if snapshot.restore(tb, snapshot.key(tb, SHAPE), inv, names) is None:
            raise SystemExit("no provisioned snapshot for this tree: run the e2e tier once (it saves one)")
        try:
            tb.up(nodes=NODES, disks=SHAPE["disks"])
            _wait_for_boot(tb, names)
            cluster = inventory.load(inv)
            head = monitoring.prometheus_node(cluster)
            assert head is not None
            time.sleep(60)  # a scrape or two after boot before the window opens
            since = sh(head, "date '+%Y-%m-%d %H:%M:%S'").strip()
            before = {n.name: _usage(n, LONG_RUNNING) for n in cluster.nodes}
            disk_before = _data_bytes(head)
            samples_before = float(query(head, "sum(prometheus_tsdb_head_samples_appended_total)")[0]["value"][1])
            started = time.monotonic()
            time.sleep(args.window_s)
            wall = time.monotonic() - started
            after = {n.name: _usage(n, LONG_RUNNING) for n in cluster.nodes}
            disk_after = _data_bytes(head)
            samples_after = float(query(head, "sum(prometheus_tsdb_head_samples_appended_total)")[0]["value"][1])
            rows = []
            for node in cluster.nodes:
                journal = sh(
                    node,
                    f"journalctl -u {monitoring.NODE_COLLECTOR_UNIT}.service --since '{since}' -o cat --no-pager "
                    "| grep 'Consumed' || true",
                )
                collector = sum(_consumed_s(line) for line in journal.splitlines())
                runs = len(journal.splitlines())
                used = {u: after[node.name][u] - before[node.name][u] for u in after[node.name]}
                row = {
                    "node": node.name,
                    "wall_s": round(wall, 1),
                    "exporter_cpu_s": round(used["prometheus-node-exporter.service"], 2),
                    "collector_cpu_s": round(collector, 2),
                    "collector_runs": runs,
                    "prometheus_cpu_s": round(used.get("prometheus.service", 0.0), 2),
                    "node_cpu_s": round(used["node_total"], 1),
                }
                monitored = row["exporter_cpu_s"] + row["collector_cpu_s"] + row["prometheus_cpu_s"]
                row["monitoring_share_of_wall"] = round(monitored / wall, 5)
                row["monitoring_share_of_node_cpu"] = round(monitored / max(row["node_cpu_s"], 1e-9), 4)
                rows.append(row)
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
            time.sleep(args.window_s)
            host_on = _qemu_cpu_s(pids) - host_on
            stop = " ".join(
                [f"{monitoring.NODE_COLLECTOR_UNIT}.timer", f"{monitoring.GPU_COLLECTOR_UNIT}.timer", *LONG_RUNNING]
            )
            for node in cluster.nodes:
                sh(node, f"systemctl stop {stop} 2>/dev/null || true")
            time.sleep(30)  # a collector run under way ends
            host_off = _qemu_cpu_s(pids)
            time.sleep(args.window_s)
            host_off = _qemu_cpu_s(pids) - host_off
            host = {
                "window_s": args.window_s,
                "host_cpu_s_monitoring_on": round(host_on, 1),
                "host_cpu_s_monitoring_off": round(host_off, 1),
                "host_cores_on": round(host_on / args.window_s, 3),
                "host_cores_off": round(host_off / args.window_s, 3),
                "on_over_off": round(host_on / max(host_off, 1e-9), 2),
            }
            print(json.dumps(host), flush=True)
        finally:
            tb.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
