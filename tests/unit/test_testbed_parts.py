"""Pure and local parts of the testbed: image recipe, guest files, state file, process
handling by pid, tool checks. No VM is started here."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from provision import errors
from provision.testbed import apt_sources, guest_files, image, procs, state, tools
from provision.testbed.state import NodeRecord, TestbedState

SOURCES = "Types: deb\nURIs: http://mirror.test/debian\nSuites: bookworm\nComponents: main\n"


def _recipe() -> image.Recipe:
    return image.recipe_for(apt_sources.debian_mirror(apt_sources.parse_deb822(SOURCES)))


def test_image_name_changes_with_its_recipe_and_only_then() -> None:
    recipe = _recipe()
    assert recipe.name == _recipe().name
    assert recipe.name.startswith("debian-bookworm-")
    assert replace(recipe, packages=(*recipe.packages, "vim")).name != recipe.name
    assert replace(recipe, mirror="http://other.test/debian").name != recipe.name
    assert replace(recipe, size="4G").name != recipe.name


def test_root_label_fits_ext4() -> None:
    assert len(_recipe().label) <= 16


def test_image_recipe_includes_what_later_steps_need() -> None:
    for package in ("systemd-sysv", "openssh-server", "openssh-sftp-server", "linux-image-amd64",
                    "python3", "sudo", "ifupdown", "iproute2", "udev", "iputils-ping"):
        assert package in image.PACKAGES


def test_unbuilt_image_is_not_found_in_the_cache(tmp_path: Path) -> None:
    assert image.cached(_recipe(), tmp_path) is None
    half = tmp_path / _recipe().name
    half.mkdir()
    (half / "root.img").write_bytes(b"")  # no recipe.json: the build did not finish
    assert image.cached(_recipe(), tmp_path) is None


def test_baked_rootfs_has_no_host_key_and_the_seed_unit_enabled(tmp_path: Path) -> None:
    (tmp_path / "etc/ssh").mkdir(parents=True)
    (tmp_path / "etc/ssh/ssh_host_ed25519_key").write_text("from the build")
    (tmp_path / "etc/hostname").write_text("buildhost\n")
    image.configure_rootfs(tmp_path, _recipe())
    assert not list((tmp_path / "etc/ssh").glob("ssh_host_*"))
    assert not (tmp_path / "etc/hostname").exists()
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants/provision-seed.service"
    assert wants.is_symlink()
    assert (tmp_path / "etc/systemd/system/apt-daily.timer").readlink() == Path("/dev/null")
    assert "URIs: http://mirror.test/debian" in (tmp_path / "etc/apt/sources.list.d/debian.sources").read_text()
    assert (tmp_path / "etc/fstab").read_text().startswith(f"LABEL={_recipe().label} / ext4")
    assert (tmp_path / "etc/machine-id").read_text() == ""


def test_node_network_config_pins_eth0_to_user_net_and_eth1_to_the_cluster() -> None:
    text = guest_files.node_interfaces("10.77.0.12", 24)
    assert "iface eth0 inet static\n    address 10.0.2.15/24\n    gateway 10.0.2.2" in text
    assert "iface eth1 inet static\n    address 10.77.0.12/24\n" in text
    assert "gateway" not in text.split("eth1", 1)[1]  # no route off the cluster network


def test_hosts_file_names_every_node_by_cluster_address() -> None:
    hosts = guest_files.node_hosts({"node1": "10.77.0.11", "node2": "10.77.0.12"})
    assert "10.77.0.11 node1\n10.77.0.12 node2\n" in hosts


def test_state_round_trips_and_does_not_store_the_running_flag(tmp_path: Path) -> None:
    node = NodeRecord("node1", 1, 40001, "10.77.0.11", 2048, 2, ["NVME-node1-1"], pid=123, running=True)
    state.save(tmp_path, TestbedState("/img/x", "pvroot-1", "tcg", [node], vde_pid=99))
    loaded = state.load(tmp_path)
    assert loaded is not None
    assert loaded.node("node1").pid == 123 and loaded.node("node1").running is False
    assert loaded.vde_pid == 99
    assert loaded.node("node1").data_disks == ["/dev/disk/by-id/virtio-NVME-node1-1"]
    assert state.load(tmp_path / "none") is None


def test_processes_are_stopped_by_pid_only_when_they_carry_our_marker(tmp_path: Path) -> None:
    marker = f"{tmp_path}/"
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker + "x"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not procs.stop(other.pid, marker)  # not ours: left alone
        assert procs.alive(other.pid)
        assert procs.stop(ours.pid, marker)
        assert not procs.alive(ours.pid)
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def test_pidfile_with_garbage_reads_as_no_pid(tmp_path: Path) -> None:
    (tmp_path / "pid").write_text("not a pid\n")
    assert procs.read_pidfile(tmp_path / "pid") is None
    assert procs.read_pidfile(tmp_path / "missing") is None


def test_missing_tool_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(errors.TestbedError, match="qemu-system-x86_64 not found: apt-get install qemu-system-x86"):
        tools.require("qemu-system-x86_64")
