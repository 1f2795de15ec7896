"""The per-node seed disk: a 16 MiB ext4 filesystem (label PVSEED) with the node's own
host key, root's authorized_keys, its static network and /etc/hosts. The image's
provision-seed unit copies them into place before networking and sshd start."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from provision.errors import TestbedError
from provision.testbed.guest_files import SEED_LABEL


def write_tree(seed_dir: Path, host_key: Path, authorized_keys: str, interfaces: str,
               hosts: str) -> None:
    """Lay out the seed's files in seed_dir (replacing what was there)."""
    shutil.rmtree(seed_dir, ignore_errors=True)
    for sub in ("ssh", "root", "network"):
        (seed_dir / sub).mkdir(parents=True)
    shutil.copyfile(host_key, seed_dir / "ssh/ssh_host_ed25519_key")
    (seed_dir / "ssh/ssh_host_ed25519_key").chmod(0o600)
    shutil.copyfile(f"{host_key}.pub", seed_dir / "ssh/ssh_host_ed25519_key.pub")
    (seed_dir / "root/authorized_keys").write_text(authorized_keys.strip() + "\n")
    (seed_dir / "network/interfaces").write_text(interfaces)
    (seed_dir / "hosts").write_text(hosts)


def make_image(seed_dir: Path, image: Path, size: str = "16M") -> Path:
    """mkfs.ext4 -d: the seed tree as a filesystem image, no loop device needed."""
    image.unlink(missing_ok=True)
    done = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-d", str(seed_dir), "-L", SEED_LABEL, str(image), size],
        capture_output=True, text=True, timeout=60,
    )
    if done.returncode != 0:
        raise TestbedError(f"mkfs.ext4 for seed disk {image} failed: {done.stderr.strip()}")
    return image
