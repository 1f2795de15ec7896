"""The shipped example inventory, copied with a pip lock, for tests that run `up` on it up
to the point where hosts would be contacted. The example sets no pip_lock_file (a lock is
made from a cluster's own index), and `up` refuses an index install without one."""

from __future__ import annotations

import shutil
from pathlib import Path

from provision.resources import inventories_dir
from provision.rules import frameworks as framework_rules
from provision.settings import Settings

STAND_IN_HASH = "sha256:" + "0" * 64  # no file is downloaded: only the lock's form is checked


def locked_example(directory: Path) -> Path:
    """inventories/example.py and its group data under directory, with a lock of the
    example's pins (stand-in hashes); returns the inventory's path."""
    (directory / "group_data").mkdir(parents=True, exist_ok=True)
    inventory = directory / "example.py"
    shutil.copy(inventories_dir() / "example.py", inventory)
    group_data = directory / "group_data" / "example.py"
    shutil.copy(inventories_dir() / "group_data" / "example.py", group_data)
    lock = directory / "pip-lock.txt"
    lock.write_text("".join(f"{r} --hash={STAND_IN_HASH}\n" for r in framework_rules.requirements(Settings())))
    with group_data.open("a") as f:
        f.write(f"\npip_lock_file = {str(lock)!r}\n")
    return inventory
