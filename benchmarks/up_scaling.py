"""`provision up` wall time on 3 fresh nodes / on 1 fresh node (target <= 1.3): hosts are
provisioned in parallel, so more nodes should cost little more time.

Under TCG the 3 VMs share the build machine's 2 cores, so this figure measures the
tool's parallelism on top of a CPU-bound host; read it with that in mind.

Run: .venv/bin/python benchmarks/up_scaling.py
"""

from __future__ import annotations

import sys

from up_common import FreshTestbed, verdict


def main() -> int:
    times = {}
    for nodes in (1, 3):
        with FreshTestbed(nodes=nodes) as tb:
            seconds, report = tb.up()
        if report.exit_code:
            print(f"up on {nodes} nodes failed: {report.as_json()}")
            return 1
        times[nodes] = seconds
    return verdict("up 3 nodes / 1 node", times[3] / times[1], 1.3, f"1 node {times[1]:.0f}s, 3 nodes {times[3]:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
