"""How much CPU one node's `provision up` takes, and what that means for 3 nodes / 1 node.

`up_scaling.py` asks for 3 nodes / 1 node <= 1.3. On a host with N cores, 3 emulated nodes
need about 3x the CPU seconds of one, so their wall time cannot drop below
3 x (CPU seconds of one node's run) / N, whatever the tool does. This script measures, on
one fresh node, the CPU seconds of the VM's qemu process and of this controller process
(pyinfra, paramiko) against the run's wall time, and prints:

  cores busy  = (qemu CPU s + controller CPU s) / wall s   (average cores one run keeps busy)
  3/1 floor   = max(1, 3 x cores busy / N)                  for this host's N, and for N = 6

A floor above 1.3 means the 3/1 target cannot be met on this host by any tool.

Run: .venv/bin/python benchmarks/up_cpu_share.py
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from up_common import FreshTestbed


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (and of its reaped children), from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command: state is fields[0], so utime, stime, cutime, cstime are 11..14.
    ticks = sum(int(v) for v in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def controller_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> int:
    with FreshTestbed(nodes=1) as tb:
        (record,) = tb.records
        if record.pid is None:
            print("the node's qemu pid is not known")
            return 1
        vm_before, me_before = process_cpu_s(record.pid), controller_cpu_s()
        start = time.monotonic()
        _, report = tb.up()
        wall = time.monotonic() - start
        vm_cpu, me_cpu = process_cpu_s(record.pid) - vm_before, controller_cpu_s() - me_before
    if report.exit_code:
        print(f"up failed: {report.as_json()}")
        return 1
    cores = os.cpu_count() or 1
    busy = (vm_cpu + me_cpu) / wall
    print(
        f"one node's up: wall {wall:.0f} s, qemu {vm_cpu:.0f} CPU s, controller {me_cpu:.0f} CPU s, "
        f"cores busy {busy:.2f}"
    )
    for n in (cores, 6):
        print(f"3 nodes / 1 node floor from CPU alone on {n} cores: {max(1.0, 3 * busy / n):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
