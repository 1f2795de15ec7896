"""Operating system, kernel, CPU and memory of a host."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from pyinfra.api import FactBase

SUPPORTED_OS = {("ubuntu", "22.04"), ("ubuntu", "24.04"), ("debian", "12")}


@dataclass(frozen=True)
class OsInfo:
    """What /etc/os-release and uname say."""

    id: str  # ubuntu, debian
    version_id: str  # 22.04, 24.04, 12
    codename: str | None  # jammy, noble, bookworm
    pretty_name: str  # for people
    kernel: str  # uname -r: the running kernel, whose headers the driver needs
    hostname: str  # the host's own idea of its name
    arch: str  # uname -m

    @property
    def supported(self) -> bool:
        return (self.id, self.version_id) in SUPPORTED_OS


def parse_os_release(text: str) -> dict[str, str]:
    """Parse os-release(5): KEY=value lines, values optionally shell-quoted."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, raw = line.partition("=")
        parts = shlex.split(raw) if raw else [""]
        values[key] = parts[0] if parts else ""
    return values


class Os(FactBase[OsInfo]):
    """OS release, running kernel, hostname and architecture in one round trip."""

    def command(self) -> str:
        return "cat /etc/os-release; echo '---'; uname -r; uname -m; hostname"

    def process(self, output: list[str]) -> OsInfo:
        split = output.index("---")
        release = parse_os_release("\n".join(output[:split]))
        kernel, arch, hostname = ([*output[split + 1 :], "", "", ""])[:3]
        return OsInfo(
            id=release.get("ID", "unknown"),
            version_id=release.get("VERSION_ID", ""),
            codename=release.get("VERSION_CODENAME") or None,
            pretty_name=release.get("PRETTY_NAME", release.get("NAME", "unknown")),
            kernel=kernel,
            hostname=hostname,
            arch=arch,
        )


@dataclass(frozen=True)
class CpuInfo:
    """The processor, from lscpu."""

    model: str  # model name
    sockets: int  # physical packages
    cores: int  # physical cores in all sockets
    threads: int  # logical CPUs
    flags: tuple[str, ...]  # ISA flags (avx2, avx512f, ...)
    numa_nodes: int  # NUMA node count


def parse_lscpu(text: str) -> CpuInfo:
    """Parse `lscpu -J` (util-linux 2.34+)."""
    fields = {e["field"].rstrip(":"): e.get("data") for e in _flatten(json.loads(text)["lscpu"])}
    threads = int(fields.get("CPU(s)") or 1)
    sockets = int(fields.get("Socket(s)") or 1)
    per_socket = int(fields.get("Core(s) per socket") or fields.get("Core(s) per cluster") or threads)
    return CpuInfo(
        model=fields.get("Model name") or "unknown",
        sockets=sockets,
        cores=per_socket * sockets,
        threads=threads,
        flags=tuple((fields.get("Flags") or "").split()),
        numa_nodes=int(fields.get("NUMA node(s)") or 1),
    )


def _flatten(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # lscpu nests fields under "children" in newer util-linux versions.
    out = []
    for entry in entries:
        out.append(entry)
        out += _flatten(entry.get("children", []))
    return out


class Cpu(FactBase[CpuInfo]):
    def requires_command(self) -> str:
        return "lscpu"

    def command(self) -> str:
        return "lscpu -J"

    def process(self, output: list[str]) -> CpuInfo:
        return parse_lscpu("\n".join(output))


def parse_meminfo(text: str) -> int:
    """Total RAM in bytes from /proc/meminfo."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemTotal line in /proc/meminfo")


class Memory(FactBase[int]):
    def command(self) -> str:
        return "cat /proc/meminfo"

    def process(self, output: list[str]) -> int:
        return parse_meminfo("\n".join(output))
