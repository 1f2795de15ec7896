"""Network interfaces with their addresses and link speed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyinfra.api import FactBase

SEPARATOR = "--- speeds ---"


@dataclass(frozen=True)
class Nic:
    """One network interface (loopback left out)."""

    name: str  # eth0, ens4f0np0, ib0
    mac: str | None  # hardware address
    state: str  # operstate: UP, DOWN, UNKNOWN
    mtu: int  # bytes
    addresses: tuple[str, ...]  # "10.0.0.5/24" style, IPv4 and IPv6
    speed_mbps: int | None  # negotiated link speed; None when the driver does not say (virtio)
    kind: str  # link_type: ether, infiniband


def parse_ip_addr(text: str, speeds: dict[str, int | None] | None = None) -> list[Nic]:
    """Parse `ip -j addr` (or `ip -j link`) output, plus a name -> Mbit/s map."""
    speeds = speeds or {}
    nics = []
    for entry in json.loads(text):
        if entry.get("link_type") == "loopback":
            continue
        addresses = tuple(f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", []))
        nics.append(
            Nic(
                name=entry["ifname"],
                mac=entry.get("address"),
                state=entry.get("operstate", "UNKNOWN"),
                mtu=int(entry.get("mtu", 0)),
                addresses=addresses,
                speed_mbps=speeds.get(entry["ifname"]),
                kind=entry.get("link_type", "unknown"),
            )
        )
    return nics


def parse_speeds(lines: list[str]) -> dict[str, int | None]:
    """Parse "name speed" lines; the kernel reports -1 or nothing when the speed is unknown."""
    out: dict[str, int | None] = {}
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        speed = int(parts[1]) if len(parts) > 1 and parts[1].lstrip("-").isdigit() else None
        out[parts[0]] = speed if speed and speed > 0 else None
    return out


class Nics(FactBase[list[Nic]]):
    """Interfaces, addresses and link speeds (from /sys/class/net/*/speed)."""

    def requires_command(self) -> str:
        return "ip"

    def command(self) -> str:
        return (
            f"ip -j addr && echo '{SEPARATOR}' && "
            "for d in /sys/class/net/*; do "
            'echo "${d##*/} $(cat $d/speed 2>/dev/null)"; done'
        )

    def process(self, output: list[str]) -> list[Nic]:
        split = output.index(SEPARATOR)
        return parse_ip_addr("\n".join(output[:split]), parse_speeds(output[split + 1 :]))
