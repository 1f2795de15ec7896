"""The Slurm roles: which host is the controller (and why), which hosts compute, and a head
group of more than one host refused as bad input."""

from __future__ import annotations

from provision import inventory
from tests.unit.test_inventory import problems_of, write

HOSTS = """
nodes = [("n1", {"ssh_hostname": "192.0.2.1"}), ("n2", {"ssh_hostname": "192.0.2.2"}),
         ("n3", {"ssh_hostname": "192.0.2.3", "slurm_head_computes": False})]
"""


def test_the_head_group_names_the_controller(tmp_path):
    cluster = inventory.load(write(tmp_path / "inv.py", HOSTS + "head = ['n2']\nstorage = ['n1']\n"))
    assert cluster.head_node()[0].name == "n2"
    assert cluster.head_node()[1] == "the head group"
    assert [n.name for n in cluster.compute_nodes()] == ["n1", "n2", "n3"]


def test_without_a_head_group_the_storage_host_then_the_first_host_is_the_controller(tmp_path):
    with_storage = inventory.load(write(tmp_path / "a.py", HOSTS + "storage = ['n3']\n"))
    assert with_storage.head_node() == (with_storage.node("n3"), "no head group: the storage host")
    # n3 said it does not compute: the head leaves the compute list, the others stay.
    assert [n.name for n in with_storage.compute_nodes()] == ["n1", "n2"]
    plain = inventory.load(write(tmp_path / "b.py", HOSTS))
    assert plain.head_node()[0].name == "n1"


def test_a_compute_group_is_the_compute_list(tmp_path):
    cluster = inventory.load(write(tmp_path / "inv.py", HOSTS + "compute = ['n2', 'n3']\n"))
    assert [n.name for n in cluster.compute_nodes()] == ["n2", "n3"]


def test_two_head_hosts_are_bad_input_with_both_named(tmp_path):
    (line,) = problems_of(write(tmp_path / "inv.py", HOSTS + "head = ['n1', 'n2']\n"))
    assert "group head" in line
    assert "2 hosts (n1, n2); Slurm has one controller" in line


def test_slurm_settings_are_checked_at_load(tmp_path):
    inv = write(
        tmp_path / "inv.py",
        """
        nodes = [("n1", {"ssh_hostname": "192.0.2.1", "slurm_partition": "Main Partition",
                         "slurm_default_time": "1 hour", "slurm_cluster_name": "x" * 41})]
        """,
    )
    lines = problems_of(inv)
    assert any("slurm_partition" in line and "is not a Slurm name" in line for line in lines)
    assert any("slurm_default_time" in line and "is not a Slurm time" in line for line in lines)
    assert any("slurm_cluster_name" in line for line in lines)
