"""Pure and local parts of the testbed: image recipe, guest files, state file, process
handling by pid, tool checks. No VM is started here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from provision import errors
from provision.rules.packages import BASE_PACKAGES
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
    for package in (
        "systemd-sysv",
        "openssh-server",
        "openssh-sftp-server",
        "linux-image-amd64",
        "python3",
        "sudo",
        "ifupdown",
        "iproute2",
        "udev",
        "iputils-ping",
    ):
        assert package in image.PACKAGES


def test_the_image_bakes_in_part_of_the_base_set_and_leaves_up_the_rest_to_install() -> None:
    # Baked in to save emulated minutes, but never the whole set: the shared `up` must still
    # install packages on every testbed, or its install path would go untested.
    assert set(image.PRESEEDED) == {"build-essential", "python3-dev", "fio"}
    assert set(image.PRESEEDED) <= set(BASE_PACKAGES)
    left_to_up = set(BASE_PACKAGES) - set(image.PRESEEDED) - set(image.PACKAGES)
    assert {"python3-venv", "mdadm", "chrony"} <= left_to_up
    assert set(image.PRESEEDED) <= set(_recipe().packages)
    # Slurm's node packages are baked in too; slurmctld, whose unit would start on every node
    # once slurm.conf exists, is the head's alone and left to `up`.
    assert set(image.PRESEEDED_SLURM) == {"munge", "slurm-client", "slurmd"} <= set(_recipe().packages)
    assert "slurmctld" not in _recipe().packages
    # The testbed keeps accounting: its head's MariaDB and slurmdbd are baked in as well.
    assert set(image.PRESEEDED_ACCOUNTING) == {"mariadb-server", "slurmdbd"} <= set(_recipe().packages)


def test_baked_mariadb_starts_on_no_node_until_up_enables_it_on_the_head(tmp_path: Path) -> None:
    # The package's postinst enabled it in the chroot; the image leaves it disabled, not
    # masked (the head's `systemctl enable` and `start` must still work). The links are
    # absolute, into the image's /lib: dangling seen from the build host, as here.
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    (wants / "mariadb.service").symlink_to("/lib/systemd/system/mariadb.service")
    (wants / "slurmdbd.service").symlink_to("/lib/systemd/system/slurmdbd.service")
    image.configure_rootfs(tmp_path, _recipe())
    assert not (wants / "mariadb.service").is_symlink()
    assert not (tmp_path / "etc/systemd/system/mariadb.service").is_symlink()
    # slurmdbd stays as the package left it: its unit needs /etc/slurm/slurmdbd.conf, the head's alone.
    assert (wants / "slurmdbd.service").is_symlink()


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
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants"
    assert (wants / "provision-seed.service").is_symlink()
    assert (wants / "systemd-networkd.service").is_symlink()
    assert (tmp_path / "etc/systemd/system/networking.service").readlink() == Path("/dev/null")
    assert (tmp_path / "etc/systemd/system/apt-daily.timer").readlink() == Path("/dev/null")
    assert "URIs: http://mirror.test/debian" in (tmp_path / "etc/apt/sources.list.d/debian.sources").read_text()
    assert (tmp_path / "etc/fstab").read_text().startswith(f"LABEL={_recipe().label} / ext4")
    assert (tmp_path / "etc/machine-id").read_text() == ""
    # The VMs' chrony names no public NTP server: they reach nothing outside this machine but
    # the package mirror. Its sources come only from sources.d (ntp_servers) and DHCP.
    chrony = (tmp_path / "etc/chrony/chrony.conf").read_text()
    sources = [line.split()[0] for line in chrony.splitlines() if line and not line.startswith("#")]
    assert not {"pool", "server", "peer"} & set(sources)
    assert "sourcedir /etc/chrony/sources.d" in chrony


def test_node_networks_are_matched_by_mac_with_the_route_on_eth0_only() -> None:
    files = guest_files.node_networks("52:54:00:77:00:02", "52:54:00:77:01:02", "10.77.0.12", 24)
    eth0, eth1 = files["10-eth0.network"], files["20-eth1.network"]
    assert "MACAddress=52:54:00:77:00:02\n" in eth0
    assert "Address=10.0.2.15/24\n" in eth0
    assert "Gateway=10.0.2.2\n" in eth0
    assert "MACAddress=52:54:00:77:01:02\n" in eth1
    assert "Address=10.77.0.12/24\n" in eth1
    assert "Gateway" not in eth1  # no route off the cluster network


def test_hosts_file_names_every_node_by_cluster_address() -> None:
    hosts = guest_files.node_hosts("node2", {"node1": "10.77.0.11", "node2": "10.77.0.12"})
    assert "10.77.0.11 node1\n10.77.0.12 node2\n" in hosts
    assert hosts.startswith("127.0.0.1 localhost\n127.0.1.1 node2\n")  # as the Debian installer leaves it


def test_state_round_trips_and_does_not_store_the_running_flag(tmp_path: Path) -> None:
    node = NodeRecord("node1", 1, 40001, "10.77.0.11", 2048, 2, ["NVME-node1-1"], pid=123, running=True)
    state.save(tmp_path, TestbedState("/img/x", "pvroot-1", "tcg", [node], vde_pid=99))
    loaded = state.load(tmp_path)
    assert loaded is not None
    assert loaded.node("node1").pid == 123
    assert loaded.node("node1").running is False
    assert loaded.vde_pid == 99
    assert loaded.node("node1").data_disks == ["/dev/disk/by-id/virtio-NVME-node1-1"]
    assert state.load(tmp_path / "none") is None


def test_pidfile_with_garbage_reads_as_no_pid(tmp_path: Path) -> None:
    (tmp_path / "pid").write_text("not a pid\n")
    assert procs.read_pidfile(tmp_path / "pid") is None
    assert procs.read_pidfile(tmp_path / "missing") is None


def test_missing_tool_names_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(errors.TestbedError, match="qemu-system-x86_64 not found: apt-get install qemu-system-x86"):
        tools.require("qemu-system-x86_64")


def test_build_folders_of_killed_builds_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    import os

    dead = tmp_path / ".build-debian-bookworm-abc-999999999"
    live = tmp_path / f".build-debian-bookworm-abc-{os.getpid()}"
    for folder in (dead, live):
        (folder / "rootfs" / "etc").mkdir(parents=True)
    image._remove_stale_builds(tmp_path)
    assert not dead.exists()
    assert live.exists()


def test_initrd_is_limited_to_what_a_virtio_ext4_root_needs(tmp_path: Path) -> None:
    image.configure_rootfs(tmp_path, _recipe())
    assert (tmp_path / "etc/initramfs-tools/conf.d/provision-testbed.conf").read_text() == "MODULES=list\n"
    assert (tmp_path / "etc/initramfs-tools/modules").read_text().split() == ["virtio_pci", "virtio_blk", "ext4"]


def test_a_running_node_keeps_its_disks_and_memory_and_says_so(tmp_path: Path) -> None:
    from provision.testbed import Testbed

    said: list[tuple[str, str]] = []
    tb = Testbed(tmp_path / "state", images_dir=tmp_path / "images", progress=lambda s, t: said.append((s, t)))
    node = NodeRecord("node1", 1, 40001, "10.77.0.11", 1024, 2, ["NVME-node1-1"])
    st = TestbedState("/img/x", "pvroot-1", "tcg", [node])
    tb._ensure_record(st, 1, disks=2, memory_mb=2048, cpus=2, disk_bps_total=None)
    assert st.nodes == [node]  # unchanged: its disks may hold data
    assert said == [
        ("node1", "kept as made: 1 data disks, 1024 MiB (asked 2, 2048); `provision testbed down` first to change them")
    ]
    said.clear()
    tb._ensure_record(st, 1, disks=1, memory_mb=1024, cpus=2, disk_bps_total=None)
    assert said == []
