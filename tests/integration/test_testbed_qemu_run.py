"""The testbed's SSH banner wait against real loopback listeners."""

from __future__ import annotations

import pytest

from provision.testbed import network


def test_banner_wait_ignores_a_forward_that_accepts_and_closes_then_sees_sshd() -> None:
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]

    def serve() -> None:
        first, _ = server.accept()  # like qemu's forward before the guest listens
        first.close()
        second, _ = server.accept()
        second.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u10\r\n")
        second.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert network.wait_for_banner(port, timeout_s=20) >= 0
    finally:
        thread.join(5)
        server.close()


def test_banner_wait_gives_up_after_its_timeout() -> None:
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(TimeoutError):
            network.wait_for_banner(port, timeout_s=1.5)
