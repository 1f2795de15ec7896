"""NVIDIA GPUs and NVSwitches: from sysfs (always), names from lspci when pciutils is
installed, and NVML via nvidia-smi when a driver is loaded. The PCI bus shows a GPU
before any driver exists, which is what preflight needs to choose the driver; it reads
sysfs because preflight runs before base installs pciutils. NVML adds what only the
driver knows.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, replace

from pyinfra.api import FactBase

NVIDIA_VENDOR = "10de"
SEPARATOR = "--- nvml ---"
MINORS_SEPARATOR = "--- minors ---"
PROC_GPUS = "/proc/driver/nvidia/gpus"
LSPCI_SEPARATOR = "--- lspci ---"
SYSFS_PCI = "/sys/bus/pci/devices"
NVML_QUERY = "index,name,pci.bus_id,memory.total,driver_version"

# lspci -Dnn: "0000:17:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] [10de:2330] (rev a1)"
_LSPCI = re.compile(
    r"^(?P<slot>[0-9a-fA-F:.]+)\s+(?P<cls>.+?)\s+\[(?P<cls_id>[0-9a-fA-F]{4})\]:\s+"
    r"(?P<desc>.*)\s+\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
)

# Display controllers (VGA 0300, 3D 0302) are GPUs; bridges (0680) from NVIDIA are NVSwitches.
_GPU_CLASSES = {"0300", "0302"}
_BRIDGE_CLASS = "0680"


@dataclass(frozen=True)
class PciDevice:
    """An NVIDIA PCI function as sysfs (and lspci) report it."""

    slot: str  # domain:bus:device.function
    class_id: str  # PCI class, e.g. 0302
    device_id: str  # 4 hex digits, e.g. 2330 (H100 SXM5)
    description: str  # lspci's name for it; "PCI device 10de:<id>" where lspci is missing

    @property
    def is_gpu(self) -> bool:
        return self.class_id in _GPU_CLASSES

    @property
    def is_nvswitch(self) -> bool:
        return self.class_id == _BRIDGE_CLASS


@dataclass(frozen=True)
class NvmlGpu:
    """What the loaded driver reports for one GPU (nvidia-smi, which is NVML's front end)."""

    index: int  # CUDA/NVML index
    name: str  # "NVIDIA H100 80GB HBM3"
    bus_id: str  # PCI bus id as the driver prints it
    memory_mib: int  # total memory
    driver_version: str  # loaded driver version, e.g. 580.95.05
    # The driver's minor number: the N of /dev/nvidiaN. It follows the kernel's probe order,
    # not NVML's PCI order, so it can differ from the index (a 2x RTX A5000 capture has
    # index 0 at minor 1); None where the driver's /proc files did not say.
    minor: int | None = None

    @property
    def device_file(self) -> str | None:
        return None if self.minor is None else f"/dev/nvidia{self.minor}"


@dataclass(frozen=True)
class Gpus:
    """All NVIDIA devices on a host."""

    pci: tuple[PciDevice, ...]  # every NVIDIA function on the PCI bus
    nvml: tuple[NvmlGpu, ...]  # empty when no driver answers

    @property
    def gpus(self) -> list[PciDevice]:
        return [d for d in self.pci if d.is_gpu]

    @property
    def has_nvswitch(self) -> bool:
        """NVSwitch systems (HGX/DGX) need fabric manager."""
        return any(d.is_nvswitch for d in self.pci)


def parse_lspci(text: str, vendor: str = NVIDIA_VENDOR) -> list[PciDevice]:
    """Parse `lspci -Dnn` lines, keeping one vendor's functions (NVIDIA's unless told)."""
    devices = []
    for line in text.splitlines():
        match = _LSPCI.match(line.strip())
        if match and match["vendor"].lower() == vendor:
            devices.append(PciDevice(match["slot"], match["cls_id"], match["device"].lower(), match["desc"].strip()))
    return devices


def sysfs_pci_command(root: str = SYSFS_PCI) -> str:
    """Shell printing "<address> <vendor> <device> <class>" per PCI function under ``root``,
    as sysfs holds them (0x10de 0x2330 0x030200); no pciutils needed."""
    return (
        f'for d in {root}/*; do [ -r "$d/vendor" ] || continue; '
        'echo "${d##*/} $(cat "$d/vendor") $(cat "$d/device") $(cat "$d/class")"; done'
    )


def parse_sysfs_pci(text: str, vendor: str = NVIDIA_VENDOR) -> list[PciDevice]:
    """Parse sysfs_pci_command's lines, keeping one vendor's functions (NVIDIA's unless
    told). sysfs has no names: the description says vendor and device id instead."""
    devices = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[1].lower() != f"0x{vendor}":
            continue
        slot, _, device, cls = parts
        device_id = device.lower().removeprefix("0x")
        # sysfs class is class, subclass and prog-if (0x030200); lspci's [0302] is the first two.
        devices.append(
            PciDevice(slot, cls.lower().removeprefix("0x")[:4], device_id, f"PCI device {vendor}:{device_id}")
        )
    return devices


def named(devices: list[PciDevice], lspci: list[PciDevice]) -> list[PciDevice]:
    """sysfs's devices with lspci's names where lspci ran; a function only lspci saw is kept."""
    names = {d.slot.lower(): d.description for d in lspci}
    seen = {d.slot.lower() for d in devices}
    return [replace(d, description=names.get(d.slot.lower(), d.description)) for d in devices] + [
        d for d in lspci if d.slot.lower() not in seen
    ]


def parse_nvml_csv(text: str) -> list[NvmlGpu]:
    """Parse `nvidia-smi --query-gpu=<NVML_QUERY> --format=csv,noheader,nounits`."""
    gpus = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        cells = [c.strip() for c in row]
        if len(cells) < 5 or not cells[0].isdigit():
            continue
        gpus.append(NvmlGpu(int(cells[0]), cells[1], cells[2], int(float(cells[3])), cells[4]))
    return gpus


def parse_minors(text: str) -> dict[str, int]:
    """Parse `grep -H '^Device Minor:' /proc/driver/nvidia/gpus/*/information`: the PCI
    address (normalised by bus_key) of each GPU, and its minor number."""
    minors = {}
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(PROC_GPUS)}/([0-9a-fA-F:.]+)/information:Device Minor:\s*(\d+)\s*$", line)
        if match:
            minors[bus_key(match[1])] = int(match[2])
    return minors


def bus_key(address: str) -> str:
    """A PCI address as one key whatever its writer: nvidia-smi prints an 8-digit domain
    (00000000:18:00.0), /proc and sysfs a 4-digit one (0000:18:00.0)."""
    parts = address.strip().lower().split(":")
    if len(parts) == 3 and all(parts) and all(c in "0123456789abcdef" for c in parts[0]):
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    return address.strip().lower()


def supports_open_modules(device_id: str) -> bool:
    """NVIDIA's open kernel modules need Turing or newer; Turing starts at device id 0x1e00
    (TU102), and every later generation (Ampere, Ada, Hopper, Blackwell) sits above it."""
    return int(device_id, 16) >= 0x1E00


class NvidiaDevices(FactBase[Gpus]):
    """NVIDIA GPUs and NVSwitches from sysfs, named by lspci where pciutils is installed,
    plus NVML's view when the driver is loaded."""

    def command(self) -> str:
        return (
            f"{sysfs_pci_command()}; "
            f"echo '{LSPCI_SEPARATOR}'; "
            f"(lspci -Dnn -d {NVIDIA_VENDOR}: 2>/dev/null || true); "
            f"echo '{SEPARATOR}'; "
            f"(nvidia-smi --query-gpu={NVML_QUERY} --format=csv,noheader,nounits 2>/dev/null || true); "
            f"echo '{MINORS_SEPARATOR}'; "
            f"(grep -H '^Device Minor:' {PROC_GPUS}/*/information 2>/dev/null || true)"
        )

    def process(self, output: list[str]) -> Gpus:
        minors = output.index(MINORS_SEPARATOR) if MINORS_SEPARATOR in output else len(output)
        nvml = output.index(SEPARATOR) if SEPARATOR in output[:minors] else minors
        lspci = output.index(LSPCI_SEPARATOR) if LSPCI_SEPARATOR in output[:nvml] else nvml
        by_bus = parse_minors("\n".join(output[minors + 1 :]))
        return Gpus(
            tuple(named(parse_sysfs_pci("\n".join(output[:lspci])), parse_lspci("\n".join(output[lspci + 1 : nvml])))),
            tuple(
                replace(g, minor=by_bus.get(bus_key(g.bus_id)))
                for g in parse_nvml_csv("\n".join(output[nvml + 1 : minors]))
            ),
        )
