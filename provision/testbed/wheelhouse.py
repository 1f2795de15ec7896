"""The wheelhouse the testbed's frameworks step installs from: torch==2.13.0 (the CPU
build), numpy and nvidia-ml-py as wheels for the guests' Python 3.11 (Debian 12).

The testbed installs from a wheelhouse, as an air-gapped cluster would, so a testbed VM
never asks an index for torch (an unpinned or CUDA torch is several GB). Downloaded once
into the user's cache, beside the testbed image.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from provision.errors import TestbedError
from provision.testbed import paths

TORCH = "torch==2.13.0"  # the CPU wheel; never a CUDA build
GUEST_PYTHON = "3.11"  # Debian 12's python3
PLATFORM = "manylinux_2_28_x86_64"


def directory() -> Path:
    return paths.cache_root() / "wheelhouse-torch-2.13.0-cp311"


def ready(target: Path | None = None) -> bool:
    """Whether the wheelhouse is already complete (nothing to download)."""
    return _complete(target or directory())


def ensure(target: Path | None = None) -> Path:
    """The wheelhouse directory, downloading the wheels the first time."""
    target = target or directory()
    if _complete(target):
        return target
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", TORCH, "numpy", "nvidia-ml-py", "-d", str(target),
         "--only-binary=:all:", "--python-version", GUEST_PYTHON, "--platform", PLATFORM],
        capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not _complete(target):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise TestbedError(f"could not build the CPU torch wheelhouse in {target}: {' / '.join(tail)}")
    return target


def _complete(target: Path) -> bool:
    torch = list(target.glob("torch-2.13.0*.whl"))
    # The CPU build carries the +cpu local version; anything else would be a CUDA build.
    return bool(torch) and "+cpu" in torch[0].name and bool(list(target.glob("numpy-*.whl")))
