"""known_hosts as OpenSSH reads it, for both SSH seams (``remote.py`` for fabric and
``engine/pyinfra_state.py`` for pyinfra), so a host's key is judged the same on both.

paramiko's own loader stops at the first line it cannot parse, and it cannot parse
OpenSSH's marker lines: a ``@cert-authority`` or ``@revoked`` line at the top of the file
left no key loaded, every host looked new, and ``accept-new`` then took a changed key.
Here every plain line is read whatever comes before it; ``@cert-authority`` lines are
skipped (paramiko does not check host certificates, so they vouch for no key here), and a
key on a ``@revoked`` line is never trusted, under any checking mode. A changed key of a
known host is refused by paramiko itself before any policy is asked.
"""

from __future__ import annotations

import os
from typing import Any


def load(*paths: str | None) -> Any:
    """A paramiko ``HostKeys`` of every plain line of the files (one that does not exist
    adds none), with ``.revoked``: the base64 keys of the ``@revoked`` lines, left out."""
    from paramiko.hostkeys import HostKeyEntry, HostKeys

    keys: Any = HostKeys()
    revoked: set[str] = set()
    entries = []
    for line in (line for path in paths for line in _lines(path)):
        if line.startswith("@"):
            fields = line.split()
            if fields[0] == "@revoked" and len(fields) >= 4:
                revoked.add(fields[3])
            continue  # @cert-authority: no certificate checks in paramiko
        try:
            entry = HostKeyEntry.from_line(line)
        except Exception:  # a bad line hides nothing after it
            continue
        if entry is not None:
            entries.append(entry)
    # HostKeys has no public way to add an entry with hashed names (|1|...) as it stands.
    keys._entries = [e for e in entries if e.key.get_base64() not in revoked]
    keys.revoked = frozenset(revoked)
    return keys


def _lines(path: str | None) -> list[str]:
    if not path or not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        stripped = (line.strip() for line in f)
        return [line for line in stripped if line and not line.startswith("#")]


def revoked_of(client: Any) -> frozenset[str]:
    return frozenset(getattr(client.get_host_keys(), "revoked", frozenset()))


class AcceptNew:
    """OpenSSH's StrictHostKeyChecking=accept-new for paramiko: a host never seen is trusted
    and its key appended to known_hosts (never rewritten: the file keeps its marker and
    comment lines), so the next connection pins it. ``path`` None: the client's own file
    (pyinfra sets it)."""

    def __init__(self, path: str | None = None):
        self.path = path

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        path = self.path or getattr(client, "_host_keys_filename", None)
        client.get_host_keys().add(hostname, key.get_name(), key)
        if path:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class RefuseRevoked:
    """Wraps a missing-host-key policy: a key on a @revoked line is refused first, under
    every checking mode. (A revoked key is left out of the loaded keys, so a host that
    offers one always reaches this policy.)"""

    def __init__(self, inner: Any):
        self.inner = inner

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        if key.get_base64() in revoked_of(client):
            from paramiko.ssh_exception import SSHException

            raise SSHException(f"the host key of {hostname} is marked @revoked in known_hosts")
        self.inner.missing_host_key(client, hostname, key)


def policy(mode: str, path: str | None = None) -> Any:
    """The missing-host-key policy for an inventory's ssh_strict_host_key_checking."""
    import paramiko

    inner: Any
    if mode == "yes":
        inner = paramiko.RejectPolicy()
    elif mode == "accept-new":
        inner = AcceptNew(path)
    else:
        inner = paramiko.AutoAddPolicy()
    return RefuseRevoked(inner)
