"""chrony's time sources other than provision's own: which files hold the distribution's
pool/server/peer lines, in force or parked by us (operations/time_sync.py parks them while
``ntp_servers`` is set).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase

CONF = "/etc/chrony/chrony.conf"
SOURCES_DIR = "/etc/chrony/sources.d"
CONF_DIR = "/etc/chrony/conf.d"  # chrony.conf's confdir: an image or an admin may add sources there
SCANNED = f"{CONF} {SOURCES_DIR}/*.sources {CONF_DIR}/*.conf"  # every file chrony may read sources from
OURS = f"{SOURCES_DIR}/provision.sources"
PARKED = "#provision-ntp_servers: "  # the prefix of a line parked while ntp_servers is set
SOURCE_LINE = r"^[[:space:]]*(pool|server|peer)[[:space:]]"  # ERE, as grep and sed read it


@dataclass(frozen=True)
class ChronySources:
    """Whether chrony's files (ours apart) hold the distribution's sources, in force or
    parked by us. Facts are read before the run installs anything, so a host without
    chrony yet says so: its configuration is parked once the package has put it there."""

    live: bool = False  # a pool/server/peer line in force, outside provision.sources
    parked: bool = False  # a line parked by us
    no_conf: bool = True  # chrony.conf does not exist (yet)


NO_CONF = "provision: no chrony.conf"


def parse_chrony_sources(lines: list[str]) -> ChronySources:
    """``grep -H`` output (``path:line``) over the SCANNED files, and
    NO_CONF when chrony.conf is missing. Only the lines' kinds are read, never a path to
    act on: the operations find the files again themselves."""
    live = parked = False
    for line in lines:
        path, sep, text = line.partition(":")
        if line == NO_CONF or not sep or path == OURS:
            continue
        if text.startswith(PARKED):
            parked = True
        else:  # the fact's grep passes only SOURCE_LINE and PARKED lines
            live = True
    return ChronySources(live, parked, NO_CONF in lines)


class ChronySourcesFact(FactBase[ChronySources]):
    """chrony's source lines other than ours, in force and parked (parse_chrony_sources)."""

    def command(self) -> str:
        pattern = shlex.quote(f"{SOURCE_LINE}|^{PARKED}")
        return f"[ -e {CONF} ] || echo {shlex.quote(NO_CONF)}; grep -HE {pattern} {SCANNED} 2>/dev/null || true"

    @staticmethod
    def default() -> ChronySources:
        return ChronySources()

    def process(self, output: list[str]) -> ChronySources:
        return parse_chrony_sources(output)
