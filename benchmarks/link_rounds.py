"""validate's link plan at fleet scale: rounds and pairs of quick mode (the ring) and of
full mode (every pair while affordable, else the ring plus --link-peers random partners a
node), and the controller time to plan them. Pure planning: no host is contacted.

A full-mode round costs one iperf3 run (10 s by default) plus SSH round trips, so the
rounds column is the wall time a fleet's link test needs, in units of one link test.

Usage: .venv/bin/python benchmarks/link_rounds.py [--peers 8] [--sizes 10,100,300,1000]
"""

from __future__ import annotations

import argparse
import time

from provision.validate import rounds


def row(n: int, peers: int) -> str:
    nodes = [f"node-{i:04d}" for i in range(n)]
    start = time.perf_counter()
    full, tested = rounds.full_rounds(nodes, peers)
    planned_ms = (time.perf_counter() - start) * 1000
    quick = rounds.ring_rounds(nodes)
    every = n - 1 if n % 2 == 0 else n
    pairs = sum(len(r) for r in full)
    return f"| {n} | {len(quick)} | {every} | {len(full)} | {pairs} | {planned_ms:.1f} | {tested} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=rounds.FULL_PEERS)
    parser.add_argument("--sizes", default="10,100,300,1000")
    args = parser.parse_args()
    print("| nodes | quick rounds | every-pair rounds | full rounds | full pairs | plan ms | full mode tests |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(s) for s in args.sizes.split(",")):
        print(row(n, args.peers))


if __name__ == "__main__":
    main()
