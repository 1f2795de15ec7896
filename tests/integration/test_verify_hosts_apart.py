"""`provision verify` checks each host in its own pytest process, side by side and under its
own deadline: a host that hangs is reported as timed out, and the others keep their results."""

from __future__ import annotations

import time

from provision import verify
from provision.inventory import Cluster, Node, SshTarget
from provision.settings import Settings

SUITE = """
import os, time

def test_this_host(host):
    name = host.backend.get_hostname()
    if name == "hung":
        time.sleep(120)
    assert name != "broken"
"""


def _node(name: str) -> Node:
    ssh = SshTarget("127.0.0.1", 22, "root", None, None, "yes")  # never dialled: the suite uses no command
    return Node(name=name, ssh=ssh, groups=(), settings=Settings())


def test_a_hung_host_times_out_and_the_others_keep_their_results(tmp_path, monkeypatch) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_hosts.py").write_text(SUITE)
    monkeypatch.setattr(verify, "SUITE", suite)
    cluster = Cluster(tmp_path / "inv.py", tuple(_node(n) for n in ("good", "hung", "broken")))

    started = time.monotonic()
    result = verify.run(cluster, str(tmp_path / "work"), extra=["-v"], timeout_s=20)
    assert time.monotonic() - started < 120  # the hung host was stopped at its deadline, not slept out

    assert result.exit_code == verify.INTERRUPTED  # a host not checked outranks a failed check
    sections = dict(part.split("\n", 1) for part in result.output.split(verify.HOST_HEADER)[1:])
    assert "1 passed" in sections["good"]
    assert "1 failed" in sections["broken"]
    assert "hung timed out after 20 s" in sections["hung"]
