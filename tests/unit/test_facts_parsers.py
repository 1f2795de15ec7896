"""Fact parsers on captured real outputs (tests/fixtures/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.facts.blockdevices import BlockDevices, parse_by_id, parse_lsblk
from provision.facts.gpus import (
    LSPCI_SEPARATOR,
    NvidiaDevices,
    parse_lspci,
    parse_nvml_csv,
    parse_sysfs_pci,
    supports_open_modules,
)
from provision.facts.nics import Nics, parse_ip_addr, parse_speeds
from provision.facts.system import Os, parse_meminfo, parse_os_release

FIXTURES = Path(__file__).parent.parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "os_id", "version", "codename", "supported"),
    [
        ("os-release_ubuntu-22.04-jammy", "ubuntu", "22.04", "jammy", True),
        ("os-release_ubuntu-24.04.3-noble", "ubuntu", "24.04", "noble", True),
        ("os-release_debian-12-bookworm", "debian", "12", "bookworm", True),
    ],
)
def test_os_fact_reads_release_kernel_and_hostname(name, os_id, version, codename, supported):
    lines = [*fixture(name).splitlines(), "---", "6.8.0-45-generic", "x86_64", "gpu01"]
    info = Os().process(lines)
    assert (info.id, info.version_id, info.codename) == (os_id, version, codename)
    assert info.supported is supported
    assert (info.kernel, info.arch, info.hostname) == ("6.8.0-45-generic", "x86_64", "gpu01")


def test_os_release_handles_quotes_and_comments():
    values = parse_os_release('# comment\nNAME="Debian GNU/Linux"\nID=debian\nEMPTY=\n')
    assert values == {"NAME": "Debian GNU/Linux", "ID": "debian", "EMPTY": ""}


def test_unsupported_os_is_flagged():
    lines = ["ID=ubuntu", 'VERSION_ID="20.04"', "---", "5.4.0", "x86_64", "old"]
    assert Os().process(lines).supported is False


def test_lsblk_server_disks_and_what_they_hold():
    devices = {d.name: d for d in parse_lsblk(fixture("lsblk-J_server-10x-nvme-zfs-mdraid.json"))}
    assert len(devices) == 10
    zfs_disk = devices["nvme1n1"]
    assert zfs_disk.holds == "partitions or arrays (nvme1n1p1, nvme1n1p9)"
    assert not zfs_disk.is_root
    boot_disks = [d for d in devices.values() if d.is_root]
    assert len(boot_disks) == 2, "both mdraid1 members carry / and are root disks"


def test_lsblk_dev_vm_root_disk_holds_data():
    (root,) = parse_lsblk(fixture("lsblk-J-O-b_dev-vm.json"))
    assert root.is_root
    assert root.holds
    assert root.size_bytes > 10 * 2**30


def test_blank_disk_holds_nothing_and_matches_by_id_and_serial():
    text = (
        '{"blockdevices": [{"name": "vdb", "path": "/dev/vdb", "type": "disk", "size": 2147483648,'
        ' "serial": "NVME-node1-1", "fstype": null, "pttype": null, "mountpoints": [null]}]}'
    )
    by_id = parse_by_id(["lrwxrwxrwx 1 root root 9 Nov 29 10:00 virtio-NVME-node1-1 -> ../../vdb"])
    (disk,) = parse_lsblk(text, by_id)
    assert disk.holds is None
    assert not disk.is_root
    assert disk.by_id == ("/dev/disk/by-id/virtio-NVME-node1-1",)
    assert disk.matches("/dev/disk/by-id/virtio-NVME-node1-1")
    assert disk.matches("NVME-node1-1")
    assert not disk.matches("NVME-node1-2")


def test_raid_member_and_filesystem_are_reported_as_data():
    text = (
        '{"blockdevices": ['
        '{"name": "vdb", "type": "disk", "size": 1, "fstype": "linux_raid_member"},'
        '{"name": "vdc", "type": "disk", "size": 1, "fstype": "xfs", "uuid": "u-1"},'
        '{"name": "vdd", "type": "disk", "size": 1, "pttype": "gpt"}]}'
    )
    holds = {d.name: d.holds for d in parse_lsblk(text)}
    assert holds == {
        "vdb": "a RAID superblock (linux_raid_member)",
        "vdc": "a xfs filesystem",
        "vdd": "a gpt partition table",
    }


def test_blockdevices_fact_splits_lsblk_and_by_id_sections():
    lines = [
        *fixture("lsblk-J-O-b_dev-vm.json").splitlines(),
        "--- by-id ---",
        "total 0",
        "lrwxrwxrwx 1 root root 9 Nov 29 10:00 virtio-ROOT -> ../../vda",
    ]
    (root,) = BlockDevices().process(lines)
    assert root.by_id == ("/dev/disk/by-id/virtio-ROOT",)


def test_ip_addr_parser_reads_real_laptop_output():
    nics = {n.name: n for n in parse_ip_addr(fixture("ip-d-j-addr_ubuntu-laptop_netplan-test.json"))}
    assert "lo" not in nics
    assert {"enp0s31f6", "wlan0", "wg0"} <= set(nics)
    assert all("/" in a for n in nics.values() for a in n.addresses)


def test_nic_speeds_unknown_is_none():
    assert parse_speeds(["eth0 25000", "eth1 -1", "wg0", "ib0 200000"]) == {
        "eth0": 25000,
        "eth1": None,
        "wg0": None,
        "ib0": 200000,
    }


def test_nics_fact_combines_addresses_and_speeds():
    lines = [
        fixture("ip-d-j-addr_ubuntu-laptop_netplan-test.json").strip(),
        "--- speeds ---",
        "enp0s31f6 1000",
        "wlan0",
    ]
    nics = {n.name: n for n in Nics().process(lines)}
    assert nics["enp0s31f6"].speed_mbps == 1000
    assert nics["wlan0"].speed_mbps is None


def test_nics_fact_on_a_real_debian12_vm_reads_both_nics_and_no_speed_from_virtio():
    # The fact's exact command run on a testbed VM: virtio reports speed -1 (unknown).
    nics = {n.name: n for n in Nics().process(fixture("ip-j-addr-and-speeds_debian12-testbed-vm.txt").splitlines())}
    assert set(nics) == {"eth0", "eth1"}  # loopback left out
    assert nics["eth1"].addresses == ("10.77.0.11/24",)
    assert nics["eth1"].mac == "52:54:00:77:01:01"
    assert nics["eth0"].state == "UP"
    assert nics["eth0"].mtu == 1500
    assert nics["eth0"].kind == "ether"
    assert nics["eth0"].speed_mbps is None
    assert nics["eth1"].speed_mbps is None


def test_lspci_without_nvidia_finds_nothing():
    assert parse_lspci(fixture("lspci-Dnn_dev-vm-no-gpu.txt")) == []


# lspci -Dnn lines in the format pciutils prints, for devices whose ids are in the PCI ID
# database (10de:2330 H100 SXM5, 10de:22a3 NVSwitch, 10de:20b0 A100 SXM4, 10de:1db4 V100).
# Constructed, not captured: no citable lspci capture from an NVIDIA server was found.
CONSTRUCTED_HGX = """\
0000:18:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)
0000:2a:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)
0000:05:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)
0000:00:00.0 Host bridge [0600]: Intel Corporation Device [8086:0d57]
"""


def test_lspci_finds_gpus_and_nvswitches():
    devices = parse_lspci(CONSTRUCTED_HGX)
    gpus = [d for d in devices if d.is_gpu]
    assert [d.device_id for d in gpus] == ["2330", "2330"]
    assert sum(d.is_nvswitch for d in devices) == 1


# The same two H100s and NVSwitch as sysfs holds them (vendor, device, class per function).
CONSTRUCTED_HGX_SYSFS = """\
0000:00:00.0 0x8086 0x0d57 0x060000
0000:05:00.0 0x10de 0x22a3 0x068000
0000:18:00.0 0x10de 0x2330 0x030200
0000:2a:00.0 0x10de 0x2330 0x030200
"""


def test_nvidia_devices_fact_combines_sysfs_lspci_names_and_nvml():
    lines = [
        *CONSTRUCTED_HGX_SYSFS.splitlines(),
        LSPCI_SEPARATOR,
        *CONSTRUCTED_HGX.splitlines(),
        "--- nvml ---",
        "0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 81559, 580.95.05",
        "1, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 81559, 580.95.05",
    ]
    found = NvidiaDevices().process(lines)
    assert len(found.gpus) == 2
    assert found.has_nvswitch
    assert {g.description for g in found.gpus} == {"NVIDIA Corporation GH100 [H100 SXM5 80GB]"}
    assert [g.driver_version for g in found.nvml] == ["580.95.05", "580.95.05"]


def test_nvidia_devices_fact_finds_gpus_on_a_host_without_lspci():
    # Preflight runs before base installs pciutils: lspci's section is empty there, and the
    # GPUs must still be found (else preflight skips the Secure Boot and headers checks).
    found = NvidiaDevices().process([*CONSTRUCTED_HGX_SYSFS.splitlines(), LSPCI_SEPARATOR, "--- nvml ---"])
    assert [(g.slot, g.class_id, g.device_id) for g in found.gpus] == [
        ("0000:18:00.0", "0302", "2330"),
        ("0000:2a:00.0", "0302", "2330"),
    ]
    assert found.gpus[0].description == "PCI device 10de:2330"
    assert found.has_nvswitch
    assert found.nvml == ()


def test_sysfs_pci_capture_of_the_dev_vm_agrees_with_its_lspci_capture():
    # Both captured on the same VM: the fact's own command (no NVIDIA device there) and
    # lspci -Dnn. sysfs must give the same addresses, classes and device ids as lspci.
    lines = fixture("nvidia-devices-fact_dev-vm-no-gpu.txt").splitlines()
    assert NvidiaDevices().process(lines).pci == ()
    sysfs = "\n".join(lines[: lines.index(LSPCI_SEPARATOR)])
    lspci = fixture("lspci-Dnn_dev-vm-no-gpu.txt")
    for vendor in ("8086", "1af4"):
        from_sysfs = [(d.slot, d.class_id, d.device_id) for d in parse_sysfs_pci(sysfs, vendor)]
        assert from_sysfs == [(d.slot, d.class_id, d.device_id) for d in parse_lspci(lspci, vendor)]
    assert len(parse_sysfs_pci(sysfs, "1af4")) == 5


def make_synthetic_sysfs(root: Path) -> None:
    """A synthetic /sys/bus/pci/devices (this machine has no NVIDIA device): an H100, an
    NVSwitch, a host bridge, and an entry without a vendor file (skipped)."""
    for address, vendor, device, cls in [
        ("0000:18:00.0", "0x10de", "0x2330", "0x030200"),
        ("0000:05:00.0", "0x10de", "0x22a3", "0x068000"),
        ("0000:00:00.0", "0x8086", "0x0d57", "0x060000"),
    ]:
        (root / address).mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
            (root / address / name).write_text(value + "\n")
    (root / "0000:ff:00.0").mkdir()


def test_nvml_csv_parser_reads_the_fields_of_a_real_h200_query():
    import csv

    header, values = list(csv.reader(fixture("nvidia-smi-query-gpu-csv_h200_590.48.01.csv").splitlines()))[:2]
    row = dict(zip([h.strip() for h in header], [v.strip() for v in values], strict=True))
    # The fixture was captured with units ("143771 MiB"); the fact asks for nounits.
    line = ", ".join(["0", row["name"], row["pci.bus_id"], row["memory.total [MiB]"].split()[0], row["driver_version"]])
    (gpu,) = parse_nvml_csv(line)
    assert (gpu.name, gpu.memory_mib, gpu.driver_version) == ("NVIDIA H200", 143771, "590.48.01")


@pytest.mark.parametrize(
    ("device_id", "open_ok"),
    [
        ("1db4", False),  # V100 (Volta): proprietary modules only
        ("1e04", True),  # RTX 2080 Ti (Turing): the first generation the open modules support
        ("20b0", True),  # A100 SXM4 (Ampere)
        ("2330", True),  # H100 SXM5 (Hopper)
        ("26b9", True),  # L40S (Ada)
        ("2901", True),  # B200 (Blackwell)
    ],
)
def test_open_kernel_modules_need_turing_or_newer(device_id, open_ok):
    assert supports_open_modules(device_id) is open_ok


def test_meminfo_total_in_bytes():
    assert parse_meminfo("MemTotal:       16384 kB\nMemFree: 1 kB\n") == 16384 * 1024


def test_apt_source_files_say_which_file_names_which_repository():
    from provision.facts.apt import AptSourceFiles

    lines = [
        *fixture("apt-sources_dev-vm-debian12.txt").splitlines(),
        "##PYINFRA_FILE /etc/apt/sources.list.d/cuda-debian12-x86_64.list",
        "# deb http://old.example/ /",
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /",
    ]
    files = AptSourceFiles().process(lines)
    assert {path: [(r.url, r.distribution) for r in repos] for path, repos in files.items()} == {
        "/etc/apt/sources.list.d/debian.sources": [
            ("http://deb.debian.org/debian", "bookworm"),
            ("http://deb.debian.org/debian", "bookworm-updates"),
            ("http://deb.debian.org/debian-security", "bookworm-security"),
        ],
        "/etc/apt/sources.list.d/cuda-debian12-x86_64.list": [
            ("https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/", "/")
        ],
    }


def captured_outputs(name: str) -> dict[str, list[str]]:
    """A capture file of `$ command`, `# exit N`, output blocks: the command -> its output."""
    blocks: dict[str, list[str]] = {}
    for line in fixture(name).splitlines():
        if line.startswith("$ "):
            current = blocks.setdefault(line[2:], [])
        elif not line.startswith("# exit "):
            current.append(line)
    return blocks


def test_the_gpu_fact_on_a_real_h200_names_its_device_file_from_the_drivers_minor_number():
    # The fact's own command, run on a lent H200 (a one-GPU VM without pciutils) by
    # benchmarks/gpu_check.sh.
    outputs = captured_outputs("gpu-facts_h200_580.159.04.txt")
    found = NvidiaDevices().process(outputs[NvidiaDevices().command()])
    assert [(g.slot, g.class_id, g.device_id, g.description) for g in found.gpus] == [
        ("0000:00:06.0", "0302", "2335", "PCI device 10de:2335")
    ]
    (gpu,) = found.nvml
    assert (gpu.index, gpu.name, gpu.memory_mib, gpu.driver_version) == (0, "NVIDIA H200", 143771, "580.159.04")
    assert (gpu.minor, gpu.device_file) == (0, "/dev/nvidia0")
    assert "/dev/nvidia0" in fixture("dev-nvidia_h200_580.159.04.txt")


def test_the_reboot_probe_on_a_real_h200_reads_the_loaded_driver_and_nvidia_smis_answer():
    from provision.facts.probes import RebootProbe, parse_reboot_state

    state = parse_reboot_state(captured_outputs("gpu-facts_h200_580.159.04.txt")[RebootProbe().command()])
    assert state.loaded_module == state.smi_version == "580.159.04"
    assert state.installed_module is None  # that VM's image has no modinfo for the module


def test_a_gpu_whose_minor_number_is_not_its_index_gets_its_own_device_file():
    # The 2x RTX A5000 capture: NVML index 0 (bus 81:00.0) is the driver's minor 1, index 1
    # (C1:00.0) is minor 0. /proc lines in the format the H200's driver printed them.
    lines = [
        LSPCI_SEPARATOR,
        "--- nvml ---",
        "0, NVIDIA RTX A5000, 00000000:81:00.0, 24564, 590.44.01",
        "1, NVIDIA RTX A5000, 00000000:C1:00.0, 24564, 590.44.01",
        "--- minors ---",
        "/proc/driver/nvidia/gpus/0000:81:00.0/information:Device Minor: \t 1",
        "/proc/driver/nvidia/gpus/0000:c1:00.0/information:Device Minor: \t 0",
    ]
    assert [(g.index, g.device_file) for g in NvidiaDevices().process(lines).nvml] == [
        (0, "/dev/nvidia1"),
        (1, "/dev/nvidia0"),
    ]


def test_without_the_drivers_proc_files_a_gpu_has_no_device_file_rather_than_a_guessed_one():
    lines = [LSPCI_SEPARATOR, "--- nvml ---", "0, NVIDIA H200, 00000000:00:06.0, 143771, 580.159.04"]
    (gpu,) = NvidiaDevices().process(lines).nvml
    assert (gpu.minor, gpu.device_file) == (None, None)
