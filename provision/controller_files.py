"""Files on the controller that an inventory names (a pip lock, a backup password, a
wheelhouse's SHA256SUMS): read only when each is a regular file of a sane size. A FIFO
would hang the read, /dev/zero fill memory, a directory raise; each is said in one line."""

from __future__ import annotations

from pathlib import Path


class Unreadable(Exception):
    """Why the file cannot be read, in words for a Problem."""


def read_small(path: Path, max_bytes: int) -> bytes:
    """The file's bytes; Unreadable when it is missing, not a regular file, larger than
    ``max_bytes`` or unreadable."""
    try:
        if not path.is_file():
            raise Unreadable(f"{path} does not exist" if not path.exists() else f"{path} is not a regular file")
        if path.stat().st_size > max_bytes:
            raise Unreadable(f"{path} is over {_size(max_bytes)}")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)  # it may have grown since the stat
        if len(data) > max_bytes:
            raise Unreadable(f"{path} is over {_size(max_bytes)}")
        return data
    except OSError as e:
        raise Unreadable(f"{path} cannot be read ({e.strerror or e})") from None


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 and n % 2**20 == 0 else f"{n // 1024} KiB"


def read_small_text(path: Path, max_bytes: int) -> str:
    """As read_small, decoded as UTF-8 (Unreadable when it is not)."""
    try:
        return read_small(path, max_bytes).decode()
    except UnicodeDecodeError:
        raise Unreadable(f"{path} is not UTF-8 text") from None
