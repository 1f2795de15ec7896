"""--limit: names, globs and groups select hosts in inventory order; a pattern that matches
nothing, or that is not a name, glob or group, is bad input; the limited cluster still knows
every host for what the cluster shares (/etc/hosts, keys, the storage host)."""

from __future__ import annotations

import pytest

from provision import inventory, limit
from provision.errors import InputError

INVENTORY = """
storage = [('store1', {'ssh_hostname': '192.0.2.10'})]
gpus = [
    ('gpu-01', {'ssh_hostname': '192.0.2.11'}),
    ('gpu-02', {'ssh_hostname': '192.0.2.12'}),
    ('gpu-10', {'ssh_hostname': '192.0.2.13'}),
]
"""


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "inv.py"
    path.write_text(INVENTORY)
    return inventory.load(path)


def names(nodes) -> list[str]:
    return [n.name for n in nodes]


def test_no_limit_is_every_host_and_the_same_cluster(cluster):
    assert names(limit.select(cluster, None)) == names(cluster.nodes)
    assert limit.apply(cluster, "") is cluster


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gpu-02", ["gpu-02"]),
        ("gpu-0*", ["gpu-01", "gpu-02"]),
        ("gpu-?0", ["gpu-10"]),
        ("gpu-0[2-9],store1", ["store1", "gpu-02"]),  # inventory order, not the limit's
        ("storage", ["store1"]),  # a group
        ("gpu-01, gpus", ["gpu-01", "gpu-02", "gpu-10"]),  # overlap counted once
    ],
)
def test_names_globs_and_groups_select_in_inventory_order(cluster, text, want):
    assert names(limit.select(cluster, text)) == want


def test_every_pattern_that_matches_nothing_is_named_with_the_hosts_and_groups(cluster):
    with pytest.raises(InputError) as caught:
        limit.select(cluster, "gpu-01,gpu-3*,racks")
    problems = caught.value.problems
    assert [p.where for p in problems] == ["--limit gpu-3*", "--limit racks"]
    assert all("matches no host or group" in p.what for p in problems)
    assert "gpu-01" in problems[0].fix
    assert "storage" in problems[0].fix


@pytest.mark.parametrize("bad", ["gpu 01", "a/b", "$(reboot)", "node1;ls", "x" * 254])
def test_a_pattern_that_is_no_name_glob_or_group_is_refused_as_typed(cluster, bad):
    with pytest.raises(InputError) as caught:
        limit.select(cluster, bad)
    assert "not a host name, glob or group" in caught.value.problems[0].what


def test_the_limited_cluster_contacts_its_hosts_and_still_knows_every_host(cluster):
    part = limit.apply(cluster, "gpu-02")
    assert names(part.nodes) == ["gpu-02"]
    assert names(part.all_nodes) == ["store1", "gpu-01", "gpu-02", "gpu-10"]
    assert part.storage_node().name == "store1"  # the NFS server, though not contacted
    assert part.node("gpu-10").ssh.hostname == "192.0.2.13"
    assert names(limit.apply(part, "gpu-0*").nodes) == ["gpu-02"]  # a limit of a limit narrows


def test_a_fleet_sized_error_names_a_few_hosts_not_all(tmp_path):
    path = tmp_path / "fleet.py"
    hosts = [(f"n{i:04d}", {"ssh_hostname": f"10.0.{i // 250}.{i % 250 + 1}"}) for i in range(1000)]
    path.write_text(f"nodes = {hosts!r}\n")
    with pytest.raises(InputError) as caught:
        limit.select(inventory.load(path), "gpu*")
    fix = caught.value.problems[0].fix
    assert "(1000 in all)" in fix
    assert "n0999" not in fix


@pytest.mark.parametrize("command", ["facts", "status", "up", "plan", "verify", "validate", "train"])
def test_every_command_that_contacts_hosts_refuses_a_limit_matching_nothing_before_any_host(cli, tmp_path, command):
    # The hosts are TEST-NET addresses: a command that tried to contact one would hang or
    # fail on the connection, not exit 2 with the limit's message at once.
    path = tmp_path / "inv.py"
    path.write_text(INVENTORY)
    result = cli(command, str(path), "--limit", "gpu-9*")
    assert result.code == 2, result.err
    assert "error: --limit gpu-9*: matches no host or group of the inventory" in result.err
    assert "Traceback" not in result.err


@pytest.mark.parametrize("text", ["", ",", " , "])
def test_a_limit_given_empty_is_bad_input_not_every_host(cluster, text):
    # A script's unset variable (--limit "$HOSTS") would have run on the whole fleet.
    with pytest.raises(InputError, match="names no host, glob or group"):
        limit.select(cluster, text)
    assert names(limit.select(cluster, None)) == ["store1", "gpu-01", "gpu-02", "gpu-10"]


@pytest.mark.parametrize("text", ["", ","])
def test_only_or_skip_given_empty_is_bad_input_not_every_step(text):
    from provision.up import pipeline

    for option in ("only", "skip"):
        with pytest.raises(InputError, match="names no step"):
            pipeline.select(**{option: text})
