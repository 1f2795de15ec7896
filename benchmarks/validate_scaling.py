"""Wall time of `provision validate --quick` on 1 and on 3 hosts, same run.

Targets: one node <= 60 s; three nodes <= 1.2 x one node. Hosts are network namespaces
with their own sshd (tests/helpers/netns.py; needs root). They share this machine's CPUs
and disk, so three "nodes" here compete for the same cores -- unlike real servers.

    sudo .venv/bin/python benchmarks/validate_scaling.py [--only cpu,ram,disk]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.helpers import netns  # noqa: E402

PROVISION = ROOT / ".venv" / "bin" / "provision"
ONE_NODE_S, SCALING = 60.0, 1.2


def timed_validate(n: int, tmp: Path, only: str) -> tuple[float, int]:
    data = tmp / f"data{n}"
    data.mkdir()
    cluster = netns.start(n, tmp / f"c{n}", {"venv_path": str(ROOT / ".venv"), "data_mount": str(data)})
    try:
        env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state")}
        t0 = time.monotonic()
        p = subprocess.run(
            [
                str(PROVISION),
                "validate",
                str(cluster.inventory),
                "--quick",
                "--only",
                only,
                "--json",
                str(tmp / f"r{n}.json"),
            ],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        return time.monotonic() - t0, p.returncode
    finally:
        cluster.stop()


def main() -> int:
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument(
        "--only",
        default="cpu,ram,disk,net,gpu,allreduce",
        help="groups; cpu,ram,disk compares equal work (no link rounds on one node)",
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        one, rc1 = timed_validate(1, tmp, args.only)
        three, rc3 = timed_validate(3, tmp, args.only)
    ratio = three / one
    ok = one <= ONE_NODE_S and ratio <= SCALING
    print(f"quick validate --only {args.only}: 1 node {one:.1f} s (exit {rc1}), 3 nodes {three:.1f} s (exit {rc3})")
    print(
        f"one node <= {ONE_NODE_S:.0f} s: {'OK' if one <= ONE_NODE_S else 'MISSED'}; "
        f"3 nodes / 1 node = {ratio:.2f} (target <= {SCALING}) {'OK' if ratio <= SCALING else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
