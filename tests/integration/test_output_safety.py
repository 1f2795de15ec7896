"""No traceback reaches the screen when a host answers TCP but not SSH (paramiko's
transport thread used to print two per host), and the summary still says why."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class NotSshListener:
    """A loopback TCP listener that answers like a web server, not like sshd."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()


@pytest.mark.parametrize("command", [["facts"], ["validate", "--quick"]])
def test_a_host_that_is_not_sshd_gets_a_reason_and_no_traceback(tmp_path, command):
    listener = NotSshListener()
    try:
        inv = tmp_path / "inv.py"
        data = {"ssh_hostname": "127.0.0.1", "ssh_port": listener.port, "ssh_strict_host_key_checking": "no"}
        inv.write_text(f"nodes = [('n1', {data!r})]\n")
        done = subprocess.run(
            [sys.executable, "-m", "provision", *command, str(inv)],
            cwd=tmp_path,
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "PROVISION_STATE_DIR": str(tmp_path / "state"),
                "COLUMNS": "300",
            },
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        listener.close()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "Exception (client)" not in done.stderr
    assert "SSH protocol banner" in done.stdout + done.stderr
