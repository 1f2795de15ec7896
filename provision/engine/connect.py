"""Connecting a pass's hosts, with a retry for transient errors only.

pyinfra's connect_all tries each host once. On a fleet, some handshakes fail for reasons
that pass in a second: sshd dropping connections past its MaxStartups while a thousand
controllers' worth of handshakes arrive, a connection reset by a busy NAT or load
balancer, a host whose sshd is still starting ("Error reading SSH protocol banner"). Those
are retried after a short backoff, at most RETRIES times. Everything else fails at once:
a refused connection, a timeout (retrying would multiply the connect deadline), a bad key
or host key, a name that does not resolve.
"""

from __future__ import annotations

from typing import Any

RETRIES = 2  # more tries after the first, for transient errors only
BACKOFF_S = 1.0  # before the first retry; doubled for each one after

# ConnectError texts (pyinfra's "<what> (<paramiko's error>)") of failures that pass.
TRANSIENT = (
    "Error reading SSH protocol banner",
    "Connection reset by peer",
    "EOF error",
    "No existing session",
    "SSH session not active",
)


def transient(error: str) -> bool:
    """Whether a connection error is worth another try in a second."""
    return any(text in error for text in TRANSIENT)


def connect_all(state: Any, retries: int = RETRIES, backoff_s: float = BACKOFF_S) -> None:
    """pyinfra's connect_all (same result: the connected hosts activated, the others
    failed, "No hosts remaining" raised when none is left), each host retried on
    transient errors. Every try's error reaches the callbacks, the last one decides."""
    import gevent
    from pyinfra.api.exceptions import ConnectError

    hosts = [host for host in state.inventory if state.is_host_in_limit(host)]

    def one(host: Any) -> None:
        for attempt in range(retries + 1):
            try:
                host.connect(show_errors=False, raise_exceptions=True)
                return
            except ConnectError as e:
                if attempt == retries or not transient(str(e)):
                    return
            gevent.sleep(backoff_s * 2**attempt)

    gevent.joinall([state.pool.spawn(one, host) for host in hosts], raise_error=True)
    for host in hosts:
        if host.connected:
            state.activate_host(host)
    state.fail_hosts({host for host in hosts if not host.connected}, activated_count=len(hosts))
