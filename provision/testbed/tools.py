"""The host programs the testbed runs, checked before anything is started so a missing
one is one clear line with the package to install, not a traceback halfway through."""

from __future__ import annotations

import shutil

from provision.errors import TestbedError

# program -> Debian/Ubuntu package that provides it
PACKAGES: dict[str, str] = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "vde_switch": "vde2",
    "ssh-keygen": "openssh-client",
    "ssh": "openssh-client",
}

# what each part of the testbed needs
IMAGE_TOOLS = ("debootstrap", "mkfs.ext4")
RUN_TOOLS = ("qemu-system-x86_64", "qemu-img", "vde_switch", "ssh-keygen", "mkfs.ext4")


def require(*programs: str) -> dict[str, str]:
    """Return {program: path}; raise TestbedError naming every missing program."""
    found = {p: shutil.which(p) for p in programs}
    missing = [p for p, path in found.items() if path is None]
    if missing:
        hints = ", ".join(f"{p} not found: apt-get install {PACKAGES.get(p, p)}" for p in missing)
        raise TestbedError(hints)
    return {p: str(path) for p, path in found.items()}
