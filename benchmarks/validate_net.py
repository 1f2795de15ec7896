"""Link throughput as validate measures it (over SSH, iperf3 -J, 4 streams) against the
same iperf3 run by hand, between two network-namespace hosts, same run.
Target: within +-10%. Runs alternate validate/hand and each keeps its best. Needs root.

    sudo .venv/bin/python benchmarks/validate_net.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from provision import inventory  # noqa: E402
from provision.validate import netrun  # noqa: E402
from tests.helpers import netns  # noqa: E402

SECONDS, TOLERANCE = 3, 0.10


def by_hand(cluster: netns.NetnsCluster, port: int) -> float:
    a, b = cluster.hosts
    server = subprocess.Popen(
        ["ip", "netns", "exec", b.netns, "iperf3", "-s", "-1", "-B", b.address, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                a.netns,
                "iperf3",
                "-c",
                b.address,
                "-B",
                a.address,
                "-p",
                str(port),
                "-P",
                "4",
                "-t",
                str(SECONDS),
                "-J",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9
    finally:
        server.wait(timeout=30)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as t:
        cluster = netns.start(2, Path(t) / "c")
        try:
            a, b = inventory.load(cluster.inventory).nodes
            ours, hand = [], []
            for k in range(args.rounds):
                ours.append(netrun.measure_pair(a, b, 5401 + 2 * k, SECONDS, k).gbits or 0.0)
                hand.append(by_hand(cluster, 5402 + 2 * k))
        finally:
            cluster.stop()
    ratio = max(ours) / max(hand)
    ok = abs(ratio - 1) <= TOLERANCE
    print(
        f"validate link test: {', '.join(f'{g:.1f}' for g in ours)} Gbit/s; "
        f"hand-run iperf3: {', '.join(f'{g:.1f}' for g in hand)} Gbit/s"
    )
    print(f"NIC validate/hand = {ratio:.3f} (target within +-{TOLERANCE:.0%}) {'OK' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
