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
    def start(cls, log: Path) -> Store:
        """The store process, its messages (torch's, if any) to ``log``."""
        if importlib.util.find_spec("torch") is None:
            raise LaunchError(
                "--min-nodes keeps the rendezvous store on this machine, in torch's own TCPStore, so no lost "
                "node can take the run down: install torch here (pip install 'provision[node]')"
            )
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as err:  # a file, not a pipe nobody reads that could fill and block it
            proc = subprocess.Popen(
                [sys.executable, "-I", str(SERVER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline() if proc.stdout else ""))
        reader.daemon = True
        reader.start()
        reader.join(START_S)
        text = line[0].strip() if line else ""
        if not text.startswith("STORE_PORT=") or not text[len("STORE_PORT=") :].isdecimal():
            _end(proc)
            why = "did not start in time" if not line else log.read_text(errors="replace").strip()[-300:]
            raise LaunchError(f"the rendezvous store could not start here: {why or 'no port printed'}")
        return cls(proc, int(text[len("STORE_PORT=") :]))

    def expose(self, nodes: list[Node], conns: dict[str, Any]) -> dict[str, int]:
        """The store on every node's loopback; raises LaunchError naming each node that
        refused (after closing the forwards that were made)."""

        def one(node: Node) -> remote.Forward | Exception:
            try:
                forward = remote.forward_here(conns[node.name], node.name, self.port, FORWARD_S)
            except remote.RemoteError as e:
                return e
            why = _open_wider(conns[node.name], node.name, forward.port)
            if why:
                forward.close()
                return remote.RemoteError(why)
            return forward

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
        why = _open_wider(conn, node.name, forward.port)
        if why:
            forward.close()
            raise LaunchError(why)
        self.forwards.append(forward)
        return forward.port

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        _end(self.proc)
        for f in self.forwards:
            f.close()
        self.forwards = []


def _open_wider(conn: Any, host: str, port: int) -> str | None:
    """Why the node's forwarded port is not on its loopback only, or None. sshd's
    GatewayPorts yes binds a forward on every interface whatever was asked, and the store
    must not be open to the cluster network."""
    seen = remote.run_beside(conn, host, f"ss -Hltn 'sport = :{int(port)}'", timeout=FORWARD_S)
    if not seen.ok:
        return f"cannot see where its forwarded port listens (ss: {seen.stderr.strip()[-200:] or seen.exited})"
    local = [line.split()[3] for line in seen.stdout.splitlines() if len(line.split()) >= 4]
    if not local:
        return f"its forwarded port {port} is not listening"
    wider = [a for a in local if a.rsplit(":", 1)[0].strip("[]") not in ("127.0.0.1", "::1")]
    if wider:
        return (
            f"its sshd forwards port {port} on {', '.join(sorted(wider))[:200]}, not on its loopback only "
            "(GatewayPorts yes?): the rendezvous store would be open to the network; set GatewayPorts no"
        )
    return None


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
