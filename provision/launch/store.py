"""Where an elastic run's rendezvous lives: a store that no lost node can take down.

torchrun's c10d rendezvous keeps its store inside the agent of one compute node (the
first); when that node dies, every node's agent loses the rendezvous and the whole job
dies with it (pytorch issues 67742, 150916). An elastic run (``--min-nodes``) therefore
keeps the store here, beside `provision train`, for the run's lifetime only: torch's own
TCPStore server in a process of its own (``store_server``), listening on this machine's
loopback. Each node reaches it on its own loopback, through an ``ssh -R`` forward on the
connection the run holds to it anyway (``remote.forward_here``): no port is opened on the
cluster network, and the nodes need no route to this machine.

    store = Store.start()               # LaunchError when torch is missing here
    ports = store.expose(nodes, conns)  # node name -> its 127.0.0.1 port
    ...
    store.stop()                        # the forwards, then the process; idempotent

The controller needs torch for this (the ``node`` extra); a run without ``--min-nodes``
does not.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from provision import remote
from provision.inventory import Node
from provision.launch.session import LaunchError

SERVER = Path(__file__).with_name("store_server.py")
START_S = 60  # importing torch on a busy controller
FORWARD_S = 30  # a node's sshd answering a forwarding request


class Store:
    """The running store process and the forwards to it."""

    def __init__(self, proc: subprocess.Popen[str], port: int):
        self.proc, self.port = proc, port
        self.forwards: list[remote.Forward] = []

    @classmethod
    def start(cls) -> Store:
        if importlib.util.find_spec("torch") is None:
            raise LaunchError(
                "--min-nodes keeps the rendezvous store on this machine, in torch's own TCPStore, so no lost "
                "node can take the run down: install torch here (pip install 'provision[node]')"
            )
        proc = subprocess.Popen(
            [sys.executable, "-I", str(SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline() if proc.stdout else ""))
        reader.daemon = True
        reader.start()
        reader.join(START_S)
        text = line[0].strip() if line else ""
        if not text.startswith("STORE_PORT=") or not text[len("STORE_PORT=") :].isdecimal():
            why = "did not start in time" if not line else _stderr_tail(proc)
            _end(proc)
            raise LaunchError(f"the rendezvous store could not start here: {why or 'no port printed'}")
        return cls(proc, int(text[len("STORE_PORT=") :]))

    def expose(self, nodes: list[Node], conns: dict[str, Any]) -> dict[str, int]:
        """The store on every node's loopback; raises LaunchError naming each node that
        refused (after closing the forwards that were made)."""

        def one(node: Node) -> remote.Forward | Exception:
            try:
                return remote.forward_here(conns[node.name], node.name, self.port, FORWARD_S)
            except remote.RemoteError as e:
                return e

        results = remote.on_all(nodes, one)
        self.forwards += [f for f in results.values() if isinstance(f, remote.Forward)]
        refused = {name: r for name, r in results.items() if isinstance(r, Exception)}
        if refused:
            self.stop()
            raise LaunchError(
                "; ".join(
                    f"{name}: its sshd would not forward a port to the rendezvous store ({e}); "
                    "allow TCP forwarding for this user (AllowTcpForwarding yes or remote)"
                    for name, e in refused.items()
                )
            )
        return {f.host: f.port for f in self.forwards}

    def expose_one(self, node: Node, conn: Any) -> int:
        """The store on one more node's loopback: a lost node admitted again."""
        try:
            forward = remote.forward_here(conn, node.name, self.port, FORWARD_S)
        except remote.RemoteError as e:
            raise LaunchError(f"its sshd would not forward a port to the rendezvous store ({e})") from e
        self.forwards.append(forward)
        return forward.port

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        for f in self.forwards:
            f.close()
        self.forwards = []
        _end(self.proc)


def _end(proc: subprocess.Popen[str]) -> None:
    """Close its stdin (it exits on that), then make sure."""
    with contextlib.suppress(OSError, ValueError):
        if proc.stdin:
            proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _stderr_tail(proc: subprocess.Popen[str]) -> str:
    with contextlib.suppress(Exception):
        proc.kill()
        _, err = proc.communicate(timeout=5)
        return (err or "").strip()[-300:]
    return ""
