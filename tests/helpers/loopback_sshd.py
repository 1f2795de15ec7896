"""A real sshd on 127.0.0.1 for integration tests: its own host key, an authorized key,
and a known_hosts file that pins the host key, so strict host-key checking stays on."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LoopbackSshd:
    port: int  # where sshd listens on 127.0.0.1
    key: Path  # client private key authorized for root
    known_hosts: Path  # pins the server's host key as [127.0.0.1]:port
    process: subprocess.Popen  # the sshd, stopped by pid at teardown

    def host_data(self) -> dict:
        return {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": self.port,
            "ssh_user": "root",
            "ssh_key": str(self.key),
            "ssh_known_hosts_file": str(self.known_hosts),
        }

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(tmp: Path) -> LoopbackSshd:
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o700)
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True)
    (tmp / "authorized_keys").write_text((tmp / "client_key.pub").read_text())
    os.chmod(tmp / "authorized_keys", 0o600)
    port = free_port()
    host_pub = (tmp / "host_key.pub").read_text().split()
    (tmp / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    config = tmp / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp / 'host_key'}\n"
        f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nUsePAM no\nStrictModes no\n"
        f"PidFile {tmp / 'sshd.pid'}\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    with open(tmp / "sshd.log", "w") as log:  # sshd keeps its own copy of the descriptor
        process = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stderr=log)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return LoopbackSshd(port, tmp / "client_key", tmp / "known_hosts", process)
