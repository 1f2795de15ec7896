"""An elastic run's rendezvous store: torch's own TCPStore server, in a process of its own
on the controller. Started by ``store.Store.start`` with ``python -I``:

    python -I store_server.py

It listens on 127.0.0.1 only (a socket bound here and handed to TCPStore, whose own bind
takes every interface), prints its port on one line, and serves until its stdin ends:
when `provision train` closes it, or dies. Nothing else stops it, and nothing outlives
the launcher: Linux also sends it SIGKILL when its parent goes (PR_SET_PDEATHSIG).

Started as root, it first becomes ``nobody``: every user on every node can reach it
through the node's forwarded port, and TCPStore was written for trusted peers, so what a
malformed message could do to it stays inside an account that owns nothing.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import signal
import socket
import sys

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def drop_root() -> None:
    """As root: become nobody (no groups, no way back, no new privileges)."""
    if os.geteuid() != 0:
        return
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
    if os.getuid() == 0 or os.geteuid() == 0:
        raise SystemExit("could not leave root")


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    # Imported as the launcher's user: its Python may live where nobody cannot read
    # (a pyenv under /root). Nothing is served before the drop below.
    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    port = listener.getsockname()[1]
    drop_root()
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the drop: a change of user clears it
    if os.getppid() == 1:  # the launcher went before the line above took effect
        return 1
    store = TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno(), use_libuv=True
    )
    print(f"STORE_PORT={store.port}", flush=True)
    sys.stdin.read()  # until the launcher closes our stdin or goes away
    return 0


if __name__ == "__main__":
    sys.exit(main())
