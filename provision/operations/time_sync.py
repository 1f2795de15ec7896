"""chrony's time sources: the inventory's ``ntp_servers`` instead of the distribution's pool.

A server of ours added beside the distribution's pool leaves chrony asking the public pool
too (Debian's ``pool 2.debian.pool.ntp.org``, Ubuntu's ``pool ntp.ubuntu.com``, in
chrony.conf or, on Ubuntu 24.04, in /etc/chrony/sources.d/ubuntu-ntp-pools.sources; or an
image's own in /etc/chrony/conf.d): on an
isolated cluster that is a source that never answers, and where the pool is reachable
chrony may pick it over the site's servers. So with ``ntp_servers`` set, every other
``pool``/``server``/``peer`` line is parked (commented out behind PARKED, the line kept
whole), and with the setting emptied again the parked lines come back as they were.
Sources a DHCP server hands out (/run/chrony-dhcp) are the site's own and are kept.
"""

from __future__ import annotations

import shlex
from collections.abc import Generator
from typing import Any

from pyinfra.api import operation

from provision.facts.chrony import OURS, PARKED, SCANNED, SOURCE_LINE, ChronySources
from provision.facts.stamps import stamp_path

RESTART_STAMP = "chrony-sources"  # the stamp of chrony's restart (deploys/base.py)


def _each_file(edit: str, pattern: str) -> str:
    """Run ``edit`` (a sed script) on each file chrony reads sources from (SCANNED) that
    holds ``pattern``, ours apart. The files are found when the command runs, not from the
    fact: on a fresh host chrony's package installs them earlier in the same run. The
    restart's stamp goes first, so a run stopped after an edit still restarts chrony
    next time, whatever made the edit necessary (a pool line an upgrade put back)."""
    return (
        f"rm -f {shlex.quote(stamp_path(RESTART_STAMP))}; for f in {SCANNED}; do "
        f'[ -f "$f" ] && [ "$f" != {shlex.quote(OURS)} ] && grep -qE {shlex.quote(pattern)} "$f" || continue; '
        f'sed -i --follow-symlinks -E {shlex.quote(edit)} "$f" || exit 1; done'
    )


def park_command() -> str:
    """Comment out every pool/server/peer line behind PARKED, the line kept whole."""
    return _each_file(f"s/{SOURCE_LINE}/{PARKED}&/", SOURCE_LINE)


def unpark_command() -> str:
    """Bring back, unchanged, the lines park_command commented out."""
    return _each_file(f"s/^{PARKED}//", f"^{PARKED}")


@operation()
def distribution_sources(present: bool, sources: ChronySources) -> Generator[Any, None, None]:
    """The distribution's time sources in force (present) or parked (not present)."""
    if present and sources.parked:
        yield unpark_command()
    elif not present and (sources.live or sources.no_conf):
        yield park_command()
