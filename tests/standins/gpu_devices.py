"""Test stand-in GPUs on a testbed VM, for the slurm step and a GPU job (the VMs have none).

What the GPU fact (provision/facts/gpus.py) and the health check read is put in place, each
piece from the capture of a real H200 (tests/fixtures/*_h200_580.159.04*), and nothing else:

- ``/dev/nvidia0`` and ``/dev/nvidia1``: character devices with NVIDIA's major number 195.
  With no driver behind them, opening one fails with ENXIO; a job's device cgroup refusing
  it fails with EPERM first. That difference is what a job test reads.
- ``/usr/bin/nvidia-smi``: a script that answers the two queries provision makes (the GPU
  fact's CSV, the health check's driver version) with the captured GPU's values, twice
  (GPU 1 at the next PCI slot), and fails any other query.
- ``/proc/driver``: a tmpfs over the kernel's directory (procfs cannot be written; only an
  unprivileged user could not mount over it), holding the driver's per-GPU information
  files. Their minor numbers are crossed (index 0 at minor 1), as on a captured 2x RTX A5000:
  gres.conf must name each GPU's own file.

``remove`` takes all of it away again.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from provision import remote
from provision.inventory import Node

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SMI = "/usr/bin/nvidia-smi"
TMPFS = "provision-standin-gpus"  # the tmpfs's source name: `findmnt /proc/driver` shows it

# (NVML index, PCI address as nvidia-smi prints it, minor number)
GPUS = ((0, "00000000:00:06.0", 1), (1, "00000000:00:07.0", 0))


def _captured() -> tuple[str, str, str]:
    """(name, memory MiB, driver version) of the captured H200, from its GPU fact output."""
    text = (FIXTURES / "gpu-facts_h200_580.159.04.txt").read_text()
    line = re.search(r"^0, (NVIDIA [^,]+), 00000000:00:06\.0, (\d+), (\S+)$", text, re.M)
    assert line, "the H200 capture's NVML line"
    return line[1], line[2], line[3]


def _information(bus: str, minor: int) -> str:
    """The driver's information file for one GPU: the captured one, at this bus and minor."""
    text = (FIXTURES / "proc-driver-nvidia_h200_580.159.04.txt").read_text()
    captured = text.split("/information\n", 1)[1].split("\n==", 1)[0]
    captured = re.sub(r"^Bus Location:.*$", f"Bus Location: \t 0000:{bus.split(':', 1)[1]}", captured, flags=re.M)
    return re.sub(r"^Device Minor:.*$", f"Device Minor: \t {minor}", captured, flags=re.M)


def nvidia_smi() -> str:
    name, memory, driver = _captured()
    csv = "".join(f"{i}, {name}, {bus}, {memory}, {driver}\n" for i, bus, _ in GPUS)
    return (
        "#!/bin/sh\n"
        "# TEST STAND-IN for nvidia-smi (tests/standins/gpu_devices.py): the VM has no GPU. It\n"
        "# answers provision's two queries with a captured H200's values, for two GPUs.\n"
        'case "$*" in\n'
        f"  '--query-gpu=index,name,pci.bus_id,memory.total,driver_version --format=csv,noheader,nounits')"
        f" printf %s {shlex.quote(csv)} ;;\n"
        f"  '--query-gpu=driver_version --format=csv,noheader') printf '%s\\n' {' '.join([driver] * len(GPUS))} ;;\n"
        '  *) echo "stand-in nvidia-smi: unsupported query: $*" >&2; exit 9 ;;\n'
        "esac\n"
    )


def install(node: Node) -> None:
    steps = [
        "set -e",
        f"[ ! -e {SMI} ] || grep -q 'TEST STAND-IN' {SMI}",  # never over a real nvidia-smi
        f"printf %s {shlex.quote(nvidia_smi())} > {SMI}",
        f"chmod 755 {SMI}",
        f"findmnt -n /proc/driver >/dev/null || mount -t tmpfs -o size=1m,mode=755 {TMPFS} /proc/driver",
    ]
    for i, bus, minor in GPUS:
        folder = f"/proc/driver/nvidia/gpus/0000:{bus.split(':', 1)[1]}"
        steps += [
            f"mkdir -p {folder}",
            f"printf '%s\\n' {shlex.quote(_information(bus, minor))} > {folder}/information",
            f"[ -e /dev/nvidia{i} ] || mknod -m 666 /dev/nvidia{i} c 195 {i}",
        ]
    result = remote.run(node, "\n".join(steps), timeout=60)
    assert result.ok, result.stderr


def remove(node: Node) -> None:
    result = remote.run(
        node,
        f"if grep -q 'TEST STAND-IN' {SMI} 2>/dev/null; then rm -f {SMI}; fi; "
        f"if findmnt -n -S {TMPFS} /proc/driver >/dev/null; then umount /proc/driver; fi; "
        "rm -f " + " ".join(f"/dev/nvidia{i}" for i, _, _ in GPUS),
        timeout=60,
    )
    assert result.ok, result.stderr
