"""The run's TensorBoard event files, copied back to the controller beside its logs.

The trainer (rank 0) writes them as the training user, so the copy on the node runs as
that user too (runuser), and takes only what TensorBoard reads: regular files named
events.out.tfevents.*, in the events directory or its hparams/ directory, each under
MAX_FILE_BYTES, MAX_FILES in all, the stream cut at ARCHIVE_CAP. Here, only such
members are unpacked, by name, never a path the archive chooses: a link or a name with
a directory in it is dropped.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import tarfile
from pathlib import Path
from shlex import quote
from typing import Any

from provision import remote

MAX_FILE_BYTES = 64 * 2**20
MAX_FILES = 1000
ARCHIVE_CAP = 128 * 2**20  # the gzip stream, before base64
MAX_TOTAL_BYTES = 1024 * 2**20  # all files unpacked here, whatever the stream's size
FETCH_S = 120
_NAME = re.compile(r"(?:hparams/)?events\.out\.tfevents\.[A-Za-z0-9._-]{1,200}")


def copy_command(directory: str, run_as: str | None) -> str:
    """Shell that prints the event files of ``directory`` as a base64 tar.gz."""
    pick = (
        f"cd {quote(directory)} && find . -maxdepth 2 -type f -name 'events.out.tfevents.*' "
        f"-size -{MAX_FILE_BYTES // 1024}k -print0 | head -z -n {MAX_FILES} | "
        "tar --null --no-recursion -T - -czf -"
    )
    user = f"runuser -u {quote(run_as)} -- " if run_as else ""
    return f"{user}sh -c {quote(pick)} | head -c {ARCHIVE_CAP} | base64 -w0"


def unpack(encoded: str, dest: Path) -> tuple[list[str], str | None]:
    """(the event files written under ``dest``, a note when the archive was cut or bad)."""
    try:
        raw = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return [], "the copy was not base64"
    written: list[str] = []
    note = None
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as archive:
            for member in archive:
                name = member.name.removeprefix("./")
                if not member.isreg() or not _NAME.fullmatch(name) or member.size > MAX_FILE_BYTES:
                    continue
                # The node's limits again here: sparse files compress to nothing on the way.
                total += member.size
                if len(written) >= MAX_FILES or total > MAX_TOTAL_BYTES:
                    note = f"the events stop at {len(written)} file(s): more than this copy keeps"
                    break
                source = archive.extractfile(member)
                if source is None:
                    continue
                target = dest / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read(MAX_FILE_BYTES))
                written.append(name)
    except (tarfile.TarError, EOFError, OSError) as e:  # cut at the cap, or not an archive
        note = f"the copy ended early ({type(e).__name__}): {len(written)} event file(s) kept"
    return written, note


def fetch(conn: Any, host: str, directory: str, run_as: str | None, dest: Path) -> tuple[list[str], str | None]:
    """Copy ``directory``'s event files from ``host`` into ``dest``; (files, note)."""
    done = remote.run_beside(conn, host, copy_command(directory, run_as), FETCH_S)
    if not done.ok:
        why = done.stderr.strip() or f"exit {done.exited}"
        return [], f"the TensorBoard events on {host} could not be copied: {why[:200]}"
    if not done.stdout.strip():
        return [], f"no TensorBoard events in {directory} on {host}"
    dest.mkdir(parents=True, exist_ok=True)
    return unpack(done.stdout, dest)
