"""known_hosts as both SSH seams read it (provision.hostkeys), on text files: no sockets."""

from __future__ import annotations

import base64

import pytest
from paramiko.ssh_exception import SSHException

from provision import hostkeys

# Two well-formed ed25519 public keys (32 bytes each) in OpenSSH's wire format.
A, B = (base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes([n]) * 32).decode() for n in (1, 2))


def test_lines_after_markers_and_bad_lines_are_read_and_revoked_keys_left_out(tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(
        f"@cert-authority *.example.com ssh-ed25519 {A}\n"
        "node0 ssh-ed25519 not-base64!\n"
        f"@revoked * ssh-ed25519 {B}\n"
        f"# a comment\nnode1 ssh-ed25519 {A}\nnode2 ssh-ed25519 {B}\n"
    )
    keys = hostkeys.load(str(known), str(tmp_path / "missing"))
    assert keys.lookup("node1")["ssh-ed25519"].get_base64() == A
    assert keys.lookup("node2") is None  # its only key is revoked
    assert keys.revoked == frozenset({B})


class _Key:
    def __init__(self, b64: str):
        self.b64 = b64

    def get_base64(self) -> str:
        return self.b64

    def get_name(self) -> str:
        return "ssh-ed25519"


class _Client:
    def __init__(self, keys):
        self.keys = keys

    def get_host_keys(self):
        return self.keys


@pytest.mark.parametrize("mode", ["yes", "accept-new", "no"])
def test_a_revoked_key_is_refused_under_every_checking_mode(tmp_path, mode):
    known = tmp_path / "known_hosts"
    known.write_text(f"@revoked * ssh-ed25519 {B}\n")
    client = _Client(hostkeys.load(str(known)))
    with pytest.raises(SSHException, match="marked @revoked"):
        hostkeys.policy(mode, str(known)).missing_host_key(client, "node1", _Key(B))
    assert known.read_text() == f"@revoked * ssh-ed25519 {B}\n"
