"""SSH keys made on the controller: the testbed's client key pair (root logs in with it)
and one host key per node, pinned in the testbed's known_hosts file. Host key checking
stays strict: the inventory points at this file and nothing is accepted blindly."""

from __future__ import annotations

import subprocess
from pathlib import Path

from provision.errors import TestbedError
from provision.state import generated_key, write_atomic

LOOPBACK = "127.0.0.1"


def generate(path: Path, comment: str) -> Path:
    """Make an ed25519 key pair at path (and path.pub) unless it exists; return path."""
    if path.is_file() and path.with_suffix(".pub").is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    try:  # made beside it and renamed in, mode 0600 from ssh-keygen's first byte
        return generated_key(path, comment)
    except subprocess.CalledProcessError as e:
        raise TestbedError(f"ssh-keygen failed for {path}: {e.stderr.decode(errors='replace').strip()}") from None


def public(path: Path) -> str:
    """The public half of a key made by generate(): "ssh-ed25519 AAAA... comment"."""
    return Path(f"{path}.pub").read_text().strip()


def known_hosts_line(port: int, public_key: str, host: str = LOOPBACK) -> str:
    """One known_hosts entry; a non-22 port needs the bracketed [host]:port form."""
    key_type, key_data = public_key.split()[:2]
    where = host if port == 22 else f"[{host}]:{port}"
    return f"{where} {key_type} {key_data}"


def write_known_hosts(path: Path, entries: list[tuple[int, str]]) -> None:
    """Rewrite the testbed's known_hosts from (port, public key) pairs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(known_hosts_line(port, key) + "\n" for port, key in entries))
