"""The facts `provision facts` (and `status`) gather, and their JSON-ready summary."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from provision.facts.blockdevices import BlockDevices
from provision.facts.gpus import NvidiaDevices
from provision.facts.nics import Nics
from provision.facts.system import Cpu, Memory, Os

HOST_FACTS: dict[str, tuple[type, dict[str, Any]]] = {
    "os": (Os, {}),
    "cpu": (Cpu, {}),
    "memory": (Memory, {}),
    "block_devices": (BlockDevices, {}),
    "nics": (Nics, {}),
    "gpus": (NvidiaDevices, {}),
}


@dataclass
class HostFacts:
    """One host's facts, flattened for tables and JSON."""

    name: str  # inventory name
    reachable: bool  # False: error says why, the rest is empty
    error: str | None = None  # why the host could not be reached
    hostname: str | None = None  # the host's own hostname
    os: dict[str, Any] = field(default_factory=dict)  # id, version_id, codename, pretty_name, supported
    kernel: str | None = None  # running kernel
    cpu: dict[str, Any] = field(default_factory=dict)  # model, sockets, cores, threads, numa_nodes
    memory_bytes: int = 0  # total RAM
    block_devices: list[dict[str, Any]] = field(default_factory=list)  # path, by_id, holds, is_root, ...
    nics: list[dict[str, Any]] = field(default_factory=list)  # name, addresses, speed_mbps, ...
    gpus: list[dict[str, Any]] = field(default_factory=list)  # slot, device_id, description (+nvml)
    nvswitches: int = 0  # NVSwitch bridges (fabric manager needed when > 0)


def summarize(name: str, facts: dict[str, Any] | None, error: str | None) -> HostFacts:
    if facts is None:
        return HostFacts(name, reachable=False, error=error or "no facts gathered")
    os_info, cpu, gpus = facts["os"], facts["cpu"], facts["gpus"]
    nvml = {g.bus_id.lower()[-12:]: g for g in gpus.nvml}
    return HostFacts(
        name=name,
        reachable=True,
        hostname=os_info.hostname,
        os={**asdict(os_info), "supported": os_info.supported},
        kernel=os_info.kernel,
        # Without copying the flags (a hundred strings a host) only to drop them.
        cpu={f.name: getattr(cpu, f.name) for f in fields(cpu) if f.name != "flags"},
        memory_bytes=facts["memory"],
        block_devices=[{**asdict(d), "holds": d.holds, "is_root": d.is_root} for d in facts["block_devices"]],
        nics=[asdict(n) for n in facts["nics"]],
        gpus=[
            {**asdict(g), "nvml": asdict(nvml[g.slot.lower()[-12:]]) if g.slot.lower()[-12:] in nvml else None}
            for g in gpus.gpus
        ],
        nvswitches=sum(1 for d in gpus.pci if d.is_nvswitch),
    )


def as_json(facts: HostFacts) -> dict[str, Any]:
    """The JSON form: a HostFacts holds JSON-ready values already (summarize built them
    with asdict), so a shallow copy; asdict's deep copy again cost more than the gather's
    own parsing at 1,000 hosts."""
    return dict(vars(facts))
