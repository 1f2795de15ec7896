"""The qemu command line of a testbed node, built as data."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.testbed import network, qemu


def _spec(**changes: object) -> qemu.VmSpec:
    base = dict(
        name="node1",
        accel="tcg",
        memory_mb=2048,
        cpus=2,
        kernel=Path("/img/vmlinuz"),
        initrd=Path("/img/initrd.img"),
        root_label="pvroot-abcdef12",
        root_disk=Path("/s/root.qcow2"),
        seed_disk=Path("/s/seed.img"),
        data_disks=(
            qemu.DataDisk(Path("/s/data1.img"), "NVME-node1-1"),
            qemu.DataDisk(Path("/s/data2.img"), "NVME-node1-2"),
        ),
        ssh_port=40022,
        mgmt_mac="52:54:00:77:00:01",
        cluster_mac="52:54:00:77:01:01",
        vde_sock=Path("/s/switch/vde.ctl"),
        run_dir=Path("/s/nodes/node1"),
    )
    base.update(changes)
    return qemu.VmSpec(**base)  # type: ignore[arg-type]


def _after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_kernel_boots_root_by_label_with_serial_console_and_hostname() -> None:
    append = _after(qemu.argv(_spec()), "-append")
    assert append == [
        "root=LABEL=pvroot-abcdef12 rw console=ttyS0 net.ifnames=0 systemd.hostname=node1 panic=-1 mitigations=off"
    ]


def test_tcg_offers_no_avx_and_kvm_uses_max_never_cpu_host() -> None:
    # AVX2 under TCG is emulated far slower than SSE on some hosts: the TCG guest gets a
    # named x86-64-v2 model without AVX.
    assert qemu.argv(_spec())[3:7] == ["-accel", "tcg", "-cpu", "Westmere"]
    kvm = qemu.argv(_spec(accel="kvm"))
    assert _after(kvm, "-accel") == ["kvm"]
    assert _after(kvm, "-cpu") == ["max"]
    with pytest.raises(ValueError, match="accel must be kvm or tcg, not 'hvf'"):
        qemu.argv(_spec(accel="hvf"))


def test_daemonized_with_pidfile_and_no_nographic() -> None:
    argv = qemu.argv(_spec())
    assert "-daemonize" in argv
    assert "-nographic" not in argv
    assert _after(argv, "-pidfile") == ["/s/nodes/node1/qemu.pid"]
    assert _after(argv, "-serial") == ["file:/s/nodes/node1/console.log"]


def test_ssh_forward_binds_loopback_only_and_cluster_nic_is_on_the_switch() -> None:
    netdevs = _after(qemu.argv(_spec()), "-netdev")
    assert netdevs == ["user,id=mgmt,hostfwd=tcp:127.0.0.1:40022-:22", "vde,id=cluster,sock=/s/switch/vde.ctl"]
    devices = _after(qemu.argv(_spec()), "-device")
    nics = [d for d in devices if d.startswith("virtio-net-pci")]
    # management NIC first, so the guest names it eth0 and the cluster NIC eth1
    assert nics == [
        "virtio-net-pci,netdev=mgmt,mac=52:54:00:77:00:01",
        "virtio-net-pci,netdev=cluster,mac=52:54:00:77:01:01",
    ]


def test_data_disk_serials_are_on_the_device_not_the_drive() -> None:
    argv = qemu.argv(_spec())
    assert "virtio-blk-pci,drive=data1,id=dev-data1,serial=NVME-node1-1" in _after(argv, "-device")
    assert all("serial=" not in d for d in _after(argv, "-drive"))
    assert "file=/s/seed.img,format=raw,if=none,id=seed,readonly=on" in _after(argv, "-drive")
    assert "virtio-blk-pci,drive=seed,id=dev-seed,serial=PVSEED" in _after(argv, "-device")
    assert "file=/s/root.qcow2,format=qcow2,if=none,id=root" in _after(argv, "-drive")


def test_disk_throttle_goes_on_each_data_drive_only() -> None:
    drives = _after(qemu.argv(_spec(disk_bps_total=10_485_760)), "-drive")
    throttled = [d for d in drives if "throttling.bps-total=10485760" in d]
    assert [d.split(",id=")[1].split(",")[0] for d in throttled] == ["data1", "data2"]


def test_serial_longer_than_twenty_characters_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than 20"):
        qemu.argv(_spec(data_disks=(qemu.DataDisk(Path("/d"), "NVME-averylongnodename-1"),)))


def test_probe_vm_has_no_seed_and_no_cluster_nic() -> None:
    argv = qemu.argv(_spec(seed_disk=None, data_disks=(), cluster_mac=None, vde_sock=None))
    assert _after(argv, "-netdev") == ["user,id=mgmt,hostfwd=tcp:127.0.0.1:40022-:22"]
    assert [d.split(",")[3] for d in _after(argv, "-drive")] == ["id=root"]


def test_live_throttle_addresses_the_virtio_backend_and_zero_means_unlimited() -> None:
    args = qemu.throttle_args("dev-data2", 1000)
    assert args["id"] == "/machine/peripheral/dev-data2/virtio-backend"
    assert args["bps"] == 1000
    assert args["iops"] == 0
    assert qemu.throttle_args("dev-data2", None)["bps"] == 0


def test_addresses_and_macs_follow_the_node_index() -> None:
    assert network.cluster_address(1) == "10.77.0.11"
    assert network.cluster_address(3) == "10.77.0.13"
    assert network.cluster_prefix() == 24
    assert network.mac(1, 2) == "52:54:00:77:01:02"
