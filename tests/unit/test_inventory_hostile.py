"""Hostile inventories found by an audit (session 49): values that Python's own parsers
take but that would have written lines of their own into a node's files or commands, and
inventories whose groups disagree. Each is refused at load, with one line naming the key,
before any host is contacted (load reads no network)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from provision import inventory
from provision.errors import InputError

BASE = {"ssh_hostname": "192.0.2.1", "cluster_address": "10.0.0.1"}
OTHER = {"ssh_hostname": "192.0.2.2", "cluster_address": "10.0.0.2"}


def problems(tmp_path: Path, text: str, all_py: str | None = None) -> list[str]:
    inv = tmp_path / "inv.py"
    inv.write_text(textwrap.dedent(text))
    if all_py is not None:
        (tmp_path / "group_data").mkdir(exist_ok=True)
        (tmp_path / "group_data" / "all.py").write_text(all_py)
    with pytest.raises(InputError) as info:
        inventory.load(inv)
    return [str(p) for p in info.value.problems]


def two(first: dict, second: dict | None = None, name1: str = "gpu01", name2: str = "gpu02") -> str:
    return f"nodes = [({name1!r}, {first!r}), ({name2!r}, {second or OTHER!r})]\n"


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        # ipaddress takes an IPv6 zone of any characters: newlines would be new lines in
        # /etc/hosts, chrony's sources and exports
        ("cluster_address", "fe80::1%x\n10.0.0.9 evil", "IPv6 zone"),
        ("ssh_hostname", "::1%lo\nProxyCommand touch pwn", "IPv6 zone"),
        ("ssh_hostname", "gpu01\nProxyCommand touch pwn", "is not an RFC 1123 host name"),
        ("ntp_servers", ["fe80::1%x\nserver evil iburst"], "IPv6 zone"),
        ("cluster_cidr", "fd00::%x y/64", "IPv6 zone"),
        ("ssh_hostname", True, "is not an IP address"),
        ("ssh_hostname", 2130706433, "is not an IP address"),
        ("cluster_address", "0.0.0.0", "not a host's address"),
        ("cluster_address", "224.0.0.5", "not a host's address"),
        ("ntp_servers", ["0.0.0.0"], "not a host's address"),
        ("slurm_default_time", "\u0661\u0662:\u0660\u0660:\u0660\u0660", "is not a Slurm time"),
        (
            "nfs_export_options",
            "rw,sync,all_squash,anonuid=0,anongid=0,no_subtree_check",
            "to root or a system account on the share",
        ),
        ("backup_repository", "sftp:-oProxyCommand=/tmp/x:/repo", "starts with '-'"),
        ("backup_repository", "/etc", "system directory"),
        ("backup_repository", "/", "system directory"),
        ("backup_repository", "/data/../etc", "normalised"),
        ("training_user", "root", "not an unprivileged account"),
        ("train_master_port", 22, "1024"),
        # pyinfra's global arguments and connector data, typed
        ("_shell_executable", "sh -c id;", "is not a program name or path"),
        ("_sudo", "false", "is not a bool"),
        ("_timeout", -5, "1 or more"),
        ("ssh_connect_retries", "x", "is not a int"),
        ("ssh_paramiko_connect_kwargs", {"hostname": "10.0.0.1"}, "paramiko options other than"),
        ("_ignore_errors", True, "an argument of single operations"),
        ("winrm_username", ["x"], "over SSH only"),
    ],
)
def test_a_hostile_value_is_refused_naming_its_key(tmp_path, key, value, said):
    found = problems(tmp_path, two({**BASE, key: value}))
    assert any(f"key {key}" in line and said in line for line in found), found


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("fe80::1%x\n10.0.0.9 evil", "RFC 1123"),
        ("10.0.0.5", "reads as an IP address"),
        ("123", "reads as an IP address"),
        ("localhost", "names the local machine"),
    ],
)
def test_a_host_name_that_is_not_one_machines_name_is_refused(tmp_path, name, said):
    found = problems(tmp_path, two(BASE, name1=name))
    assert any(said in line for line in found), found


def test_a_data_key_that_is_not_a_string_is_refused_without_a_traceback(tmp_path):
    found = problems(tmp_path, two({**BASE, 1: "x"}))
    assert any("key 1" in line and "unknown setting" in line for line in found), found


def test_the_training_user_is_not_the_login_user(tmp_path):
    found = problems(tmp_path, two({**BASE, "ssh_user": "ubuntu", "training_user": "ubuntu"}))
    assert any("key training_user" in line and "also ssh_user" in line for line in found), found


@pytest.mark.parametrize(
    ("first", "second", "said"),
    [
        ({**BASE, "ssh_hostname": "::1", "ssh_port": 2222}, {**OTHER, "ssh_hostname": "0:0::1", "ssh_port": 2222},
         "duplicate SSH address"),
        ({**BASE, "ssh_hostname": "127.0.0.1"}, {**OTHER, "ssh_hostname": "::ffff:127.0.0.1"}, "duplicate SSH address"),
        ({**BASE, "ssh_hostname": "gpu-a.example"}, {**OTHER, "ssh_hostname": "GPU-A.example"},
         "duplicate SSH address"),
        ({**BASE, "cluster_address": "fd00::1", "cluster_cidr": "fd00::/64"},
         {**OTHER, "cluster_address": "fd00:0::1", "cluster_cidr": "fd00::/64"}, "duplicate cluster address"),
    ],
)  # fmt: skip
def test_one_address_written_two_ways_is_a_duplicate(tmp_path, first, second, said):
    found = problems(tmp_path, two(first, second))
    assert any(said in line for line in found), found


def test_host_names_differing_in_case_are_one_name(tmp_path):
    found = problems(tmp_path, two(BASE, name2="GPU01"))
    assert any("duplicate host name" in line for line in found), found


def test_a_role_naming_a_host_the_inventory_lacks_is_a_typo(tmp_path):
    found = problems(tmp_path, two(BASE) + "storage = ['gpu09']\n")
    assert any("gpu09 is named only here" in line for line in found), found


def test_a_hosts_data_given_twice_must_agree(tmp_path):
    found = problems(tmp_path, two({**BASE, "ssh_port": 1}) + f"storage = [('gpu01', {{**{BASE!r}, 'ssh_port': 3}})]\n")
    assert any("key 'ssh_port'" in line and "in group storage" in line for line in found), found


@pytest.mark.parametrize("value", ["None", "1", "(n for n in ['gpu01'])"])
def test_a_top_level_name_that_is_not_a_list_of_hosts_is_refused(tmp_path, value):
    found = problems(tmp_path, two(BASE) + f"storage = {value}\n")
    assert any("group storage" in line and "not a list of hosts" in line for line in found), found


def test_hosts_naming_two_nfs_servers_are_refused(tmp_path):
    found = problems(tmp_path, two({**BASE, "nfs_server": "gpu01"}, {**OTHER, "nfs_server": "gpu02"}))
    assert any("different NFS servers" in line for line in found), found


def test_a_bad_port_in_group_data_is_refused_where_it_is_written(tmp_path):
    found = problems(tmp_path, two(BASE), all_py="ssh_port = True\n")
    assert any("all.py: key ssh_port" in line for line in found), found


def test_an_ssh_key_path_with_a_newline_is_said_escaped(tmp_path):
    found = problems(tmp_path, two({**BASE, "ssh_key": "/tmp/a\nb"}))
    assert all("\n" not in line for line in found), found


@pytest.mark.parametrize(
    ("data", "key", "said"),
    [
        ({"venv_path": "/opt/a:b"}, "venv_path", "splits PATH"),
        ({"venv_path": "/data/venv"}, "venv_path", "on or holds data_mount"),
        ({"venv_path": "/shared/datasets/venv"}, "venv_path", "on or holds nfs_mount_root"),
        ({"nfs_mount_root": "/data"}, "nfs_mount_root", "on or holds data_mount"),
        ({"nfs_export_root": "/srv/x", "nfs_mount_root": "/srv/x/y"}, "nfs_mount_root", "nfs_export_root"),
    ],
)
def test_directories_that_would_land_on_each_other_are_refused(tmp_path, data, key, said):
    found = problems(tmp_path, two({**BASE, **data}))
    assert any(f"key {key}" in line and said in line for line in found), found


def test_directories_are_judged_on_a_hosts_merged_data_not_one_layer_at_a_time(tmp_path):
    # The venv on /data is fine once group_data moved the data volume away...
    inv = tmp_path / "inv.py"
    inv.write_text(two({**BASE, "venv_path": "/data/venv"}))
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text("data_mount = '/scratch'\n")
    assert [n.settings.venv_path for n in inventory.load(inv).nodes] == ["/data/venv", "/opt/provision/venv"]
    # ...and on /scratch it is not, though each layer alone looks right.
    found = problems(tmp_path, two({**BASE, "venv_path": "/scratch/venv"}), all_py="data_mount = '/scratch'\n")
    assert found == [
        f"{tmp_path / 'inv.py'}: host gpu01: key venv_path: '/scratch/venv' is on or holds data_mount /scratch "
        "(keep the venv on the root disk, e.g. /opt/provision/venv)"
    ], found


def test_hosts_sharing_a_groups_bad_directories_are_named_in_one_line(tmp_path):
    hosts = [(f"gpu{i:02}", {"ssh_hostname": f"192.0.2.{i}", "cluster_address": f"10.0.0.{i}"}) for i in range(1, 6)]
    found = problems(tmp_path, f"nodes = {hosts!r}\n", all_py="train_dir = '/srv/t'\nvenv_path = '/srv/t'\n")
    (line,) = [line for line in found if "key venv_path" in line]
    assert ": hosts gpu01, gpu02, gpu03 and 2 more: key venv_path: '/srv/t' is on or holds train_dir" in line, found


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("data_disks", ["-rf"], "no leading '-'"),
        ("data_disks", [".."], "no leading '-' or '.'"),
        ("data_disks", ["x/../../sda"], "has no '/'"),
        ("data_disks", ["/etc/passwd"], "neither a /dev/disk/by-id path nor a serial"),
        ("data_disks", ["/dev/disk/by-id/../../sda"], "not a disk's link in /dev/disk/by-id/"),
        ("data_disks", ["/dev/disk/by-id/-x"], "not a disk's link"),
        ("data_disks", ["S6X0001", "S6X0001"], "S6X0001 listed twice"),
        ("force_format", ["-rf"], "no leading '-'"),
        ("data_mount", "/var/lib/dpkg", "system directory"),
        ("data_mount", "/var/log/journal/x", "system directory"),
        ("venv_path", "/var/tmp/provision-train", "on or holds train_dir"),
        ("venv_path", "/var/tmp/provision-train/work/venv", "on or holds train_dir"),  # the training user's
        ("backup_schedule", "--help", "starts with '-'"),
        ("nccl_version", "1-", "is not a version number"),
        ("torch_version", "2.", "is not a version number"),
        ("nfs_export_options", "rw,sync,ro", "rw and ro contradict each other"),
        ("nfs_export_options", "async,sync,no_subtree_check,subtree_check", "sync and async; subtree_check and"),
    ],
)
def test_a_value_the_audit_found_accepted_is_refused(tmp_path, key, value, said):
    found = problems(tmp_path, two({**BASE, key: value}))
    assert any(f"key {key}" in line and said in line for line in found), found


def test_an_ipv6_cluster_address_is_refused_but_ssh_may_be_ipv6(tmp_path):
    # Also when it is only the SSH address taken as the cluster address.
    found = problems(tmp_path, two({"ssh_hostname": "2001:db8::1"}, {**OTHER, "cluster_address": "fd00::2"}))
    assert [line.split(": ", 1)[1].split(":", 1)[0] for line in found if "IPv6" in line] == [
        "host gpu01",
        "host gpu02",
    ], found
    inv = tmp_path / "inv.py"
    inv.write_text(two({"ssh_hostname": "2001:db8::1", "cluster_address": "10.0.0.1"}))
    assert inventory.load(inv).nodes[0].cluster_address == "10.0.0.1"


@pytest.mark.parametrize(("address", "said"), [("10.0.0.0", "network"), ("10.0.0.255", "broadcast")])
def test_a_networks_own_addresses_are_not_a_hosts(tmp_path, address, said):
    found = problems(tmp_path, two({**BASE, "cluster_address": address, "cluster_cidr": "10.0.0.0/24"}))
    assert any(f"{said} address of 10.0.0.0/24" in line for line in found), found
    # A /31 (RFC 3021) has no network or broadcast address: both are hosts'.
    inv = tmp_path / "p2p.py"
    inv.write_text(two({**BASE, "cluster_address": "10.0.0.0", "cluster_cidr": "10.0.0.0/31"},
                       {**OTHER, "cluster_address": "10.0.0.1", "cluster_cidr": "10.0.0.0/31"}))  # fmt: skip
    assert len(inventory.load(inv).nodes) == 2


class Expr(str):
    """A value written into the inventory as this Python expression (an int too large to
    print is made there, not here)."""

    def __repr__(self) -> str:
        return str(self)


# A second audit (session 50): values that reached root through a path someone else can
# write, service accounts, addresses the resolver reads differently, contradictions that
# `up` found only on the hosts, and values that crashed the loader.
@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("nofile_limit", 1, "is below 1024"),
        ("venv_path", "/home/train/venv", "system directory"),
        ("data_mount", "/home/ubuntu", "system directory"),
        ("nfs_mount_root", "/home/train", "system directory"),
        ("_shell_executable", "/home/train/bin/sh", "in a home directory"),
        ("_su_shell", "/home/ubuntu/sh", "in a home directory"),
        ("_temp_dir", "/home/train", "in a home directory"),
        ("_chdir", "/home/train/x", "in a home directory"),
        ("_env", {"LD_PRELOAD": "/tmp/x.so", "http_proxy": "http://p:3128"}, "LD_PRELOAD: not given to root's"),
        ("_env", {"PATH": "/home/train/bin:/usr/bin"}, "PATH: not given to root's"),
        ("_env", {"PYTHONPATH": "/x", "BASH_ENV": "/x", "APT_CONFIG": "/x"}, "APT_CONFIG, BASH_ENV, PYTHONPATH: not"),
        ("_env", {"HOME": "/home/train", "TMPDIR": "/home/train"}, "HOME, TMPDIR: not given"),
        ("training_user", "munge", "a system or service account"),
        ("training_user", "slurm", "a system or service account"),
        ("training_user", "provision-backup-gpu01", "a system or service account"),
        ("ssh_hostname", "0xc0000201", "is not an IP address"),
        ("nfs_export_options", "rw,sync,fsid=1", "'fsid=1' not allowed"),
        ("nfs_export_options", "rw,all_squash,anonuid=1000,anongid=6", "anongid=6 maps squashed users"),
        ("training_uid", Expr("2**70"), "too large"),
        ("ssh_port", Expr("10**5000"), "too large"),  # no repr: over Python's 4,300 digits
        ("validate_expect", Expr("{'fleet.mad_k': 10**400}"), "too large"),  # no float
        ("train_dir", "/x" * 3000, "longer than 4096"),
    ],
)
def test_a_value_the_second_audit_found_accepted_or_crashing_is_refused(tmp_path, key, value, said):
    found = problems(tmp_path, two({**BASE, key: value}))
    assert any(f"key {key}" in line and said in line for line in found), found
    assert all(len(line) < 1000 for line in found), found  # a huge value is cut, not printed whole


@pytest.mark.parametrize(
    ("first", "said"),
    [
        ({**BASE, "venv_path": "/srv/export/datasets/venv", "nfs_export_root": "/srv/export"}, "nfs_export_root"),
        ({**BASE, "raid_level": 5, "data_disks": ["S6X01", "S6X02"]}, "raid_level 5 needs at least 3 disks"),
        ({**BASE, "nvidia_driver_version": "570.86.15"}, "570.86.15 is not of nvidia_driver_branch 580"),
    ],
)
def test_keys_that_contradict_each_other_are_refused_at_load(tmp_path, first, said):
    found = problems(tmp_path, two(first))
    assert any(said in line for line in found), found


def test_a_host_name_the_resolver_reads_as_an_address_is_refused(tmp_path):
    found = problems(tmp_path, two(BASE, name1="0x7f000001"))
    assert any("reads as an IP address" in line for line in found), found


def test_a_cluster_address_that_is_another_hosts_ssh_address_is_refused(tmp_path):
    found = problems(tmp_path, two({**BASE, "cluster_address": "192.0.2.2"}))
    assert any("key cluster_address: 192.0.2.2 is the SSH address of gpu02" in line for line in found), found


def test_the_cluster_wide_settings_must_agree(tmp_path):
    found = problems(tmp_path, two({**BASE, "training_uid": 2001}))
    assert any("key training_uid: differs between hosts (2001 on gpu01; 2000 on gpu02)" in line for line in found)


def test_a_host_mounting_a_share_the_storage_host_does_not_export_is_refused(tmp_path):
    text = two({**BASE, "nfs_exports": ["datasets"], "cluster_cidr": "10.0.0.0/24"}) + "storage = ['gpu01']\n"
    found = problems(tmp_path, text)
    assert any("host gpu02: key nfs_exports: checkpoints, scratch not exported" in line for line in found), found


def test_a_connector_host_name_is_refused_before_it_runs(tmp_path):
    ran = tmp_path / "ran"
    found = problems(tmp_path, f"nodes = ['@terraform/{ran}', ('gpu01', {BASE!r})]\n")
    assert any("pyinfra connector" in line for line in found), found
    assert not ran.exists()


def test_an_inventory_file_named_for_a_role_is_refused(tmp_path):
    inv = tmp_path / "storage.py"
    inv.write_text(two(BASE))
    with pytest.raises(InputError) as info:
        inventory.load(inv)
    assert "the file's name 'storage' is a role" in str(info.value)


def test_a_str_subclass_that_writes_other_text_is_refused(tmp_path):
    text = "class _S(str):\n    def __str__(self):\n        return 'x\\nExecStartPre=/tmp/evil'\n" + two(BASE).replace(
        "'10.0.0.1'}", "'10.0.0.1', 'backup_schedule': _S('daily')}", 1
    )
    found = problems(tmp_path, text)
    assert any("key backup_schedule" in line and "not plain data" in line for line in found), found


def test_an_inventory_raising_a_base_exception_is_one_line_not_a_traceback(tmp_path):
    found = problems(tmp_path, "class _E(BaseException):\n    pass\n\nraise _E('boom')\n")
    assert found == [f"{tmp_path / 'inv.py'}: raised _E: boom (an inventory must run without errors)"], found


def test_a_group_name_with_a_newline_is_said_escaped(tmp_path):
    found = problems(tmp_path, two(BASE) + "globals()['x\\nerror: fake'] = 1\n")
    assert all("\n" not in line for line in found), found
    assert any("group 'x\\nerror: fake'" in line for line in found), found


@pytest.mark.parametrize(
    ("first", "said"),
    [
        # the storage host's shares over its backups tree (<data_mount>/backups, root's)
        ({**BASE, "nfs_export_root": "/data", "nfs_exports": ["backups"]}, "the share /data/backups is on or holds"),
        # a backup of the tree that holds the repositories: it grows until the volume is full
        ({**BASE, "backup_paths": ["/data"]}, "/data is on or holds /data/backups"),
        # a local repository on a share, which the training user writes to
        ({**BASE, "backup_repository": "/shared/checkpoints/repo"}, "is on or holds nfs_mount_root /shared"),
        ({**BASE, "backup_repository": "local:/srv/bk/{host}", "backup_paths": ["/srv"]}, "holds the repository"),
    ],
)
def test_backups_that_would_hold_themselves_or_sit_on_a_share_are_refused(tmp_path, first, said):
    text = two({**first, "cluster_cidr": "10.0.0.0/24"}, {**OTHER, "cluster_cidr": "10.0.0.0/24"})
    found = problems(tmp_path, text + "storage = ['gpu01']\n")
    assert any(said in line for line in found), found


@pytest.mark.parametrize("serial", ["0", "0:0", "part1"])
def test_a_serial_that_would_match_other_disks_ids_is_refused(tmp_path, serial):
    found = problems(tmp_path, two({**BASE, "force_format": [serial]}))
    assert any("too short or too common for a serial" in line for line in found), found


def test_slurm_without_a_running_controller_or_a_compute_host_is_refused(tmp_path):
    found = problems(tmp_path, two(BASE) + "head = [('gpu01', {'slurm': 'skip'})]\n")
    assert any("key slurm: the head (the head group) skips Slurm" in line for line in found), found
    found = problems(tmp_path, two(BASE) + "head = ['gpu01']\ncompute = [('gpu02', {'slurm': 'skip'})]\n")
    assert any("no host would run Slurm jobs" in line for line in found), found
    inv = tmp_path / "none.py"  # no host runs Slurm at all: nothing to contradict
    inv.write_text(two({**BASE, "slurm": "skip"}, {**OTHER, "slurm": "skip"}))
    assert len(inventory.load(inv).nodes) == 2


# A review of the above (session 50): what real clusters do that must still load, and what
# crashed the checks themselves.
def test_hosts_behind_one_nat_address_each_on_its_port_load(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text(
        "nodes = [('head01', {'ssh_hostname': '10.10.0.1'}),\n"
        "         ('gpu01', {'ssh_hostname': '10.10.0.1', 'ssh_port': 2201, 'cluster_address': '10.10.0.11'}),\n"
        "         ('gpu02', {'ssh_hostname': '10.10.0.1', 'ssh_port': 2202, 'cluster_address': '10.10.0.12'})]\n"
    )
    assert [n.cluster_address for n in inventory.load(inv).nodes] == ["10.10.0.1", "10.10.0.11", "10.10.0.12"]


@pytest.mark.parametrize("repository", ["s3:s3.example.net/bk/{host}", "/backup/restic"])
def test_a_storage_host_backing_up_its_data_elsewhere_loads(tmp_path, repository):
    first = {**BASE, "cluster_cidr": "10.0.0.0/24", "backup_repository": repository, "backup_paths": ["/data"]}
    inv = tmp_path / "inv.py"
    inv.write_text(two(first, {**OTHER, "cluster_cidr": "10.0.0.0/24"}) + "storage = ['gpu01']\n")
    assert inventory.load(inv).storage_node().name == "gpu01"


def test_a_tls_inspecting_proxy_gets_its_ca_bundle_from_a_root_owned_file(tmp_path):
    env = {
        "https_proxy": "http://proxy:3128",
        "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/corp.pem",
        "PIP_CERT": "/etc/x.pem",
    }
    inv = tmp_path / "inv.py"
    inv.write_text(two({**BASE, "_env": env}))
    assert inventory.load(inv).nodes[0].data["_env"] == env
    found = problems(tmp_path, two({**BASE, "_env": {"SSL_CERT_FILE": "/home/train/ca.pem"}}))
    assert any("SSL_CERT_FILE: '/home/train/ca.pem' is not a root-owned" in line for line in found), found
    found = problems(tmp_path, two({**BASE, "_env": {"PIP_INDEX_URL": "http://mirror/simple"}}))
    assert any("a package index goes in pip_index_url" in line for line in found), found


BAD_NAME = "gpu\x0001"


@pytest.mark.parametrize(
    "text",
    [two(BASE, name1=BAD_NAME), two({**BASE, "ssh_hostname": BAD_NAME}), two({**BASE, "ntp_servers": [BAD_NAME]})],
    ids=["name", "ssh_hostname", "ntp_servers"],
)
def test_a_nul_in_a_host_name_is_refused_not_a_crash(tmp_path, text):
    found = problems(tmp_path, text)
    assert found, found
    assert all("\x00" not in line for line in found), found


def test_a_hostile_repr_is_never_called_and_exit_is_not_taken(tmp_path):
    text = "class _S(str):\n    def __repr__(self):\n        raise SystemExit(3)\n" + two(BASE).replace(
        "'10.0.0.1'}", "'10.0.0.1', 'backup_schedule': [_S('daily')]}", 1
    )
    found = problems(tmp_path, text)
    assert any("key backup_schedule: <a list> is a _S, not plain data" in line for line in found), found


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "0", "-1", "soon"])
def test_an_inventory_deadline_that_is_not_a_number_of_seconds_is_said_as_the_variables(tmp_path, monkeypatch, value):
    monkeypatch.setenv("PROVISION_INVENTORY_TIMEOUT_S", value)
    found = problems(tmp_path, two(BASE))
    assert found == [
        f"PROVISION_INVENTORY_TIMEOUT_S: {value!r} is not a number of seconds from 0.1 to 3600 (unset it for 30)"
    ], found


def test_a_state_directory_that_is_a_file_is_bad_input_said_at_once(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "file"))
    (tmp_path / "file").write_text("")
    inv = tmp_path / "inv.py"
    inv.write_text("nodes = [('n1', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1, 'cluster_address': '10.0.0.1'})]\n")
    result = cli("validate", str(inv), "--quick")
    assert result.code == 2, (result.out, result.err)
    assert "is not a directory" in result.err


def test_a_venv_beside_the_trainers_files_in_train_dir_loads(tmp_path):
    # train_dir is root's; only its work/ is the training user's (the namespace tests keep
    # their venv at <train_dir>/venv).
    inv = tmp_path / "inv.py"
    inv.write_text(two({**BASE, "train_dir": "/srv/train", "venv_path": "/srv/train/venv"}))
    assert inventory.load(inv).nodes[0].settings.venv_path == "/srv/train/venv"
