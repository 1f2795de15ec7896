"""Bad inventories: one clear line per problem (file, host, key), exit code 2, no traceback,
and no host contacted."""

from __future__ import annotations

import socket
import textwrap
import threading
from pathlib import Path

import pytest

from provision import inventory
from provision.errors import InputError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(InputError) as info:
        inventory.load(path)
    return [str(p) for p in info.value.problems]


def test_loads_a_plain_pyinfra_inventory_with_groups_and_group_data(tmp_path):
    inv = write(
        tmp_path / "inv.py",
        """
        gpu_nodes = [("gpu1", {"ssh_hostname": "192.0.2.1", "cluster_address": "10.0.0.1"}),
                     ("gpu2", {"ssh_hostname": "192.0.2.2", "cluster_address": "10.0.0.2"})]
        storage = (["gpu1"], {"min_root_free_gb": 5})
    """,
    )
    write(tmp_path / "group_data" / "all.py", "ssh_user = 'ubuntu'\n_sudo = True\ndata_mount = '/scratch'\n")
    cluster = inventory.load(inv)
    gpu1 = cluster.node("gpu1")
    assert [n.name for n in cluster.nodes] == ["gpu1", "gpu2"]
    assert gpu1.ssh.hostname == "192.0.2.1"
    assert gpu1.ssh.user == "ubuntu"
    assert gpu1.cluster_address == "10.0.0.1"
    assert gpu1.has_role("storage")
    assert gpu1.has_role("gpu_nodes")
    assert gpu1.settings.min_root_free_gb == 5
    assert cluster.node("gpu2").settings.min_root_free_gb == 20
    assert gpu1.settings.data_mount == "/scratch"
    assert cluster.storage_node().name == "gpu1"


def test_cluster_address_defaults_to_the_ssh_address(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = [('n1', {'ssh_hostname': '192.0.2.9'})]\n")
    assert inventory.load(inv).node("n1").cluster_address == "192.0.2.9"


def test_host_keys_are_checked_by_default(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = ['n1']\n")
    assert inventory.load(inv).node("n1").ssh.strict_host_key_checking == "yes"


def test_missing_file_is_named(tmp_path):
    (line,) = problems_of(tmp_path / "nope.py")
    assert "nope.py" in line
    assert "does not exist" in line


def test_syntax_error_names_file_and_line(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = ['a'\nother = 1\n")
    (line,) = problems_of(inv)
    assert f"{inv}:1" in line
    assert "syntax error" in line


def test_inventory_that_raises_names_file_line_and_exception(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = ['a']\nimport os\nos.environ['PROVISION_NO_SUCH_VAR']\n")
    (line,) = problems_of(inv)
    assert f"{inv}:3" in line
    assert "KeyError" in line


def test_unknown_key_names_file_host_key_and_a_suggestion(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = [('n1', {'data_mout': '/data'})]\n")
    (line,) = problems_of(inv)
    assert f"{inv}: host n1: key data_mout" in line
    assert "unknown setting" in line
    assert "data_mount" in line


def test_known_pyinfra_keys_and_global_arguments_load(tmp_path):
    inv = write(
        tmp_path / "inv.py",
        "nodes = [('n1', {'ssh_user': 'ubuntu', 'ssh_connect_retries': 2, "
        "'ssh_strict_host_key_checking': 'accept-new', '_sudo': True})]\n",
    )
    assert inventory.load(inv).node("n1").ssh.strict_host_key_checking == "accept-new"


def test_unknown_key_in_group_data_names_that_file(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = ['n1']\n")
    group_file = write(tmp_path / "group_data" / "all.py", "nvidia_branch = '580'\n")
    (line,) = problems_of(inv)
    assert str(group_file) in line
    assert "nvidia_branch" in line
    assert "nvidia_driver_branch" in line


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("raid_level", "'0'", "is not 0 or 1"),
        ("min_root_free_gb", "True", "is not int"),
        ("ssh_port", "'22'", "is not a port number"),
        ("cluster_cidr", "'10.0.0.0/33'", "not a network in CIDR form"),
        ("cluster_address", "'node1'", "not an IP address"),
        ("data_disks", "['/dev/sdb']", "kernel name that can change"),
        ("venv_path", "'venv'", "absolute path"),
        ("nvidia", "'yes'", "is not 'auto' or 'force' or 'skip'"),
        # pyinfra's own keys too: pyinfra would silently ignore a typo in them.
        ("ssh_hostnme", "'10.0.0.1'", "did you mean ssh_hostname?"),
        ("_sduo", "True", "did you mean _sudo?"),
        ("ssh_user", "5", "5 is not a POSIX user name"),
        ("ssh_strict_host_key_checking", "'bogus'", "is not one of yes, accept-new, no, off"),
    ],
)
def test_wrong_type_or_value_names_the_key(tmp_path, key, value, expected):
    inv = write(tmp_path / "inv.py", f"nodes = [('n1', {{'{key}': {value}}})]\n")
    (line,) = problems_of(inv)
    assert f"host n1: key {key}" in line
    assert expected in line


def test_missing_ssh_key_file(tmp_path):
    inv = write(tmp_path / "inv.py", f"nodes = [('n1', {{'ssh_key': '{tmp_path}/id_nope'}})]\n")
    (line,) = problems_of(inv)
    assert "key ssh_key" in line
    assert "id_nope does not exist" in line


def test_duplicate_host_in_a_group(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = [('n1', {'ssh_hostname': '192.0.2.1'}), 'n1']\n")
    assert any("group nodes: duplicate host n1" in p for p in problems_of(inv))


def test_duplicate_cluster_address(tmp_path):
    inv = write(
        tmp_path / "inv.py",
        """
        nodes = [("n1", {"ssh_hostname": "192.0.2.1", "cluster_address": "10.0.0.1"}),
                 ("n2", {"ssh_hostname": "192.0.2.2", "cluster_address": "10.0.0.1"})]
    """,
    )
    (line,) = problems_of(inv)
    assert "host n2" in line
    assert "duplicate cluster address 10.0.0.1" in line
    assert "n1" in line


def test_duplicate_ssh_address(tmp_path):
    inv = write(
        tmp_path / "inv.py",
        """
        nodes = [("n1", {"ssh_hostname": "192.0.2.1", "cluster_address": "10.0.0.1"}),
                 ("n2", {"ssh_hostname": "192.0.2.1", "cluster_address": "10.0.0.2"})]
    """,
    )
    (line,) = problems_of(inv)
    assert "duplicate SSH address 192.0.2.1:22" in line


def test_a_cluster_cidr_must_hold_every_cluster_address(tmp_path):
    # Checked once per network, not per node of per node; each node whose cidr misses an
    # address is named, with the addresses outside.
    inv = write(
        tmp_path / "inv.py",
        """
        nodes = [("a", {"cluster_address": "10.0.0.1", "cluster_cidr": "10.0.0.0/24"}),
                 ("b", {"cluster_address": "10.0.1.2", "cluster_cidr": "10.0.0.0/24"}),
                 ("c", {"cluster_address": "10.0.0.3", "cluster_cidr": "10.0.0.0/16"}),
                 ("d", {"cluster_address": "10.0.0.4"})]
    """,
    )
    problems = problems_of(inv)
    assert len(problems) == 2, problems
    for node in ("a", "b"):
        (line,) = [p for p in problems if f"host {node}" in p]
        assert "10.0.0.0/24 does not contain the cluster address of b" in line, line
    inv.write_text(inv.read_text().replace("10.0.0.0/24", "10.0.0.0/16"))
    assert [n.name for n in inventory.load(inv).nodes] == ["a", "b", "c", "d"]


def test_empty_inventory(tmp_path):
    inv = write(tmp_path / "inv.py", "# nothing here\n_x = 1\n")
    (line,) = problems_of(inv)
    assert "no hosts" in line


def test_every_problem_is_reported_at_once(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = [('n1', {'bogus': 1, 'raid_level': 7})]\n")
    assert len(problems_of(inv)) == 2


def test_nfs_server_must_be_a_host_of_the_inventory(tmp_path):
    inv = write(tmp_path / "inv.py", "nodes = [('n1', {'nfs_server': 'n9'})]\n")
    (line,) = problems_of(inv)
    assert "nfs_server" in line
    assert "'n9' is not a host" in line


def test_example_inventory_loads():
    from provision.resources import inventories_dir

    cluster = inventory.load(inventories_dir() / "example.py")
    assert {n.name for n in cluster.with_role("gpu_nodes")} == {"gpu01", "gpu02"}


class ConnectionCounter:
    """A TCP listener on loopback that counts connection attempts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.count += 1
                conn.close()
            except OSError:
                continue

    def close(self):
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.close()
