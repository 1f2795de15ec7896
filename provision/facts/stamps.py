"""The stamps `up` leaves on a host when a follow-up (update-initramfs, exportfs -ra, a
systemd daemon-reload) has run for a given version of its inputs.

A stamp is one line, the digest of the inputs the follow-up last ran for, in
``STAMP_DIR/<name>``; operations/stamps.py writes it and decides from it.
"""

from __future__ import annotations

import shlex

from pyinfra.api import FactBase

STAMP_DIR = "/var/lib/provision/stamps"  # root-owned; one file per follow-up


def stamp_path(name: str) -> str:
    return f"{STAMP_DIR}/{name}"


def parse_stamp(lines: list[str]) -> str | None:
    """The digest a stamp file holds; None when there is none (missing or empty)."""
    text = "".join(lines).strip()
    return text or None


class Stamp(FactBase[str | None]):
    """The digest in one follow-up's stamp, or None. Arguments: stamp (its name)."""

    def command(self, stamp: str) -> str:
        return f"cat {shlex.quote(stamp_path(stamp))} 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        return parse_stamp(output)
