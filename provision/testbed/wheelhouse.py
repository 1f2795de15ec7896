"""The wheelhouse the testbed's frameworks step installs from: torch (the CPU build),
numpy, nvidia-ml-py and tensorboard (with its dependencies) at the settings' default pins,
as wheels for the guests' Python 3.11 (Debian 12).

The testbed installs from a wheelhouse, as an air-gapped cluster would, so a testbed VM
never asks an index for torch (an unpinned or CUDA torch is several GB). Downloaded once
into the user's cache, beside the testbed image, in a directory named for the pins: a
changed pin gets a new wheelhouse, never a stale one that `up` would refuse.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from provision.errors import TestbedError
from provision.settings import Settings
from provision.testbed import paths

GUEST_PYTHON = "3.11"  # Debian 12's python3
# Debian 12's glibc is 2.36. pip takes --platform literally (no older manylinux tags), and
# numpy 2.2.6 ships manylinux_2_17 wheels only, torch 2.13 manylinux_2_28 ones, and
# tensorboard-data-server 0.7.2 a manylinux_2_31 one.
PLATFORMS = ["manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64"]


def pins() -> dict[str, str]:
    """package -> version, the frameworks step's defaults (the testbed inventory sets none)."""
    defaults = Settings()
    return {
        "torch": defaults.torch_version,
        "numpy": defaults.numpy_version or "",
        "nvidia-ml-py": defaults.nvml_version or "",
        "tensorboard": defaults.tensorboard_version or "",
    }


def requirements() -> list[str]:
    """What the frameworks step pins by default. torch==X resolves to the CPU build (+cpu)
    where pip's configuration offers one; _complete refuses any other torch wheel, so a CUDA
    build is never installed."""
    from provision.rules.frameworks import requirements as pinned

    return pinned(Settings())


def directory() -> Path:
    tag = "-".join(f"{name}-{version or 'any'}" for name, version in pins().items())
    return paths.cache_root() / f"wheelhouse-{tag}-cp{GUEST_PYTHON.replace('.', '')}"


def ready(target: Path | None = None) -> bool:
    """Whether the wheelhouse is already complete (nothing to download)."""
    return _complete(target or directory())


def ensure(target: Path | None = None) -> Path:
    """The wheelhouse directory, downloading the wheels the first time."""
    from provision.rules.frameworks import SUMS_FILE, write_sums

    target = target or directory()
    if _complete(target):
        if not (target / SUMS_FILE).exists():  # a wheelhouse cached before the sums existed
            write_sums(target)
        return target
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            *requirements(),
            "-d",
            str(target),
            "--only-binary=:all:",
            "--python-version",
            GUEST_PYTHON,
            *(arg for platform in PLATFORMS for arg in ("--platform", platform)),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0 or not _complete(target):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise TestbedError(f"could not build the CPU torch wheelhouse in {target}: {' / '.join(tail)}")
    write_sums(target)
    return target


def _complete(target: Path) -> bool:
    from provision.rules.frameworks import wheelhouse_gaps

    names = [w.name for w in target.glob("*.whl")]
    torch = [n for n in names if n.startswith("torch-")]
    # The CPU build carries the +cpu local version; anything else would be a CUDA build.
    return bool(torch) and all("+cpu" in n for n in torch) and not wheelhouse_gaps(Settings(), names)
