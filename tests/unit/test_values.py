"""The kinds of inventory values accept what real inventories hold (refusals are the
bad-input suite's, tests/integration/test_bad_inputs.py)."""

from __future__ import annotations

import pytest

from provision import values as v
from provision.settings import Settings, knob_docs, parse_settings


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (v.data_directory, "/data"),
        (v.data_directory, "/srv/data"),
        (v.data_directory, "/var/tmp/provision-train"),
        (v.data_directory, "/opt/provision/venv"),
        (v.data_directory, "/mnt/nvme0"),
        (v.source_path, "/etc"),
        (v.source_path, "/home"),
        (v.host_name, "gpu-01.rack3.example.com"),
        (v.address, "fd00::1"),
        (v.user_name, "ubuntu"),
        (v.user_name, "svc_train.2"),
        (v.interface, "enp65s0f0np0"),
        (v.cluster_network, "10.0.0.0/8"),
        (v.cluster_network, "fd00:1::/64"),
        (v.url, "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/"),
        (v.url, "http://10.0.0.5:8080/simple"),
        (v.restic_repository, "sftp:backup@10.0.0.1:/srv/restic/{host}"),
        (v.restic_repository, "s3:s3.amazonaws.com/bucket/{host}"),
        (v.restic_repository, "/mnt/backup/restic"),
        (v.calendar, "daily"),
        (v.calendar, "Mon..Fri *-*-* 02:30:00"),
        (v.export_options, "rw,sync,root_squash,no_subtree_check,sec=krb5p,anonuid=2000"),
        (v.share_name, "datasets"),
        (v.disk_name, "/dev/disk/by-id/nvme-SAMSUNG_MZ1L23T8HBLA-00A07_S6EXAMPLE0001"),
        (v.exporter_collector, "hwmon"),
        (v.exporter_collector, "netclass"),
    ],
)
def test_accepts_what_real_inventories_hold(check, value):
    assert check(value) is None


def test_every_default_passes_its_own_check():
    settings, problems = parse_settings({name: default for name, default, _ in knob_docs()}, "defaults")
    assert problems == []
    assert settings == Settings()


@pytest.mark.parametrize("value", ["/x/../etc", "/x/./y", "/x/", "//x"])
def test_an_absolute_path_must_be_normalised(value):
    assert "normalised" in (v.absolute_path(value) or "")
