"""The settings model: every knob documented, every default valid, pyinfra keys untouched."""

from __future__ import annotations

from dataclasses import replace

import pytest

from provision.settings import Settings, cross_key_problems, is_pyinfra_key, knob_docs, parse_settings


def test_every_knob_has_a_one_line_comment():
    for name, _default, doc in knob_docs():
        assert doc.strip(), name
        assert "\n" not in doc, name


def test_every_default_passes_its_own_validation():
    defaults = {name: default for name, default, _ in knob_docs()}
    settings, problems = parse_settings(defaults, "defaults")
    assert problems == []
    assert settings == Settings()


def test_list_defaults_are_not_shared_between_hosts():
    a, b = Settings(), Settings()
    assert a.nfs_exports == b.nfs_exports
    assert a.nfs_exports is not b.nfs_exports


@pytest.mark.parametrize("key", ["ssh_hostname", "ssh_port", "_sudo", "_env"])
def test_pyinfra_connection_keys_and_global_arguments_pass_through(key):
    assert is_pyinfra_key(key)
    assert parse_settings({key: object()}, "x")[1] == []


def test_int_setting_refuses_bool_and_float_setting_takes_int():
    _, problems = parse_settings({"apt_lock_wait_s": True}, "x")
    assert len(problems) == 1
    assert "apt_lock_wait_s" in str(problems[0])


def test_data_disks_accepts_auto_by_id_and_serial():
    for value in ("auto", ["/dev/disk/by-id/nvme-X_1"], ["S6EXAMPLE0001"]):
        assert parse_settings({"data_disks": value}, "x")[1] == []


@pytest.mark.parametrize("key", ["data_disks", "force_format"])
@pytest.mark.parametrize(
    ("disk", "expected"),
    [
        ("/dev/sdb", "kernel name that can change between boots"),
        ("/dev/nvme0n1", "kernel name that can change between boots"),
        ("/dev/disk/by-uuid/1b4e28ba-2fa1-11d2-883f-0016d3cca427", "not a /dev/disk/by-id path"),
        ("/dev/disk/by-path/pci-0000:00:04.0", "not a /dev/disk/by-id path"),
        ("/dev/disk/by-label/scratch", "not a /dev/disk/by-id path"),
        ("", "neither a /dev/disk/by-id path nor a serial"),
    ],
)
def test_disk_keys_refuse_anything_but_a_by_id_path_or_a_serial_naming_host_and_key(key, disk, expected):
    _, problems = parse_settings({key: [disk]}, "inv.py: host node1")
    assert len(problems) == 1
    assert str(problems[0]).startswith(f"inv.py: host node1: key {key}: ")
    assert expected in str(problems[0])
    assert "\n" not in str(problems[0])


def test_force_format_accepts_by_id_paths_and_serials():
    settings, problems = parse_settings({"force_format": ["/dev/disk/by-id/nvme-X_1", "S6EXAMPLE0001"]}, "x")
    assert problems == []
    assert settings.force_format == ["/dev/disk/by-id/nvme-X_1", "S6EXAMPLE0001"]


def test_every_wrong_disk_of_a_key_is_named_in_its_one_line():
    _, problems = parse_settings({"data_disks": ["/dev/sdb", "S6EXAMPLE0001", "/dev/disk/by-uuid/u"]}, "x")
    (problem,) = problems
    assert "'/dev/sdb'" in str(problem)
    assert "'/dev/disk/by-uuid/u'" in str(problem)
    assert "S6EXAMPLE0001" not in str(problem)


def test_the_nfs_export_root_follows_the_data_mount_unless_set():
    from provision.settings import parse_settings

    moved, problems = parse_settings({"data_mount": "/srv/data"}, "inv.py: host n1")
    assert not problems
    assert moved.nfs_export_root == "/srv/data/shared"
    assert parse_settings({}, "inv.py: host n1")[0].nfs_export_root == "/data/shared"
    chosen, _ = parse_settings({"data_mount": "/srv/data", "nfs_export_root": "/export"}, "inv.py: host n1")
    assert chosen.nfs_export_root == "/export"


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("numpy_version", "2.2.6; rm -rf /", "not a version number"),
        ("torch_version", "2.13.0 numpy", "not a version number"),
        ("nvml_version", ">=13", "not a version number"),
        ("nccl_version", "", "not a version number"),
        ("nvidia_driver_version", "latest", "not a version number"),
        ("nvidia_driver_branch", "580.95", "not a driver branch"),
        ("cuda_toolkit_version", "12", "not a CUDA major-minor version"),
        ("nvidia_keyring_sha256", "ABC", "not a SHA-256"),
    ],
)
def test_versions_that_go_into_install_commands_are_checked(key, value, expected):
    _, problems = parse_settings({key: value}, "inv.py: host n1")
    (problem,) = problems
    assert str(problem).startswith(f"inv.py: host n1: key {key}: ")
    assert expected in str(problem)


def test_real_versions_pass_and_nulls_unpin():
    good = {
        "torch_version": "2.13.0+cpu",
        "numpy_version": "2.2.6",
        "nvml_version": "13.580.126",
        "nccl_version": "2.27.7-1+cuda12.8",
        "nvidia_driver_version": "580.95.05-0ubuntu0.24.04.1",
        "nvidia_driver_branch": "1000",
        "cuda_toolkit_version": "12.8",
        "nvidia_keyring_sha256": "0" * 64,
    }
    assert parse_settings(good, "x")[1] == []
    unpinned, problems = parse_settings({"numpy_version": None, "nvml_version": None}, "x")
    assert problems == []
    assert unpinned.numpy_version is None
    assert unpinned.nvml_version is None


def all_problems(data: dict, where: str) -> list:
    """What inventory.load says of one host's data: key by key, then the keys together."""
    settings, problems = parse_settings(data, where)
    return problems + [replace(p, where=f"{where}: {p.where}") for p in cross_key_problems(settings)]


def test_nccl_without_a_cuda_version_to_match_is_refused():
    problems = all_problems({"install_nccl": True, "cuda_toolkit_version": None}, "inv.py: host n1")
    (problem,) = problems
    assert str(problem).startswith("inv.py: host n1: key install_nccl: ")
    assert "nccl_version with its +cudaX.Y suffix" in str(problem)
    for fine in (
        {"install_nccl": True},
        {"install_nccl": True, "cuda_toolkit_version": None, "nccl_version": "2.27.7-1+cuda12.8"},
    ):
        assert all_problems(fine, "x") == []


def test_nofile_limit_above_the_kernels_nr_open_is_refused_because_logins_would_fail():
    # pam_limits sets nofile for root too: above fs.nr_open (1048576) setrlimit fails and
    # every login, root's SSH included, is refused.
    _, problems = parse_settings({"nofile_limit": 1048577}, "inv.py: host node1")
    (problem,) = problems
    assert str(problem).startswith("inv.py: host node1: key nofile_limit: 1048577 is above 1048576")
    assert "refuse every login" in str(problem)
    assert parse_settings({"nofile_limit": 1048576}, "x")[1] == []
    # Below the kernel's default soft limit, no login (sshd, sudo) has the files it opens.
    assert "is below 1024" in str(parse_settings({"nofile_limit": 1}, "x")[1][0])
    assert parse_settings({"nofile_limit": 1024}, "x")[1] == []


def test_deadline_knobs_have_defaults_and_refuse_zero_or_absurd_values():
    from provision.settings import Settings, parse_settings

    defaults = Settings()
    assert (defaults.connect_timeout_s, defaults.command_timeout_s, defaults.step_timeout_s) == (15, 3600, 7200)
    _, problems = parse_settings({"connect_timeout_s": 0, "command_timeout_s": 10**6, "step_timeout_s": 5}, "inv.py")
    assert [p.where for p in problems] == ["inv.py: key connect_timeout_s", "inv.py: key command_timeout_s"]
    assert "between 1 and 600 seconds" in problems[0].what


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"train_dir": "/"}, "'/' is / or a system directory"),
        ({"train_dir": "/var/tmp"}, "'/var/tmp' is / or a system directory"),
        ({"train_dir": "/home/"}, "'/home/' is not a normalised absolute path"),
        ({"train_dir": "/etc/provision"}, "'/etc/provision' is / or a system directory"),
        ({"train_dir": "/usr/local/train"}, "'/usr/local/train' is / or a system directory"),
        ({"train_dir": "/srv"}, "'/srv' is / or a system directory"),  # /srv/<name> is fine, /srv itself is not
        ({"train_dir": "/var/tmp/../../etc"}, "'/var/tmp/../../etc' is not a normalised absolute path"),
        ({"train_dir": "/data"}, "'/data' is, or holds, the data volume or the NFS shares (data_mount /data)"),
        ({"train_dir": "/srv/x", "data_mount": "/srv/x/data"}, "'/srv/x' is, or holds, the data volume"),
        ({"train_dir": "/shared/checkpoints/t"}, "'/shared/checkpoints/t' is on the NFS shares (nfs_mount_root"),
        ({"train_dir": "/shared"}, "'/shared' is on the NFS shares (nfs_mount_root /shared)"),
        ({"train_dir": "/data/shared/x"}, "'/data/shared/x' is on the NFS shares (nfs_export_root /data/shared)"),
    ],
)
def test_train_dir_refuses_the_root_system_directories_the_data_volume_and_the_shares(data, expected):
    problems = all_problems(data, "inv.py: host n1")
    assert [p.where for p in problems] == ["inv.py: host n1: key train_dir"]
    assert problems[0].what.startswith(expected)


@pytest.mark.parametrize("path", ["/var/tmp/provision-train", "/srv/train", "/data/train", "/opt/provision/train"])
def test_train_dir_of_its_own_passes(path):
    assert parse_settings({"train_dir": path}, "inv.py")[1] == []


def test_every_path_knob_refuses_the_same_system_directories():
    # One list (values.py) for all of them: it once differed between train_dir and the rest.
    for key in ("data_mount", "nfs_export_root", "venv_path", "train_dir"):
        for path in ("/srv", "/var/backups", "/usr/local/x"):
            _, problems = parse_settings({key: path}, "inv.py")
            assert [p.where for p in problems] == [f"inv.py: key {key}"], (key, path)
