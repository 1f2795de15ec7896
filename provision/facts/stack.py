"""What is actually installed and running on a host, for `provision status`: the NVIDIA
packages and the loaded driver, the framework venv's torch/numpy/NCCL, a pending reboot,
the health of the data volume and NFS mounts, and the last backup run.

One shell round trip; each section prints ``key=value`` lines or ``pkg NAME VERSION STATUS``
lines, so the parser stays a pure function of text.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from pyinfra.api import FactBase

from provision.facts.dpkg import LIST_COMMAND, installed_package

# dpkg names whose versions status reports; the driver's own packages vary by branch and
# by who packaged them (NVIDIA's repository or Canonical's), so match by prefix.
PACKAGE_PATTERN = r"^(nvidia-|libnvidia-|cuda-|libnccl|datacenter-gpu-manager)"

BACKUP_SERVICE = "provision-backup.service"
# Written by the backup script after a successful run: systemd forgets its own timestamps
# at a reboot, so `status` would call a host that backed up an hour ago "never".
BACKUP_STAMP = "/var/lib/provision/backup-last-success"

# The venv's versions from its installed distributions' metadata, not by importing them:
# importing torch takes seconds on a GPU node and minutes on an emulated one, and status
# asks every host. torch's NCCL is the nvidia-nccl-cu* wheel its CUDA builds load.
_VENV_PROBE = (
    "import json\n"
    "from importlib import metadata\n"
    "out = {}\n"
    "for name in ('torch', 'numpy', 'nvidia-ml-py'):\n"
    "    try:\n"
    "        out[name] = metadata.version(name)\n"
    "    except Exception:\n"
    "        pass\n"
    "import re\n"
    "for dist in metadata.distributions():\n"
    "    if re.sub(r'[-_.]+', '-', dist.metadata['Name'] or '').lower().startswith('nvidia-nccl-cu'):\n"
    "        out['nccl'] = dist.version\n"
    "print('venv=' + json.dumps(out))\n"
)


@dataclass(frozen=True)
class MountState:
    """One mount point that provision manages."""

    path: str  # mount point
    mounted: bool  # present in the mount table (after an automount was triggered)
    healthy: bool  # answered statfs within the timeout
    fstype: str | None = None  # xfs, ext4, nfs4, autofs


@dataclass(frozen=True)
class InstalledStack:
    """The host's real state, as opposed to the pinned settings."""

    packages: dict[str, str] = field(default_factory=dict)  # installed dpkg package -> version
    loaded_driver: str | None = None  # /sys/module/nvidia/version; None: no module loaded
    nvidia_gpus: int = 0  # NVIDIA display controllers lspci sees
    nvswitches: int = 0  # NVIDIA bridges (NVSwitch) lspci sees
    venv: dict[str, str] = field(default_factory=dict)  # torch, numpy, nccl versions in the venv
    reboot_required: bool = False  # /var/run/reboot-required exists
    mounts: tuple[MountState, ...] = ()  # data volume and NFS shares
    backup_result: str | None = None  # systemd Result of the last backup run ("success", ...)
    backup_finished_epoch: int | None = None  # when it finished, seconds since the epoch
    backup_success_epoch: int | None = None  # last successful backup (BACKUP_STAMP), survives reboots
    nfs_server: str | None = None  # systemctl is-active nfs-server: "active", "inactive", ...


def parse_stack(lines: list[str]) -> InstalledStack:
    """Parse the output of StackFact's command."""
    import json

    packages: dict[str, str] = {}
    values: dict[str, str] = {}
    mounts = []
    for line in lines:
        if line.startswith("pkg "):
            found = installed_package(line)
            if found:
                packages[found[0]] = found[1]
        elif line.startswith("mount "):
            _, path, mounted, healthy, fstype = (line.split() + ["-"] * 5)[:5]
            mounts.append(MountState(path, mounted == "yes", healthy == "yes", None if fstype == "-" else fstype))
        elif "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    finished = values.get("backup_finished", "")
    succeeded = values.get("backup_success", "")
    return InstalledStack(
        packages=packages,
        loaded_driver=values.get("loaded_driver") or None,
        nvidia_gpus=int(values.get("nvidia_gpus") or 0),
        nvswitches=int(values.get("nvswitches") or 0),
        venv=json.loads(values["venv"]) if values.get("venv", "").startswith("{") else {},
        reboot_required=values.get("reboot_required") == "yes",
        mounts=tuple(mounts),
        backup_result=values.get("backup_result") or None,
        backup_finished_epoch=int(finished) if finished.isdigit() and int(finished) > 0 else None,
        backup_success_epoch=int(succeeded) if succeeded.isdigit() and int(succeeded) > 0 else None,
        nfs_server=values.get("nfs_server") or None,
    )


def stack_command(venv_path: str, mount_points: list[str]) -> str:
    """The shell script behind StackFact, built from the host's settings."""
    python = shlex.quote(f"{venv_path}/bin/python")
    checks = " ".join(shlex.quote(m) for m in mount_points)
    return "\n".join(
        [
            'echo "loaded_driver=$(cat /sys/module/nvidia/version 2>/dev/null)"',
            "echo \"nvidia_gpus=$(lspci -nn 2>/dev/null | grep -cE '\\[03(00|02)\\]: .*\\[10de:')\"",
            "echo \"nvswitches=$(lspci -nn 2>/dev/null | grep -cE '\\[0680\\]: .*\\[10de:')\"",
            f"{LIST_COMMAND} | awk '$2 ~ /{PACKAGE_PATTERN}/'",
            f"if [ -x {python} ]; then {python} -c {shlex.quote(_VENV_PROBE)} 2>/dev/null; fi",
            "if [ -f /var/run/reboot-required ]; then echo reboot_required=yes; else echo reboot_required=no; fi",
            # stat first: on an automount point it triggers the mount; a dead server times out.
            f"for m in {checks}; do "
            'h=no; timeout 10 stat -f "$m" >/dev/null 2>&1 && h=yes; '
            # findmnt --target stats the path too: a hung server must not hang the probe.
            't=$(timeout 10 findmnt -n -o FSTYPE --target "$m" 2>/dev/null | tail -n1); '
            'if timeout 10 findmnt -n "$m" >/dev/null 2>&1; then p=yes; else p=no; fi; '
            'echo "mount $m $p $h ${t:--}"; done'
            if checks
            else "true",
            f"systemctl show {BACKUP_SERVICE} -p Result -p ExecMainExitTimestamp --timestamp=unix 2>/dev/null"
            " | sed -e 's/^Result=/backup_result=/' -e 's/^ExecMainExitTimestamp=@*/backup_finished=/'",
            f'echo "backup_success=$(cat {BACKUP_STAMP} 2>/dev/null)"',
            'echo "nfs_server=$(systemctl is-active nfs-server 2>/dev/null)"',
        ]
    )


class StackFact(FactBase[InstalledStack]):
    """Installed versions and health of what `provision up` manages. Example:

    .. code:: python

        stack = host.get_fact(StackFact, venv_path="/opt/provision/venv", mount_points=["/data"])
    """

    def command(self, venv_path: str = "/opt/provision/venv", mount_points: tuple[str, ...] = ()) -> str:
        return stack_command(venv_path, list(mount_points))

    def process(self, output: list[str]) -> InstalledStack:
        return parse_stack(output)
