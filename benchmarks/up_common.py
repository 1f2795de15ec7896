"""Shared by the benchmarks/up_*.py scripts: a fresh testbed per measurement, the CPU
torch wheelhouse, and a timed `provision up` (in-process, as the CLI runs it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provision import inventory, pipeline
from provision.runner import RunReport
from provision.testbed import Testbed

WHEELHOUSE = Path.home() / ".cache" / "provision" / "wheelhouse-torch-2.13.0-cp311"
# The steps `up` runs on the testbed for these figures (storage has its own benchmarks).
STEPS = "base,nvidia,frameworks"


def wheelhouse() -> Path:
    if not list(WHEELHOUSE.glob("torch-2.13.0+cpu*.whl")):
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "torch==2.13.0", "numpy", "nvidia-ml-py",
                        "-d", str(WHEELHOUSE), "--only-binary=:all:", "--python-version", "3.11",
                        "--platform", "manylinux_2_28_x86_64"], check=True, timeout=900)
    return WHEELHOUSE


class FreshTestbed:
    """A new testbed (fresh overlays of the cached image) with the wheelhouse setting."""

    def __init__(self, nodes: int):
        self.root = Path(tempfile.mkdtemp(prefix="bench-up-"))
        self.tb = Testbed(self.root / "state", inventory_path=self.root / "inventory.py")
        self.nodes = nodes

    def __enter__(self) -> FreshTestbed:
        self.tb.up(nodes=self.nodes, disks=1, memory_mb=1536)
        (self.root / "group_data").mkdir()
        (self.root / "group_data" / "all.py").write_text(
            f"wheelhouse = {str(wheelhouse())!r}\nmin_root_free_gb = 1\n")
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
