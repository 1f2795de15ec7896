"""The workdir and file mounts, packed on the controller for the nodes, and a job's outputs
unpacked here. Both directions are bounded; what comes back from a node is the job user's
and is unpacked with tarfile's ``data`` filter (no links out, no devices, no absolute or
``..`` paths, no set-uid bits)."""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from provision.errors import InputError, Problem

FILE_MAX_BYTES = 100 << 20  # a file past this is left out of the workdir (data belongs on a share)
WORKDIR_MAX_BYTES = 1 << 30  # a workdir past this is refused: it would be copied to every run
ALWAYS_LEFT_OUT = (".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache")


@dataclass
class Packed:
    """A packed tree: where the archive is and what was left out."""

    path: Path  # the .tar.gz on the controller
    files: int  # files in it
    size: int  # bytes before compression
    left_out: list[str] = field(default_factory=list)  # relative paths not synced, and why


def pack(source: Path, dest: Path, include: tuple[str, ...] = (), where: str = "workdir") -> Packed:
    """``source`` (a directory or one file) as ``dest``. In a directory, .git and caches are
    left out unless named in ``include``, and so is any file over FILE_MAX_BYTES; links are
    kept as links. More than WORKDIR_MAX_BYTES in all is bad input (nothing started)."""
    files, size, left = _walk(source, include)
    if size > WORKDIR_MAX_BYTES:
        raise InputError(
            Problem(
                f"{where} {source}",
                f"holds {size / 2**20:.0f} MiB to sync (at most {WORKDIR_MAX_BYTES >> 20} MiB)",
                "put data on a share (file_mounts or the datasets share) and keep code in the workdir",
            )
        )
    with tarfile.open(dest, "w:gz", compresslevel=1) as tar:
        if source.is_file():
            tar.add(source, arcname=source.name, recursive=False)
        for rel in files:
            tar.add(source / rel, arcname=rel, recursive=False)
    return Packed(dest, len(files), size, left)


def _walk(source: Path, include: tuple[str, ...]) -> tuple[list[str], int, list[str]]:
    if source.is_file():
        return [], source.stat().st_size, []
    files: list[str] = []
    left: list[str] = []
    size = 0
    for top, dirs, names in os.walk(source):
        rel_top = os.path.relpath(top, source)
        for d in list(dirs):
            rel = os.path.normpath(os.path.join(rel_top, d))
            if d in ALWAYS_LEFT_OUT and rel not in include:
                dirs.remove(d)
                left.append(f"{rel}/ (left out by default)")
            elif os.path.islink(os.path.join(top, d)):
                files.append(rel)  # a link to a directory is synced as the link
        for name in names:
            rel = os.path.normpath(os.path.join(rel_top, name))
            full = os.path.join(top, name)
            st = os.lstat(full)
            if st.st_size > FILE_MAX_BYTES and rel not in include and not os.path.islink(full):
                left.append(f"{rel} ({st.st_size / 2**20:.0f} MiB, over {FILE_MAX_BYTES >> 20} MiB)")
                continue
            files.append(rel)
            size += st.st_size
    return sorted(files), size, left


def unpack(archive: Path, dest: Path) -> int:
    """A job's outputs, from the node, into ``dest``: the number of files. Hostile members
    (links out, absolute paths, devices) raise tarfile's FilterError."""
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            tar.extract(member, dest, filter="data")
            count += member.isfile()
    return count
