"""The per-node seed disk: a 16 MiB ext4 filesystem (label and virtio serial PVSEED)
holding a tree that the image's provision-seed unit copies over / before networking
and sshd start: the node's own host key, root's authorized_keys, its networkd files
and /etc/hosts. Modes and ownership in the tree are the ones the guest gets."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from provision.errors import TestbedError
from provision.state import write_atomic
from provision.testbed.guest_files import SEED_LABEL


def write_tree(seed_dir: Path, host_key: Path, authorized_keys: str, networks: dict[str, str], hosts: str) -> None:
    """Lay out the seed's files in seed_dir/tree (replacing what was there)."""
    shutil.rmtree(seed_dir, ignore_errors=True)
    tree = seed_dir / "tree"
    for sub, mode in (
        ("etc", 0o755),
        ("etc/ssh", 0o755),
        ("etc/systemd", 0o755),
        ("etc/systemd/network", 0o755),
        ("root", 0o700),
        ("root/.ssh", 0o700),
    ):
        (tree / sub).mkdir(parents=True, exist_ok=True)
        (tree / sub).chmod(mode)
    _file(tree / "etc/ssh/ssh_host_ed25519_key", host_key.read_text(), 0o600)
    _file(tree / "etc/ssh/ssh_host_ed25519_key.pub", Path(f"{host_key}.pub").read_text(), 0o644)
    _file(tree / "root/.ssh/authorized_keys", authorized_keys.strip() + "\n", 0o600)
    for name, text in networks.items():
        _file(tree / "etc/systemd/network" / name, text, 0o644)
    _file(tree / "etc/hosts", hosts, 0o644)


def _file(path: Path, text: str, mode: int) -> None:
    write_atomic(path, text, mode)  # the host key is 0600 from its first byte


def make_image(seed_dir: Path, image: Path, size: str = "16M") -> Path:
    """mkfs.ext4 -d: the seed tree as a filesystem image, no loop device needed."""
    image.unlink(missing_ok=True)
    done = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-d", str(seed_dir), "-L", SEED_LABEL, str(image), size],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise TestbedError(f"mkfs.ext4 for seed disk {image} failed: {done.stderr.strip()}")
    return image
