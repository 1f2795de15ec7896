"""Follow-ups that converge after an interrupted run.

A follow-up (update-initramfs after a blacklist, exportfs -ra after /etc/exports, a
daemon-reload after fstab) used to run only when its file changed *in this run*
(``_if=op.did_change``). An `up` killed between the file's change and its follow-up then
never ran the follow-up: the next run found the file already right and did nothing. Here
a follow-up also runs whenever the host's stamp (facts/stamps.py) does not hold the digest
of the inputs it is for, and writes that stamp with its commands; so a run killed at any
point and run again finishes the job, and the run after that changes nothing.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from provision.facts.stamps import STAMP_DIR, Stamp, stamp_path


def digest(inputs: Sequence[str]) -> str:
    """What a follow-up is for: the sha256 of its inputs (file contents, in order)."""
    h = hashlib.sha256()
    for text in inputs:
        h.update(hashlib.sha256(text.encode()).digest())
    return h.hexdigest()


def stamp_command(name: str, value: str) -> str:
    """The shell text that records ``value`` as stamp ``name``, written whole (a rename)."""
    path = shlex.quote(stamp_path(name))
    tmp = shlex.quote(stamp_path(name) + ".tmp")
    return f"mkdir -p {shlex.quote(STAMP_DIR)} && printf '%s\\n' {shlex.quote(value)} > {tmp} && mv -f {tmp} {path}"


def follow_up(name: str, stamp: str, inputs: Sequence[str], commands: list[str], changed: Callable[[], bool]) -> Any:
    """Inside a deploy: run ``commands`` after ``inputs`` changed, in this run (``changed``,
    e.g. a files operation's did_change) or in one that stopped before the follow-up ran
    (the host's stamp does not hold these inputs' digest)."""
    from pyinfra import host
    from pyinfra.operations import server

    want = digest(inputs)
    if host.get_fact(Stamp, stamp=stamp) != want:
        return server.shell(name=name, commands=[*commands, stamp_command(stamp, want)])
    return server.shell(name=name, commands=[*commands, stamp_command(stamp, want)], _if=changed)
