"""All three `provision up` figures from four fresh testbeds, sharing runs where the
separate scripts would repeat them:

- scaling: up on 3 fresh nodes / up on 1 fresh node (target <= 1.3);
- re-run: a second up on that same 1 node / its first up (target <= 0.10, 0 changes);
- overhead: that first up / the same apt + pip work typed by hand on another fresh node
  (target <= 1.3).

Each ratio compares two runs of this one invocation, so machine-wide noise hits both sides.
Run: .venv/bin/python benchmarks/up_all.py
"""

from __future__ import annotations

import sys

from up_common import FreshTestbed, verdict
from up_overhead import by_hand


def main() -> int:
    with FreshTestbed(nodes=1) as tb:
        manual = by_hand(tb)
    print(f"by hand on 1 node: {manual:.0f}s", flush=True)
    with FreshTestbed(nodes=1) as tb:
        one_s, one = tb.up()
        print(f"up on 1 node: {one_s:.0f}s (exit {one.exit_code})", flush=True)
        again_s, again = tb.up()
        print(f"re-run on 1 node: {again_s:.0f}s (exit {again.exit_code})", flush=True)
    with FreshTestbed(nodes=3) as tb:
        three_s, three = tb.up()
        print(f"up on 3 nodes: {three_s:.0f}s (exit {three.exit_code})", flush=True)
    runs = (("1 node", one), ("re-run", again), ("3 nodes", three))
    failed = [(name, r.as_json()) for name, r in runs if r.exit_code]
    if failed:
        print(f"up failed: {failed}")
        return 1
    changed = sum(h.changed for h in again.hosts.values())
    rc = verdict("up 3 nodes / 1 node", three_s / one_s, 1.3, f"1 node {one_s:.0f}s, 3 nodes {three_s:.0f}s")
    rc |= verdict(
        "up re-run / first run",
        again_s / one_s,
        0.10,
        f"first {one_s:.0f}s, re-run {again_s:.0f}s, re-run changed {changed}",
    )
    rc |= verdict("up / by hand", one_s / manual, 1.3, f"by hand {manual:.0f}s, up {one_s:.0f}s")
    return rc | (1 if changed else 0)


if __name__ == "__main__":
    sys.exit(main())
