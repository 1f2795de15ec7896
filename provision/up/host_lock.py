"""Each host's lock for the length of an `up`: two runs (from another inventory, another
controller, another operator) never change one host at the same time.

The controller's lock (state.inventory_lock) stops a second `up` of the same inventory
on the same controller; this one is on the host. A run takes ``flock`` on LOCK_FILE
through an SSH session of its own that stays open for the run: the lock belongs to the
remote process, which holds it until its stdin ends. So it is let go when the run ends,
when the controller dies (its connection closes), and when the host reboots; it is never
left behind by a crash. The holder's description (the inventory, the controller, its
pid, the start time, a run token) is written beside the lock, so a refused run says who
holds the host.

A host that appears twice in one inventory (two names for one machine, as in tests)
finds the lock held by its own run (the same token) and goes on. After a reboot (the
nvidia step), ``renew`` takes the lock again before the next step; a host that another
run took in between fails with that run named.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

from provision import remote
from provision.inventory import Cluster, Node

LOCK_DIR = "/run/provision"  # tmpfs: a reboot empties it; root's alone (0700)
LOCK_FILE = f"{LOCK_DIR}/up.lock"
HOLDER_FILE = f"{LOCK_DIR}/up.holder"
STEP = "lock"  # the "step" a host that could not be locked failed in
UNREACHABLE = "could not take the host's lock"  # the host did not answer: it is unreachable
HELD = 75  # the script's exit status when another run holds the lock (EX_TEMPFAIL)
OK_LINE = "provision-lock-ok"
HELD_LINE = "provision-lock-held:"


def lock_script(holder: str, token: str) -> str:
    """The remote side: make the root-only directory, take the lock without waiting, or
    say who holds it; then hold it while stdin stays open (``exec cat`` keeps descriptor
    9, and with it the lock, until the controller's session ends). The directory is
    checked to be root's own and nobody else's, so no other user can have put a link
    where the lock file is opened. Every value enters quoted."""
    return (
        "umask 077; "
        f"mkdir -p {LOCK_DIR} || exit 3; "
        f'if [ "$(stat -c %u:%a {LOCK_DIR})" != 0:700 ]; then '
        f'echo "{LOCK_DIR} is not root\'s own (mode 700)" >&2; exit 3; fi; '
        f"exec 9>>{LOCK_FILE} || exit 3; "
        "if ! flock -n 9; then "
        f'echo "{HELD_LINE} $(head -c 500 {HOLDER_FILE} 2>/dev/null | tr -d "\\n")"; exit {HELD}; fi; '
        f"printf '%s [run %s]\\n' {shlex.quote(holder)} {shlex.quote(token)} > {HOLDER_FILE}.new && "
        f"mv -f {HOLDER_FILE}.new {HOLDER_FILE}; "
        f"echo {OK_LINE}; exec cat >/dev/null"
    )


def holder_text(cluster: Cluster, now: float | None = None) -> str:
    """Who this run is, for the message of a run that finds the host taken."""
    started = datetime.fromtimestamp(now or time.time(), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"provision up of {cluster.path} from {socket.gethostname()} (pid {os.getpid()}, started {started})"


def refusal(first_line: str, token: str) -> str | None:
    """Why the host cannot be locked, from the script's first line; None when it is ours
    (taken now, or already held by this same run)."""
    if first_line == OK_LINE:
        return None
    if first_line.startswith(HELD_LINE):
        who = first_line[len(HELD_LINE) :].strip()
        if f"[run {token}]" in who:
            return None
        return f"another run holds this host: {who or 'a run that has not said who it is yet'}"
    return f"could not take the host's lock: {first_line[:300] or 'no answer'}"


@dataclass
class HostLocks:
    """The locks one run holds, by host name; ``refused`` says why the others are not held."""

    token: str
    holder: str
    held: dict[str, remote.Held] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    unreachable: set[str] = field(default_factory=set)  # of ``refused``: no answer at all

    def take(self, nodes: list[Node]) -> None:
        """Take the lock on every host at once, each within its own deadline (connect,
        then its command deadline for the answer); a host that hangs or refuses costs only
        itself."""
        for name, outcome in remote.on_all(nodes, self._take_one).items():
            if isinstance(outcome, remote.Held):
                self.held[name] = outcome
            elif isinstance(outcome, str):
                self.refused[name] = outcome
                if outcome.startswith(UNREACHABLE):
                    self.unreachable.add(name)
            # None: held by this run under another of the machine's names

    def renew(self, nodes: list[Node]) -> dict[str, str]:
        """After a reboot (which ended the lock's session, though the controller may not
        have noticed yet): let go of what is left and take the lock again. Returns host ->
        why it could not be taken again."""
        for node in nodes:
            if node.name in self.held:
                self.held.pop(node.name).let_go()
        before = set(self.refused)
        self.take(nodes)
        return {name: why for name, why in self.refused.items() if name not in before}

    def release(self) -> None:
        for held in self.held.values():
            held.let_go()
        self.held.clear()

    def _take_one(self, node: Node) -> remote.Held | str | None:
        """The held lock, why it cannot be held, or None when this run holds it already."""
        command = lock_script(self.holder, self.token)
        if node.data.get("_sudo"):  # as pyinfra runs the step's commands
            command = remote.as_root(node.ssh.user, command)
        try:
            held = remote.hold(node, command, answer_s=node.settings.command_timeout_s)
        except remote.RemoteError as e:
            return f"{UNREACHABLE}: {e}"
        if held.first_line == OK_LINE:
            return held
        held.let_go()  # refused, or held by this run under another name
        return refusal(held.first_line, self.token)


@contextlib.contextmanager
def held(cluster: Cluster) -> Iterator[HostLocks]:
    """Every host of the cluster locked for the block (or named in ``refused``); let go
    at the end, whatever happened."""
    locks = HostLocks(secrets.token_hex(8), holder_text(cluster))
    try:
        locks.take(list(cluster.nodes))
        yield locks
    finally:
        locks.release()
