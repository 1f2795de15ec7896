"""Shared by the benchmarks/up_*.py scripts: a fresh testbed per measurement, the CPU
torch wheelhouse, and a timed `provision up` (in-process, as the CLI runs it)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from provision import inventory
from provision.engine import RunReport
from provision.testbed import Testbed
from provision.up import pipeline

# The steps `up` runs on the testbed for these figures (storage has its own benchmarks).
STEPS = "base,nvidia,frameworks"


class FreshTestbed:
    """A new testbed (fresh overlays of the cached image); its inventory names the CPU wheelhouse."""

    def __init__(self, nodes: int):
        self.root = Path(tempfile.mkdtemp(prefix="bench-up-"))
        self.tb = Testbed(self.root / "state", inventory_path=self.root / "inventory.py")
        self.nodes = nodes

    def __enter__(self) -> FreshTestbed:
        # Its inventory names the wheelhouse; the records carry each VM's qemu pid.
        self.records = self.tb.up(nodes=self.nodes, disks=1, memory_mb=1536)
        return self

    def __exit__(self, *exc: object) -> None:
        self.tb.down()
        shutil.rmtree(self.root, ignore_errors=True)

    def up(self, steps: str = STEPS) -> tuple[float, RunReport]:
        cluster = inventory.load(self.tb.inventory_path)
        start = time.monotonic()
        report = pipeline.up(cluster, pipeline.select(only=steps))
        return time.monotonic() - start, report


def verdict(name: str, ratio: float, target: float, detail: str) -> int:
    ok = ratio <= target
    print(f"{name}: {ratio:.3f} (target <= {target}) {'OK' if ok else 'MISSED'}; {detail}")
    return 0 if ok else 1
