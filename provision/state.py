"""The controller's local state: one rule for where it lives, and how its files are made.

Where, the one rule: ``$PROVISION_STATE_DIR`` when set, else ``$XDG_STATE_HOME/provision``,
else ``~/.local/state/provision``. Inside it:

- ``<inventory stem>-<hash of its path>/`` (mode 0700): what the controller generates for one
  inventory, never shared between two: the training user's key pair, the restic password,
  the backup SFTP key pair;
- ``validate/<host>.jsonl``: validate's history, one line per run and host;
- ``<inventory dir>/up.lock``: held (flock) by the one `provision up` running on that
  inventory, with its pid and start time inside for the message the next one prints.

How its files are made, the other rule: whole or not at all (``write_atomic``: a temp
file in the same directory, fsync, rename), and a secret with mode 0600 from its first
byte, never chmod-ed after.

The testbed keeps its own state under its --state-dir (provision.testbed.paths).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import secrets
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from provision.errors import EXIT_BAD_INPUT, ProvisionError

SECRET_MODE = 0o600  # keys and passwords: the owner alone, from the first byte


class StateDirUnusable(ProvisionError):
    """The state directory is a file (a mistyped PROVISION_STATE_DIR): exit 2, bad input."""

    exit_code = EXIT_BAD_INPUT


def state_dir() -> Path:
    """The controller's state directory (not created). StateDirUnusable when the path is
    something other than a directory: said at once, not after a run whose results it keeps."""
    if os.environ.get("PROVISION_STATE_DIR"):
        path = Path(os.environ["PROVISION_STATE_DIR"])
    else:
        path = Path(os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")) / "provision"
    if path.exists() and not path.is_dir():
        raise StateDirUnusable(f"the state directory {path} is not a directory (PROVISION_STATE_DIR, XDG_STATE_HOME)")
    return path


def inventory_dir(inventory: Path) -> Path:
    """This inventory's directory for generated secrets (created, mode 0700): keyed by the
    inventory file's resolved path, so two clusters never share a key or password."""
    digest = hashlib.sha256(str(Path(inventory).resolve()).encode()).hexdigest()[:10]
    path = state_dir() / f"{Path(inventory).stem}-{digest}"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


# One generation at a time in this process. The hosts of a step are prepared side by side
# (gevent greenlets: ssh-keygen's wait lets the next host run): without it, every host that
# found no key made its own, the last rename won, and the first `up` of a fleet gave hosts
# different training keys (found on 24 simulated hosts, tests/integration/test_fleet_converged.py).
# Made at first use, not at import: by then pyinfra's CLI has patched threading with gevent,
# and a lock from before the patch would block the whole process instead of one greenlet.


@functools.cache
def _generating() -> threading.Lock:
    return threading.Lock()


def generated_key(path: Path, comment: str) -> Path:
    """An ed25519 key pair at ``path`` (and .pub), generated once. ssh-keygen writes into
    a private temp dir beside it and both files are renamed into place, public key first:
    a run killed mid-way leaves no private key without its public half."""
    with _generating():
        return _generated_key(path, comment)


def _generated_key(path: Path, comment: str) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
            made = Path(tmp) / path.name
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(made)],
                check=True,
                capture_output=True,
                timeout=30,
            )
            os.replace(made.with_name(made.name + ".pub"), path.with_name(path.name + ".pub"))
            os.replace(made, path)
        _fsync_dir(path.parent)
    return path


def generated_secret(path: Path) -> Path:
    """A random secret at ``path``, generated once, mode 0600 from its first byte."""
    with _generating():
        if not path.exists():
            write_atomic(path, secrets.token_urlsafe(32) + "\n", mode=SECRET_MODE)
    return path


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write ``path`` whole or not at all: a temp file in the same directory, created with
    ``mode`` (SECRET_MODE for a secret) from its first byte, fsync-ed, then renamed over
    ``path``. A crash at any point leaves the old file (or none), never half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # exactly ``mode`` whatever the umask, before the first byte
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` survive a power cut."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LockHeld(ProvisionError):
    """Another run holds this inventory: nothing was touched (exit 2, as for bad input)."""

    exit_code = EXIT_BAD_INPUT


@contextmanager
def inventory_lock(inventory: Path, command: str = "provision up") -> Iterator[None]:
    """Hold the controller's lock on one inventory for the length of a run, or raise
    LockHeld naming the holder. flock dies with its process, so the lock of a run that was
    killed is free again at once; its file still names the dead holder and is rewritten."""
    path = inventory_dir(inventory) / "up.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").split()
            pid, started = [*holder, "?", "?"][:2]
            raise LockHeld(
                f"another {command} (pid {pid}, started {started}) holds the lock on {inventory}; "
                "wait for it to end, or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing the descriptor lets go of the lock
