"""The exact shell lines validate sends to nodes (pure builders)."""

from __future__ import annotations

import base64
import re

from provision.inventory import Node, SshTarget
from provision.settings import Settings
from provision.validate import controller, netrun


def node(name: str = "gpu01", address: str = "10.0.0.11", **settings) -> Node:
    return Node(
        name,
        SshTarget("192.168.1.11", 22, "root", None, None, "yes"),
        ("nodes",),
        Settings(cluster_address=address, **settings),
    )


def test_agent_runs_with_the_venv_python_and_falls_back_to_python3():
    plan = controller.Plan("quick", frozenset({"cpu", "disk", "net"}))
    cmd = controller.agent_command(node(venv_path="/opt/v", data_mount="/data"), "/tmp/a.py", plan)
    assert cmd.startswith('P=/opt/v/bin/python; [ -x "$P" ] || P=python3; ')
    assert "--only cpu,disk " in cmd  # net runs from the controller, not the agent
    assert "--data-dir /data" in cmd
    assert "--mode quick" in cmd
    assert re.search(r"timeout \d+ \"\$P\" /tmp/a.py", cmd)


def test_upload_writes_the_agent_byte_for_byte():
    cmd = controller.upload_command("/tmp/x.py")
    blob = re.search(r"printf %s (\S+) \| base64 -d > /tmp/x.py", cmd).group(1)
    assert base64.b64decode(blob) == controller.AGENT_PATH.read_bytes()


def test_iperf3_runs_on_cluster_addresses_bounded_in_time():
    server = netrun.server_command("10.0.0.12", 5301, 3)
    assert "iperf3 -s -1 -B 10.0.0.12 -p 5301" in server
    assert "timeout 33" in server
    assert "</dev/null" in server
    assert server.endswith("& echo $!")
    client = netrun.client_command("10.0.0.11", "10.0.0.12", 5301, 3)
    assert "iperf3 -c 10.0.0.12 -B 10.0.0.11 -p 5301 -P 4 -t 3 -J" in client
    assert "timeout 23" in client


def test_torchrun_per_host_uses_cluster_network_and_can_be_torn_down_by_pid():
    master = node("gpu01", "10.0.0.11")
    cmd = netrun.torchrun_command(node("gpu02", "10.0.0.12"), 1, 2, master, "/tmp/a.py", 0, "tok")
    assert "--nnodes 2 --node-rank 1 --nproc-per-node 1" in cmd
    assert "--master-addr 10.0.0.11 --master-port 29511" in cmd
    assert "--backend gloo" in cmd
    assert "allreduce-worker" in cmd
    assert "10[.]0[.]0[.]12" in cmd  # interface found by the node's own cluster address
    assert "setsid timeout" in cmd
    assert cmd.startswith('D=/tmp/provision-allreduce-tok; umask 077; mkdir -m 0700 -- "$D" || exit 1; ')
    assert 'echo $! > "$D/pid"' in cmd
    assert "PROVISION_ALLREDUCE=tok setsid timeout" in cmd
    gpu = netrun.torchrun_command(master, 0, 2, master, "/tmp/a.py", 8, "tok")
    assert "--nproc-per-node 8" in gpu
    assert "--backend nccl" in gpu


def test_allreduce_teardown_signals_only_a_marked_pid_above_1_from_its_own_private_directory():
    cmd = netrun.teardown_command("gpu02-tok")
    assert "kill -- -$(cat" not in cmd  # never the group named by a file as it stands
    # `kill -s TERM --`: dash (Debian's sh) refuses `kill -TERM -- -PID` with "Illegal number".
    guard, _, kill = cmd.partition("kill -s TERM")
    assert '[ -d "$D" ] && [ ! -L "$D" ] && [ -O "$D" ]' in guard  # made by us, not a link
    assert 'case "$p" in ""|*[!0-9]*) p=0;; esac' in guard  # garbage and negatives read as 0
    assert '[ "$p" -gt 1 ]' in guard  # 0 and 1 never signalled
    assert "grep -qxF -- PROVISION_ALLREDUCE=gpu02-tok" in guard  # the process is ours
    assert kill.startswith(' -- "-$p"')
