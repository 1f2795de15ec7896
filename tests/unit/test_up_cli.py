"""`provision up --force-format`: checked before any host is contacted."""

from __future__ import annotations

from provision.resources import inventories_dir


def test_force_format_for_an_unknown_host_is_bad_input(cli):
    result = cli("up", str(inventories_dir() / "example.py"), "--force-format", "gpu09:/dev/disk/by-id/nvme-X")
    assert result.code == 2
    assert "--force-format gpu09:/dev/disk/by-id/nvme-X: 'gpu09' is not a host" in " ".join(result.err.split())


def test_force_format_without_a_disk_is_bad_input(cli):
    result = cli("up", str(inventories_dir() / "example.py"), "--force-format", "gpu01")
    assert result.code == 2
    assert "no disk given" in result.err
