"""Where the testbed keeps things: the image cache (kept across `down`) and the state
dir of one running testbed (removed by `down`). Both follow XDG_CACHE_HOME."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """~/.cache/provision, or $XDG_CACHE_HOME/provision."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "provision"


def images_dir() -> Path:
    """Built base images, one folder per recipe hash; shared by every testbed."""
    return cache_root() / "images"


def default_state_dir() -> Path:
    """The state dir `provision testbed` uses when none is given."""
    return cache_root() / "testbed"
