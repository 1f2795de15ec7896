"""The filesystem on one device, probed with blkid -p (no blkid cache)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pyinfra.api import FactBase


@dataclass(frozen=True)
class Filesystem:
    """What blkid finds on a device (uuid, type and label all None when it holds nothing)."""

    uuid: str | None  # filesystem UUID
    type: str | None  # xfs, ext4, ...
    label: str | None  # filesystem label
    error: str | None = None  # why blkid could not tell; the device is then never formatted


BLKID_STATUS = "provision-blkid-exit="  # the line after blkid's output giving its exit status


def parse_blkid_export(lines: list[str]) -> Filesystem:
    """Parse `blkid -p -o export DEV` (KEY=value lines)."""
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    return Filesystem(values.get("UUID"), values.get("TYPE"), values.get("LABEL"))


def parse_blkid_probe(lines: list[str]) -> Filesystem:
    """Parse DeviceFilesystem's output: blkid's, then its exit status (0 found, 2 nothing
    found). Any other status, or none, is an error rather than a blank device."""
    status = [line.removeprefix(BLKID_STATUS) for line in lines if line.startswith(BLKID_STATUS)]
    if status == ["0"]:
        return parse_blkid_export([line for line in lines if not line.startswith(BLKID_STATUS)])
    if status == ["2"]:
        return Filesystem(None, None, None)
    why = f"blkid -p failed (exit {status[-1]})" if status else "blkid -p gave no exit status"
    return Filesystem(None, None, None, error=why)


class DeviceFilesystem(FactBase[Filesystem]):
    """The filesystem on one device, probed directly (no blkid cache)."""

    def command(self, device: str) -> str:
        # The status is printed rather than returned: blkid exits 2 on a blank device,
        # which pyinfra would take for a failed fact.
        return f"blkid -p -o export {shlex.quote(device)}; echo {BLKID_STATUS}$?"

    def process(self, output: list[str]) -> Filesystem:
        return parse_blkid_probe(output)
