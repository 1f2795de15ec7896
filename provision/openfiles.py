"""The controller's open-file limit, checked before a pass over many hosts.

pyinfra connects to every host of a pass at once and keeps each connection (a socket, and
paramiko's transport) open for the whole pass; its own estimate is three files a host. A
1,000-host run under the common `ulimit -n` of 1024 would otherwise fail part-way with
"Too many open files" from whichever host came last. So: raise the soft limit as far as the
hard limit allows (any process may), and where even that is too low, stop before any host
is contacted and say what to do.
"""

from __future__ import annotations

import resource

from provision.errors import InputError, Problem

PER_HOST = 3  # files a connected host holds (pyinfra's own estimate, MAX_PARALLEL in its State)
RESERVE = 64  # the controller's own: logs, state files, known_hosts, python's imports


def needed(hosts: int) -> int:
    return hosts * PER_HOST + RESERVE


def ensure(hosts: int) -> int:
    """Make sure ``hosts`` connections fit in the open-file limit; returns the soft limit
    in force. Raises InputError when the hard limit is too low."""
    want = needed(hosts)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    if hard == resource.RLIM_INFINITY or hard >= want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return want
    raise InputError(
        Problem(
            f"open files (ulimit -n): {hard}",
            f"{hosts} hosts at once need about {want} open files on this controller",
            f"raise the limit (ulimit -n {want}, or LimitNOFILE= for a service) "
            "or run on fewer hosts at a time (--limit, --wave-size)",
        )
    )
