"""The ONLY module that opens fabric/paramiko connections.

pyinfra owns desired state (``provision.engine``); everything imperative (benchmarks, training,
backup and restore commands, waiting for a booting VM) goes through here. Keeping one
seam means host-key policy, timeouts and retries are decided once, and tests can hand in
a double.

Host keys are checked by default: a host whose key is not in the known_hosts file is
refused, unless the inventory says ``ssh_strict_host_key_checking = "accept-new"`` (or
"no").
"""

from __future__ import annotations

import contextlib
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from provision import hostkeys
from provision.inventory import Node, SshTarget

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10
TIMED_OUT = 124  # exited, when run()'s own timeout stopped the command (as timeout(1) exits)


class RemoteError(Exception):
    """A remote command could not be run (unreachable, refused, timed out)."""


def connection(target: SshTarget | Node, connect_timeout: int | None = None) -> Any:
    """A fabric Connection for a host, with provision's host-key policy applied. The
    connect deadline is the node's ``connect_timeout_s`` setting unless given (a bare
    SshTarget: CONNECT_TIMEOUT_S); the SSH banner and authentication get at least as long,
    and never less than 30 s, which a busy emulated node needs to fork sshd and answer."""
    from fabric import Config, Connection

    ssh = target.ssh if isinstance(target, Node) else target
    if connect_timeout is None:
        connect_timeout = target.settings.connect_timeout_s if isinstance(target, Node) else CONNECT_TIMEOUT_S
    handshake = max(connect_timeout, 30)
    connect_kwargs: dict[str, Any] = {"banner_timeout": handshake, "auth_timeout": handshake}
    if ssh.key:
        connect_kwargs.update(key_filename=ssh.key, look_for_keys=False)
    # The inventory is the source of truth: the user's ~/.ssh/config is not read, so a
    # test (or a second operator) gets the same connection as the first.
    config = Config(overrides={"load_ssh_configs": False})
    conn = Connection(
        ssh.hostname,
        user=ssh.user or os.environ.get("USER") or "root",
        port=ssh.port,
        config=config,
        connect_timeout=connect_timeout,
        connect_kwargs=connect_kwargs,
    )
    known_hosts = ssh.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
    # The inventory allows yes, accept-new, no and off (checked when it loads). A changed
    # key of a host in known_hosts is refused under every policy: paramiko checks loaded
    # keys before it asks the policy, which is only consulted for a host it has never seen.
    # hostkeys reads every line (marker lines included) the way the pyinfra seam does.
    conn.client._host_keys = hostkeys.load(known_hosts)
    conn.client.set_missing_host_key_policy(hostkeys.policy(ssh.strict_host_key_checking, known_hosts))
    return conn


@dataclass(frozen=True)
class CommandResult:
    """What one remote command did."""

    host: str  # inventory name
    exited: int  # exit status; -1 when the command could not run at all
    stdout: str  # captured standard output
    stderr: str  # captured standard error, or why the command could not run

    @property
    def ok(self) -> bool:
        return self.exited == 0


def run(node: Node, command: str, timeout: float | None = None, conn: Any = None) -> CommandResult:
    """Run a shell command on a node and capture its output. Never raises for the
    command's own failure; an unreachable host gives exited=-1 with the reason."""
    own = conn is None
    conn = conn or connection(node)
    try:
        result = conn.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
        return CommandResult(node.name, result.exited, result.stdout, result.stderr)
    except Exception as e:  # paramiko/socket/invoke errors all mean "could not run"
        partial = getattr(e, "result", None)  # invoke's CommandTimedOut keeps what was printed
        if timeout is not None and partial is not None and type(e).__name__ == "CommandTimedOut":
            why = f"timed out after {timeout:g} s (no exit status)\n{partial.stderr}"
            return CommandResult(node.name, TIMED_OUT, partial.stdout, why)
        return CommandResult(node.name, -1, "", f"{type(e).__name__}: {e}")
    finally:
        if own:
            conn.close()


def as_root(user: str | None, command: str) -> str:
    """``command`` for a root shell on a host logged into as ``user`` (None: as OpenSSH
    does, the local user): as it is for root, else through ``sudo -n`` (never a password
    prompt that would hang the run)."""
    if (user or os.environ.get("USER")) == "root":
        return command
    return f"sudo -n sh -c {shlex.quote(command)}"


FANOUT = 32  # hosts worked on at once by on_all when no node sets `parallel`


def fanout(nodes: list[Node]) -> int:
    """How many of these hosts on_all works on at once: the smallest ``parallel`` a node
    asks for (the setting pyinfra's passes obey too), else FANOUT."""
    asked = [n.settings.parallel for n in nodes if n.settings.parallel > 0]
    return min(asked, default=FANOUT)


def on_all(nodes: Iterable[Node], func: Callable[[Node], T], together: bool = False) -> dict[str, T]:
    """Call func(node) for every node in parallel; results by node name, in input order.

    At most ``fanout(nodes)`` run at once, each host's deadlines starting when its turn
    comes. ``together=True`` is for gang work, where every node's call must be running
    at the same time or none can finish (a torchrun rendezvous across the nodes): then
    every node gets its own thread, whatever the setting, since a queue would leave the
    first nodes waiting for peers that cannot start until they end."""
    nodes = list(nodes)
    if not nodes:
        return {}
    workers = len(nodes) if together else min(fanout(nodes), len(nodes))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {n.name: pool.submit(func, n) for n in nodes}
        return {name: f.result() for name, f in futures.items()}


def wait_for_ssh(target: SshTarget, timeout_s: float, interval_s: float = 1.0) -> float:
    """Wait until a real SSH handshake and login succeed; return the seconds it took.

    A port forward (qemu user networking) accepts TCP before the guest's sshd runs, and a
    connection then dies with "Error reading SSH protocol banner"; so an open port proves
    nothing. Retries are bounded by ``timeout_s``.
    """
    start = time.monotonic()
    last_error = "no attempt made"
    while time.monotonic() - start < timeout_s:
        conn = connection(target, connect_timeout=5)
        try:
            conn.open()
            conn.close()
            return time.monotonic() - start
        except (TimeoutError, OSError, EOFError) as e:
            last_error = f"{type(e).__name__}: {e}"
        except Exception as e:  # paramiko.SSHException and friends while sshd starts
            if "not found in known_hosts" in str(e) or "BadHostKey" in type(e).__name__:
                raise RemoteError(f"{target.hostname}:{target.port}: host key refused: {e}") from e
            last_error = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        time.sleep(interval_s)
    raise RemoteError(f"{target.hostname}:{target.port}: no SSH login within {timeout_s:.0f}s ({last_error})")


def ssh_config(nodes: Iterable[Node]) -> str:
    """An OpenSSH client config naming every node (Host = inventory name), with the same
    host-key policy as connection(): known_hosts pinned, strict checking unless the
    inventory says otherwise. For tools that speak OpenSSH (pytest-testinfra)."""
    blocks = []
    for node in nodes:
        ssh = node.ssh
        known_hosts = ssh.known_hosts or os.path.expanduser("~/.ssh/known_hosts")
        strict = ssh.strict_host_key_checking if ssh.strict_host_key_checking in ("yes", "accept-new") else "no"
        lines = [
            f"Host {_config_word(node.name)}",
            f"  HostName {_config_word(ssh.hostname)}",
            f"  Port {int(ssh.port)}",
            f"  UserKnownHostsFile {_config_word(known_hosts)}",
            f"  StrictHostKeyChecking {strict}",
            "  BatchMode yes",
            f"  ConnectTimeout {CONNECT_TIMEOUT_S}",
        ]
        if ssh.user:
            lines.append(f"  User {_config_word(ssh.user)}")
        if ssh.key:
            lines += [f"  IdentityFile {_config_word(ssh.key)}", "  IdentitiesOnly yes"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _config_word(value: str) -> str:
    """One ssh_config argument. The inventory's values are validated at load (host and
    user names, paths without control characters); a line break here would start a new
    directive (a ProxyCommand runs on the controller), so it is refused even so, and a
    path with spaces or '%' is quoted and escaped as ssh_config(5) reads it."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value) or '"' in value:
        raise ValueError(f"{value!r} cannot be written into an ssh_config")
    value = value.replace("%", "%%")
    return f'"{value}"' if any(c.isspace() for c in value) or not value else value


def run_beside(conn: Any, host: str, command: str, timeout: float = 30) -> CommandResult:
    """Run a short command on an open connection over a channel of its own.

    For work beside a long ``conn.run`` on the same connection (a log stream): invoke's
    runner blocks a second run on that connection until the first ends, a bare channel
    does not. Output is read whole; keep commands short. Opening the channel and the
    exchange after it each get ``timeout``: paramiko waits for sshd's answer to the exec
    request with no deadline of its own, so a host that goes silent between the two (seen
    as a sweep's trial that never ended, its node cut off just then) would hold the caller
    until TCP gave up on the connection.
    """
    try:
        if not conn.is_connected:
            conn.open()
        channel = conn.client.get_transport().open_session(timeout=timeout)
    except Exception as e:  # paramiko/socket errors all mean "could not run"
        return CommandResult(host, -1, "", f"{type(e).__name__}: {e}")

    def exchange() -> tuple[bytes, bytes, int]:
        channel.settimeout(timeout)
        channel.exec_command(command)
        stdout, stderr = channel.makefile("rb").read(), channel.makefile_stderr("rb").read()
        return stdout, stderr, channel.recv_exit_status()

    try:
        stdout, stderr, exited = _within(exchange, timeout, channel.close, f"a command on {host}")
    except RemoteError as e:
        return CommandResult(host, -1, "", str(e))
    finally:
        with contextlib.suppress(Exception):
            channel.close()
    return CommandResult(host, exited, stdout.decode(errors="replace"), stderr.decode(errors="replace"))


@dataclass
class Held:
    """A command left running on a host, over a connection of its own, until let go: it
    reads its stdin, which ends when ``let_go`` closes it or when the connection dies."""

    host: str  # inventory name
    first_line: str  # what the command printed first (its stderr's start when stdout was empty)
    conn: Any  # the fabric Connection
    channel: Any  # the paramiko channel the command runs in

    def let_go(self) -> None:
        """End the command's stdin and the connection; quiet when the host is gone."""
        with contextlib.suppress(Exception):
            self.channel.shutdown_write()
            self.channel.close()
        with contextlib.suppress(Exception):
            self.conn.close()


def hold(node: Node, command: str, answer_s: float) -> Held:
    """Start ``command`` on a connection of its own and return once it has printed its
    first line (within ``answer_s`` of the connection opening), leaving it running with
    its stdin open. Raises RemoteError when the host cannot be reached or does not answer
    in time. The connection sends a keepalive every 30 s: it may sit idle for hours."""
    conn = connection(node)
    try:
        conn.open()
        transport = conn.client.get_transport()
        transport.set_keepalive(30)
        channel = transport.open_session(timeout=answer_s)
        channel.settimeout(answer_s)
        channel.exec_command(command)
        data = b""
        while b"\n" not in data and len(data) < 4096:
            chunk = channel.recv(512)
            if not chunk:
                break
            data += chunk
        line = data.split(b"\n", 1)[0].decode(errors="replace").strip()
        if not line:
            line = channel.makefile_stderr("rb").read(500).decode(errors="replace").strip()
        channel.settimeout(None)
    except Exception as e:  # paramiko/socket errors and the deadline alike
        conn.close()
        raise RemoteError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from e
    return Held(node.name, line, conn, channel)


@dataclass
class Forward:
    """A port on a node's loopback whose connections come back here (``ssh -R``)."""

    host: str  # inventory name
    port: int  # the node's port on 127.0.0.1, chosen by its sshd
    close: Callable[[], None]  # stop listening there and end the connections carried


def forward_here(conn: Any, host: str, local_port: int, timeout: float = 30) -> Forward:
    """Ask the node's sshd to listen on 127.0.0.1 (a port it picks) and carry each
    connection made to it over this SSH connection to 127.0.0.1:``local_port`` here.

    Used for a service that must outlive any node (an elastic run's rendezvous store):
    it runs beside the controller, and a node reaches it through the connection the run
    holds anyway, with nothing opened on the cluster network. Raises RemoteError when the
    node cannot be reached, its sshd refuses forwarding (AllowTcpForwarding no/local), or
    does not answer within ``timeout``."""
    tunnels: list[Any] = []
    carry = _carrier(local_port, timeout, tunnels)

    def ask() -> int:
        if not conn.is_connected:
            conn.open()
        transport = conn.client.get_transport()
        transport.set_keepalive(15)
        return int(transport.request_port_forward("127.0.0.1", 0, handler=carry) or 0)

    # paramiko waits for sshd's answer for as long as the transport lives.
    port = _within(ask, timeout, on_timeout=conn.close, what="the forwarding request")
    if not port:
        raise RemoteError("sshd did not say which port it listens on")

    def close() -> None:
        # No cancel-tcpip-forward: paramiko would wait for a node that may be gone; the
        # listening port ends with the connection, which the run closes after this.
        for t in tunnels:
            t.finished.set()

    return Forward(host, port, close)


def _carrier(local_port: int, timeout: float, tunnels: list[Any]) -> Callable[[Any, Any, Any], None]:
    """paramiko's handler for a forwarded connection: a tunnel to 127.0.0.1:local_port."""
    import socket

    from fabric.tunnels import Tunnel

    def carry(channel: Any, origin: Any, server: Any) -> None:
        # Called on paramiko's transport thread, once per connection made on the node.
        try:
            sock = socket.create_connection(("127.0.0.1", local_port), timeout=timeout)
        except OSError:
            channel.close()
            return
        sock.settimeout(None)
        tunnel = Tunnel(channel=channel, sock=sock, finished=threading.Event())
        tunnel.daemon = True
        tunnel.start()
        tunnels.append(tunnel)

    return carry


def _within(func: Callable[[], T], timeout: float, on_timeout: Callable[[], Any], what: str) -> T:
    """func() in a thread, given ``timeout`` seconds; then on_timeout() (which must end
    the wait, e.g. close the connection) and RemoteError. Its own errors become
    RemoteError too."""
    answer: list[Any] = []

    def call() -> None:
        try:
            answer.append((True, func()))
        except Exception as e:  # paramiko's SSHException when sshd says no; socket errors
            answer.append((False, e))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout)
    if not answer:
        with contextlib.suppress(Exception):
            on_timeout()
        raise RemoteError(f"no answer to {what} within {timeout:g} s")
    ok, value = answer[0]
    if not ok:
        raise RemoteError(f"{type(value).__name__}: {value}" if str(value) else type(value).__name__) from value
    return value  # type: ignore[no-any-return]


HTTP_MAX_BYTES = 64 * 2**20  # an answer past this is refused, not read into memory


@dataclass(frozen=True)
class HttpAnswer:
    status: int  # the HTTP status code
    body: bytes


def http_get(conn: Any, host: str, address: str, port: int, path: str, timeout: float = 20) -> HttpAnswer:
    """GET ``path`` from ``address:port`` as the node sees it, carried over the node's SSH
    connection (a direct-tcpip channel, as ``ssh -L`` opens): a service bound to the
    node's cluster address is reached from here with no port opened on this machine or
    the node. HTTP/1.0, so the answer ends when the node closes the stream. The whole
    exchange has ``timeout``; an answer over HTTP_MAX_BYTES is refused. Raises RemoteError
    naming ``host`` when the node cannot be reached, nothing listens there, or the answer
    is late or not HTTP."""
    if "\r" in path or "\n" in path or not path.startswith("/"):
        raise ValueError(f"not a request path: {path!r}")

    opened: list[Any] = []  # the channel, for the deadline to close: the wait ends with it

    def ask() -> bytes:
        if not conn.is_connected:
            conn.open()
        channel = conn.client.get_transport().open_channel(
            "direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout
        )
        opened.append(channel)
        try:
            channel.settimeout(timeout)
            channel.sendall(f"GET {path} HTTP/1.0\r\nHost: {address}:{port}\r\nConnection: close\r\n\r\n".encode())
            chunks, size = [], 0
            while chunk := channel.recv(65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > HTTP_MAX_BYTES:
                    raise RemoteError(f"the answer is over {HTTP_MAX_BYTES // 2**20} MiB")
            return b"".join(chunks)
        finally:
            channel.close()

    where = f"{host} ({address}:{port})"
    try:
        raw = _within(ask, timeout, on_timeout=lambda: [c.close() for c in opened], what=f"GET {path}")
    except RemoteError as e:
        raise RemoteError(f"{where}: {e}") from e
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise RemoteError(f"{where}: not an HTTP answer ({status_line[:80]!r})")
    return HttpAnswer(int(parts[1]), body)
