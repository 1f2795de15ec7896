"""An elastic run's rendezvous store: torch's own TCPStore server, in a process of its own
on the controller. Started by ``store.Store.start`` with ``python -I``:

    python -I store_server.py

It listens on 127.0.0.1 only (a socket bound here and handed to TCPStore, whose own bind
takes every interface), prints its port on one line, and serves until its stdin ends:
when `provision train` closes it, or dies. Nothing else stops it, and nothing outlives
the launcher: Linux also sends it SIGKILL when its parent goes (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import signal
import socket
import sys


def main() -> int:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    from torch.distributed import TCPStore

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    port = listener.getsockname()[1]
    store = TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=listener.fileno(), use_libuv=True
    )
    print(f"STORE_PORT={store.port}", flush=True)
    sys.stdin.read()  # until the launcher closes our stdin or goes away
    return 0


if __name__ == "__main__":
    sys.exit(main())
