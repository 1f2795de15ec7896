"""`provision up` wall time / the same apt + pip work typed by hand over one SSH session,
each on its own fresh node (target <= 1.3): what pyinfra, facts and checks cost on top
of the package installs themselves.

Run: .venv/bin/python benchmarks/up_overhead.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from up_common import FreshTestbed, verdict

from provision import inventory, remote
from provision.deploys.frameworks import REMOTE_WHEELHOUSE
from provision.deploys.packages import BASE_PACKAGES


def by_hand(tb: FreshTestbed) -> float:
    node = inventory.load(tb.tb.inventory_path).nodes[0]
    conn = remote.connection(node)
    start = time.monotonic()
    conn.run(f"mkdir -p {REMOTE_WHEELHOUSE}", hide=True)
    for wheel in sorted(Path(str(node.settings.wheelhouse)).glob("*.whl")):
        conn.put(str(wheel), f"{REMOTE_WHEELHOUSE}/{wheel.name}")
    conn.run("apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
             + " ".join(BASE_PACKAGES), hide=True)
    conn.run(f"python3 -m venv /opt/provision/venv && /opt/provision/venv/bin/pip install -q --no-index "
             f"--find-links {REMOTE_WHEELHOUSE} torch==2.13.0 numpy nvidia-ml-py", hide=True)
    seconds = time.monotonic() - start
    conn.close()
    return seconds


def main() -> int:
    with FreshTestbed(nodes=1) as tb:
        manual = by_hand(tb)
    with FreshTestbed(nodes=1) as tb:
        tool, report = tb.up()
    if report.exit_code:
        print(f"up failed: {report.as_json()}")
        return 1
    return verdict("up / by hand", tool / manual, 1.3, f"by hand {manual:.0f}s, up {tool:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
