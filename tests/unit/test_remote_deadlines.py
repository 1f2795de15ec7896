"""The fabric side's deadlines come from the node's own settings, like pyinfra's."""

from __future__ import annotations

from provision import remote
from provision.inventory import Node, SshTarget
from provision.settings import Settings

SSH = SshTarget("10.0.0.9", 22, "root", None, None, "yes")


def test_a_node_is_dialled_within_its_connect_timeout_setting():
    conn = remote.connection(Node("n1", SSH, (), Settings(connect_timeout_s=7)))
    assert conn.connect_timeout == 7
    # the SSH handshake gets at least 30 s: an emulated node under load is slow to answer
    assert conn.connect_kwargs["banner_timeout"] == 30
    assert conn.connect_kwargs["auth_timeout"] == 30


def test_a_long_connect_timeout_stretches_the_handshake_with_it():
    conn = remote.connection(Node("n1", SSH, (), Settings(connect_timeout_s=120)))
    assert (conn.connect_timeout, conn.connect_kwargs["banner_timeout"]) == (120, 120)


def test_a_bare_target_and_an_explicit_deadline():
    assert remote.connection(SSH).connect_timeout == remote.CONNECT_TIMEOUT_S
    assert remote.connection(SSH, connect_timeout=5).connect_timeout == 5
