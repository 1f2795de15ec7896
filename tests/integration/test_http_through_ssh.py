"""remote.http_get through a real sshd on loopback: an answer, a port with nothing on it,
a server that accepts and never answers (the deadline holds), an answer past the size
cap, and a request path that would smuggle a header."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from provision import remote
from provision.inventory import SshTarget
from tests.helpers import loopback_sshd


@pytest.fixture(scope="module")
def conn(tmp_path_factory):
    server = loopback_sshd.start(tmp_path_factory.mktemp("sshd"))
    target = SshTarget("127.0.0.1", server.port, "root", str(server.key), str(server.known_hosts), "yes")
    c = remote.connection(target)
    yield c
    c.close()
    server.stop()


class _Answer(BaseHTTPRequestHandler):
    body = b'{"status": "success"}'

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ok" else 404)
        self.end_headers()
        self.wfile.write(self.body if self.path == "/ok" else b"no")

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_an_answer_comes_back_with_its_status(conn) -> None:
    server = _serve(_Answer)
    try:
        port = server.server_address[1]
        ok = remote.http_get(conn, "head", "127.0.0.1", port, "/ok", timeout=10)
        assert (ok.status, ok.body) == (200, b'{"status": "success"}')
        assert remote.http_get(conn, "head", "127.0.0.1", port, "/missing", timeout=10).status == 404
    finally:
        server.shutdown()


def test_nothing_listening_is_a_remote_error_naming_the_host(conn) -> None:
    port = loopback_sshd.free_port()
    with pytest.raises(remote.RemoteError, match=rf"^head \(127.0.0.1:{port}\): "):
        remote.http_get(conn, "head", "127.0.0.1", port, "/", timeout=10)


def test_a_server_that_never_answers_costs_the_deadline_only(conn) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        started = time.monotonic()
        with pytest.raises(remote.RemoteError, match="no answer to GET /api within 2 s"):
            remote.http_get(conn, "head", "127.0.0.1", silent.getsockname()[1], "/api", timeout=2)
        assert time.monotonic() - started < 6
    finally:
        silent.close()


def test_an_answer_past_the_cap_is_refused(conn, monkeypatch) -> None:
    monkeypatch.setattr(remote, "HTTP_MAX_BYTES", 1000)

    class Big(_Answer):
        body = b"x" * 5000

    server = _serve(Big)
    try:
        with pytest.raises(remote.RemoteError, match="over 0 MiB"):
            remote.http_get(conn, "head", "127.0.0.1", server.server_address[1], "/ok", timeout=10)
    finally:
        server.shutdown()


def test_a_path_with_a_line_break_is_refused(conn) -> None:
    with pytest.raises(ValueError, match="not a request path"):
        remote.http_get(conn, "head", "127.0.0.1", 1, "/x\r\nEvil: 1", timeout=5)
