"""A TCP relay for integration tests that drops the first N connections the moment it
accepts them (as sshd past its MaxStartups does, or a reset on the way) and relays every
later one to a real server. It runs as its own process (the test process's threads are
gevent's), counts the connections it accepted in a file, and is stopped by pid.

    python -m tests.helpers.flaky_proxy LISTEN_PORT TARGET_PORT DROP_FIRST COUNT_FILE
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class FlakyProxy:
    port: int  # where it listens on 127.0.0.1
    count_file: Path  # connections accepted so far, one line each
    process: subprocess.Popen

    def accepted(self) -> int:
        return len(self.count_file.read_text().splitlines()) if self.count_file.exists() else 0

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def start(target_port: int, drop_first: int, work: Path) -> FlakyProxy:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    count = work / f"proxy-{port}.count"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.flaky_proxy", str(port), str(target_port), str(drop_first), str(count)],
        cwd=Path(__file__).resolve().parents[2],
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()  # counted, and dropped or relayed
            return FlakyProxy(port, count, process)
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("flaky proxy did not start")


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def main() -> None:
    listen_port, target_port, drop_first, count_file = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(64)
    seen = -1  # the readiness probe of start() is the first connection, not counted as a drop
    while True:
        client, _ = server.accept()
        seen += 1
        if seen > 0:
            with open(count_file, "a") as f:
                f.write("accepted\n")
        if 0 < seen <= drop_first:
            client.close()
            continue
        upstream = socket.create_connection(("127.0.0.1", target_port))
        threading.Thread(target=_pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()


if __name__ == "__main__":
    main()
