"""inventories/vagrant.py matches the Vagrantfile and loads with provision's loader."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from provision import inventory as inventory_lib
from provision.errors import InputError

REPO = Path(__file__).resolve().parents[2]


def _checkout(tmp_path: Path, provider: str, make_keys: bool = True) -> Path:
    """A copy of the inventory beside a fake .vagrant tree (test stand-in: the key files
    Vagrant would write after `vagrant up`; the loader only checks that they exist)."""
    (tmp_path / "inventories").mkdir()
    inventory = tmp_path / "inventories" / "vagrant.py"
    shutil.copyfile(REPO / "inventories" / "vagrant.py", inventory)
    for name in ("vagrant1", "vagrant2"):
        key = tmp_path / ".vagrant" / "machines" / name / provider / "private_key"
        if make_keys:
            key.parent.mkdir(parents=True)
            key.write_text("test stand-in key\n")
    return inventory


@pytest.mark.parametrize(("provider", "disk_prefix"), [("libvirt", "virtio-"), ("virtualbox", "ata-VBOX_HARDDISK_")])
def test_vagrant_inventory_loads_for_each_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, provider: str, disk_prefix: str
) -> None:
    monkeypatch.setenv("PROVISION_VAGRANT_PROVIDER", provider)
    cluster = inventory_lib.load(_checkout(tmp_path, provider))
    assert [n.name for n in cluster.nodes] == ["vagrant1", "vagrant2"]
    v1 = cluster.node("vagrant1")
    assert (v1.ssh.hostname, v1.ssh.port, v1.ssh.user) == ("127.0.0.1", 2222, "vagrant")
    assert cluster.node("vagrant2").ssh.port == 2200
    assert v1.ssh.key == str(tmp_path / ".vagrant/machines/vagrant1" / provider / "private_key")
    assert [n.cluster_address for n in cluster.nodes] == ["10.78.0.11", "10.78.0.12"]
    assert v1.settings.data_disks == [f"/dev/disk/by-id/{disk_prefix}NVME-vagrant1-{k}" for k in (1, 2)]
    assert cluster.storage_node().name == "vagrant1"  # type: ignore[union-attr]


def test_vagrant_inventory_before_vagrant_up_reports_the_missing_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISION_VAGRANT_PROVIDER", "libvirt")
    with pytest.raises(InputError) as raised:
        inventory_lib.load(_checkout(tmp_path, "libvirt", make_keys=False))
    assert [p.where.rsplit(": ", 2)[-2:] for p in raised.value.problems] == [
        ["host vagrant1", "key ssh_key"],
        ["host vagrant2", "key ssh_key"],
    ]


def test_vagrantfile_declares_the_inventorys_addresses_ports_and_serials() -> None:
    text = (REPO / "Vagrantfile").read_text()
    assert 'config.vm.box = "generic/ubuntu2204"' in text
    for expected in (
        'name: "vagrant1", ip: "10.78.0.11", ssh_port: 2222',
        'name: "vagrant2", ip: "10.78.0.12", ssh_port: 2200',
        'serial: "NVME-#{node[:name]}-#{k}"',
        'provider "libvirt"',
        'provider "virtualbox"',
    ):
        assert expected in text


def test_vagrant_inventory_finds_the_provider_from_the_keys_vagrant_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROVISION_VAGRANT_PROVIDER", raising=False)
    monkeypatch.delenv("VAGRANT_DEFAULT_PROVIDER", raising=False)
    cluster = inventory_lib.load(_checkout(tmp_path, "virtualbox"))
    assert "/virtualbox/private_key" in (cluster.node("vagrant2").ssh.key or "")
