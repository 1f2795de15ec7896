"""remote.run_beside keeps its deadline when the host goes silent after opening the channel.

The server is a real SSH server (paramiko's own implementation, on loopback) that accepts
the connection and the session channel, then never answers the exec request: a host cut
off at that moment. paramiko's client waits for that answer without a deadline, so before
the fix a sweep's trial whose node went silent just then never ended (seen in a clean-clone
run: `test_tune_run.py`'s lost-host drill ran past its 420 s).
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import paramiko
import pytest

from provision import remote
from provision.inventory import SshTarget


class _SilentAfterOpen(paramiko.ServerInterface):
    """Accepts any key and the session channel; holds the exec request unanswered."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.release.wait(120)  # the answer is never sent while the test runs
        return False


@pytest.fixture
def silent_server(tmp_path: Path):
    host_key = paramiko.RSAKey.generate(2048)
    client_key = paramiko.RSAKey.generate(2048)
    client_key.write_private_key_file(str(tmp_path / "client_key"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key.get_name()} {host_key.get_base64()}\n")
    release = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        sock, _ = listener.accept()
        t = paramiko.Transport(sock)
        transports.append(t)
        t.add_server_key(host_key)
        t.start_server(server=_SilentAfterOpen(release))

    threading.Thread(target=serve, daemon=True).start()
    target = SshTarget("127.0.0.1", port, "root", str(tmp_path / "client_key"), str(tmp_path / "known_hosts"), "yes")
    yield target
    release.set()
    for t in transports:
        t.close()
    listener.close()


def test_run_beside_gives_up_at_its_deadline_when_the_exec_is_never_answered(silent_server):
    conn = remote.connection(silent_server, connect_timeout=10)
    try:
        conn.open()
        # Without its deadline this waited for the server's answer (held 120 s here), then
        # said the exec was refused.
        result = remote.run_beside(conn, "silent", "true", timeout=3)
    finally:
        conn.close()
    assert result.exited == -1, result
    assert result.stderr == "no answer to a command on silent within 3 s", result.stderr
