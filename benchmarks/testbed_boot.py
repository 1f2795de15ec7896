"""Testbed figures: image build (cold, then cache hit) and boot-to-SSH for 1 and 3 nodes.

The headline figure is a ratio measured in one run: the time `Testbed.up` takes to bring
3 nodes to a real SSH login, over the time it takes for 1 node. Nodes boot in parallel,
so the target is <= 1.5 (three nodes must not cost three boots). The script prints every
figure and exits 1 when the target is missed.

    .venv/bin/python benchmarks/testbed_boot.py            # cold build into a temp cache too
    .venv/bin/python benchmarks/testbed_boot.py --no-cold  # reuse ~/.cache/provision/images

Every VM started here is taken down again (by pid) before the script exits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from provision.testbed import Testbed, apt_sources, image, paths

TARGET_RATIO = 1.5  # 3-node boot time / 1-node boot time


def image_times(cold: bool) -> dict[str, float]:
    """Seconds for a cold build (into a throwaway cache) and for a cache hit."""
    recipe = image.recipe_for(apt_sources.debian_mirror(apt_sources.read_system_sources()))
    figures: dict[str, float] = {}
    if cold:
        scratch = Path(tempfile.mkdtemp(prefix="pv-img-"))
        try:
            start = time.monotonic()
            image.ensure(recipe, scratch)
            figures["image_build_cold_s"] = time.monotonic() - start
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    start = time.monotonic()
    image.ensure(recipe, paths.images_dir())  # builds once if the shared cache is empty
    figures["image_ensure_shared_s"] = time.monotonic() - start
    start = time.monotonic()
    image.ensure(recipe, paths.images_dir())
    figures["image_cache_hit_s"] = time.monotonic() - start
    return figures


def boot_time(nodes: int, memory_mb: int, accel: str) -> float:
    """Seconds from `up` to every node answering an SSH login; always taken down again."""
    root = Path(tempfile.mkdtemp(prefix="pv-bench-"))
    tb = Testbed(root / "state", inventory_path=root / "testbed.py")
    try:
        start = time.monotonic()
        tb.up(nodes=nodes, disks=2, memory_mb=memory_mb, accel=accel)
        return time.monotonic() - start
    finally:
        tb.down()
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cold", action="store_true", help="skip the cold image build")
    parser.add_argument("--memory", type=int, default=1024, help="MiB per VM")
    parser.add_argument("--accel", default="auto", help="auto, kvm or tcg")
    args = parser.parse_args()

    figures = image_times(cold=not args.no_cold)
    # The build machines are shared: the host's load says how much the others weighed.
    figures["host_load_1m_before_1_node"] = os.getloadavg()[0]
    figures["boot_1_node_s"] = boot_time(1, args.memory, args.accel)
    figures["host_load_1m_before_3_nodes"] = os.getloadavg()[0]
    figures["boot_3_nodes_s"] = boot_time(3, args.memory, args.accel)
    ratio = figures["boot_3_nodes_s"] / figures["boot_1_node_s"]
    figures["ratio_3_over_1"] = ratio
    for name, value in figures.items():
        print(f"{name:28} {value:8.2f}")
    verdict = "met" if ratio <= TARGET_RATIO else "MISSED"
    print(f"3-node/1-node boot ratio {ratio:.2f} (target <= {TARGET_RATIO}): {verdict}")
    print(json.dumps({k: round(v, 2) for k, v in figures.items()}))
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
