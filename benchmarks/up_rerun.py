"""Re-run time / first-run time of `provision up` on one fresh testbed node (target <= 0.10,
and the re-run must report 0 changed operations).

Run: .venv/bin/python benchmarks/up_rerun.py
"""

from __future__ import annotations

import sys

from up_common import FreshTestbed, verdict


def main() -> int:
    with FreshTestbed(nodes=1) as tb:
        first_s, first = tb.up()
        again_s, again = tb.up()
    if first.exit_code or again.exit_code:
        print(f"up failed: {first.as_json()} {again.as_json()}")
        return 1
    changed = sum(h.changed for h in again.hosts.values())
    if changed:
        print(f"re-run changed {changed} operations; expected 0")
        return 1
    return verdict(
        "up re-run / first run",
        again_s / first_s,
        0.10,
        f"first {first_s:.0f}s, re-run {again_s:.0f}s, re-run changed 0",
    )


if __name__ == "__main__":
    sys.exit(main())
