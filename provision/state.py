"""The controller's local state: one rule for where it lives, and how its files are made.

Where, the one rule: ``$PROVISION_STATE_DIR`` when set, else ``$XDG_STATE_HOME/provision``,
else ``~/.local/state/provision``. Inside it:

- ``<inventory stem>-<hash of its path>/`` (mode 0700): what the controller generates for one
  inventory, never shared between two: the training user's key pair, the restic password,
  the backup SFTP key pair;
- ``validate/<host>.jsonl``: validate's history, one line per run and host.

The testbed keeps its own state under its --state-dir (provision.testbed.paths).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
from pathlib import Path


def state_dir() -> Path:
    """The controller's state directory (not created)."""
    if os.environ.get("PROVISION_STATE_DIR"):
        return Path(os.environ["PROVISION_STATE_DIR"])
    xdg = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(xdg) / "provision"


def inventory_dir(inventory: Path) -> Path:
    """This inventory's directory for generated secrets (created, mode 0700): keyed by the
    inventory file's resolved path, so two clusters never share a key or password."""
    digest = hashlib.sha256(str(Path(inventory).resolve()).encode()).hexdigest()[:10]
    path = state_dir() / f"{Path(inventory).stem}-{digest}"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def generated_key(path: Path, comment: str) -> Path:
    """An ed25519 key pair at ``path`` (and .pub), generated once; ssh-keygen writes the
    private key with mode 0600."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            check=True,
            capture_output=True,
            timeout=30,
        )
    return path


def generated_secret(path: Path) -> Path:
    """A random secret at ``path``, generated once, mode 0600 from its first byte."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path
