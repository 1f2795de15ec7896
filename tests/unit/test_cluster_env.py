"""The cluster interface every job sees (rules/cluster_env): found from the node's own
`ip -j addr`, written as /etc/environment lines, and set per node by Slurm's TaskProlog."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.facts.nics import parse_ip_addr
from provision.rules import cluster_env, slurm

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ip-j-addr-and-speeds_debian12-testbed-vm.txt"


def _nics():
    text = FIXTURE.read_text()
    return parse_ip_addr(text.split("--- speeds ---")[0])


def test_the_interface_holding_the_cluster_address_is_found_in_captured_ip_output():
    nics = _nics()
    held = {a.split("/")[0]: n.name for n in nics for a in n.addresses}
    address, name = next((a, n) for a, n in held.items() if a.startswith("10."))
    assert cluster_env.interface_of(address, nics) == name


def test_an_address_no_interface_holds_or_a_dns_name_has_no_interface():
    assert cluster_env.interface_of("10.255.255.254", _nics()) is None
    assert cluster_env.interface_of("node1.example", _nics()) is None


def test_a_hostile_interface_name_from_the_host_is_never_returned():
    from provision.facts.nics import Nic

    bad = Nic("eth1\nLD_PRELOAD=/x", None, "UP", 1500, ("10.0.0.5/24",), None, "ether")
    assert cluster_env.interface_of("10.0.0.5", [bad]) is None
    with pytest.raises(ValueError, match="not an interface name"):
        cluster_env.environment_lines("eth1 x")


def test_environment_lines_set_both_socket_variables_and_provisions_record():
    assert cluster_env.environment_lines("eth1") == {
        "NCCL_SOCKET_IFNAME": "NCCL_SOCKET_IFNAME=eth1",
        "GLOO_SOCKET_IFNAME": "GLOO_SOCKET_IFNAME=eth1",
        "PROVISION_CLUSTER_IFNAME": "PROVISION_CLUSTER_IFNAME=eth1",
    }


def test_slurm_conf_ends_a_step_on_a_failed_task_and_runs_the_task_prolog():
    conf = slurm.ClusterConf("lab", "head1", "10.0.0.1", "main", "01:00:00")
    text = slurm.slurm_conf_with_lines(conf, ["NodeName=node1 CPUs=2"], ["node1"])
    assert "KillOnBadExit=1\n" in text
    assert f"TaskProlog={cluster_env.TASK_PROLOG}\n" in text
