"""NFS unit names checked against the real systemd-escape."""

from __future__ import annotations

import subprocess

import pytest

from provision.deploys import nfs


@pytest.mark.parametrize("path", ["/shared/checkpoints", "/shared/my-data.x/.hid", "/.a/b c"])
def test_unit_names_match_systemd_escape(path):
    expected = subprocess.run(
        ["systemd-escape", "-p", "--suffix=automount", path], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert nfs.systemd_unit(path, "automount") == expected
