"""`provision status`: the fleet at a glance, and drift from the pinned settings.

Drift is anything installed or running that differs from what the settings pin: the
driver branch or version, the loaded kernel module, fabric manager, the CUDA toolkit,
NCCL, torch and numpy in the framework venv, the data volume and the NFS mounts. Each drift
names the host, the item, and the expected and actual values. ``judge_host`` is pure so
the rules are tested on plain values.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from provision.facts.stack import InstalledStack
from provision.inventory import Cluster, Node
from provision.rules.packages import upstream


@dataclass(frozen=True)
class Drift:
    """One thing that differs from the pinned settings."""

    item: str  # "torch", "nvidia driver", "mount /data", ...
    expected: str  # what the settings pin
    actual: str  # what the host has


@dataclass
class HostStatus:
    """One row of `provision status`."""

    name: str  # inventory name
    reachable: bool  # False: error says why and the rest is empty
    error: str | None = None  # why the host could not be reached
    os: str | None = None  # "Debian GNU/Linux 12 (bookworm)"
    kernel: str | None = None  # running kernel
    versions: dict[str, str | None] = field(default_factory=dict)  # driver, cuda, fabricmanager, torch, nccl, numpy
    reboot_pending: bool = False  # /var/run/reboot-required, or the loaded driver differs from the installed one
    mounts: dict[str, str] = field(default_factory=dict)  # mount point -> "ok" / "not mounted" / "not answering"
    last_backup_age_s: float | None = None  # seconds since the last successful backup run
    last_backup: str = "never"  # in words
    last_validate: str | None = None  # last verdict from validate history, when recorded
    slurm: str | None = None  # its Slurm state ("idle", "drained: <reason>"); None outside Slurm
    drift: list[Drift] = field(default_factory=list)  # differences from the pinned settings


def nvidia_expected(node: Node, stack: InstalledStack) -> bool:
    switch = node.settings.nvidia
    return switch == "force" or node.has_role("gpu_nodes") or (switch == "auto" and stack.nvidia_gpus > 0)


def _driver_version(stack: InstalledStack) -> str | None:
    """The installed driver version: NVIDIA's packages carry it as their upstream version."""
    for prefix in ("nvidia-driver-", "nvidia-open", "cuda-drivers", "nvidia-kernel-", "libnvidia-compute-"):
        for name, version in sorted(stack.packages.items()):
            if name.startswith(prefix):
                return upstream(version)
    return None


def _package_starting(stack: InstalledStack, prefix: str) -> tuple[str, str] | None:
    for name, version in sorted(stack.packages.items()):
        if name.startswith(prefix):
            return name, upstream(version)
    return None


def versions(stack: InstalledStack) -> dict[str, str | None]:
    fabric = _package_starting(stack, "nvidia-fabricmanager")
    cuda = _package_starting(stack, "cuda-toolkit-")
    nccl = _package_starting(stack, "libnccl2")
    return {
        "driver": stack.loaded_driver or _driver_version(stack),
        "cuda": cuda[0].removeprefix("cuda-toolkit-") if cuda else None,
        "fabricmanager": fabric[1] if fabric else None,
        "torch": stack.venv.get("torch"),
        "nccl": stack.venv.get("nccl") or (nccl[1] if nccl else None),
        "numpy": stack.venv.get("numpy"),
    }


def nvidia_drift(node: Node, stack: InstalledStack) -> list[Drift]:
    s = node.settings
    out = []
    installed = _driver_version(stack)
    wanted = s.nvidia_driver_version or f"{s.nvidia_driver_branch}.*"
    if installed is None or not _version_matches(installed, s.nvidia_driver_branch, s.nvidia_driver_version):
        out.append(Drift("nvidia driver", wanted, installed or "not installed"))
    elif stack.loaded_driver != installed:
        out.append(Drift("loaded nvidia module", installed, stack.loaded_driver or "not loaded"))
    if stack.nvswitches and s.fabric_manager != "skip":
        fabric = _package_starting(stack, "nvidia-fabricmanager")
        if fabric is None or fabric[1] != installed:
            out.append(Drift("fabric manager", installed or wanted, fabric[1] if fabric else "not installed"))
    if s.cuda_toolkit_version and f"cuda-toolkit-{s.cuda_toolkit_version}" not in stack.packages:
        cuda = _package_starting(stack, "cuda-toolkit-")
        out.append(
            Drift(
                "cuda toolkit",
                s.cuda_toolkit_version,
                cuda[0].removeprefix("cuda-toolkit-") if cuda else "not installed",
            )
        )
    if s.install_nccl and "libnccl2" not in stack.packages:
        out.append(Drift("nccl", "libnccl2 installed", "not installed"))
    return out


def _version_matches(installed: str, branch: str, exact: str | None) -> bool:
    return installed == upstream(exact) if exact else installed.split(".")[0] == branch


def venv_drift(node: Node, stack: InstalledStack) -> list[Drift]:
    s = node.settings
    out = []
    torch = stack.venv.get("torch")
    if torch is None or torch.split("+")[0] != s.torch_version:
        out.append(Drift("torch", s.torch_version, torch or "not installed"))
    numpy = stack.venv.get("numpy")
    if s.numpy_version and (numpy or "") != s.numpy_version:
        out.append(Drift("numpy", s.numpy_version, numpy or "not installed"))
    nvml = stack.venv.get("nvidia-ml-py")
    if s.nvml_version and (nvml or "") != s.nvml_version:
        out.append(Drift("nvidia-ml-py", s.nvml_version, nvml or "not installed"))
    return out


def expected_mounts(node: Node, cluster: Cluster) -> list[str]:
    """Mount points `up` creates on this node: the data volume, and the NFS shares."""
    s = node.settings
    mounts = [s.data_mount] if s.data_disks else []
    storage = cluster.storage_node()
    if storage is not None and storage.name != node.name:
        mounts += [f"{s.nfs_mount_root}/{name}" for name in s.nfs_exports]
    return mounts


def mount_item(mount: str) -> str:
    """The drift item of a HostStatus.mounts key: "mount /data", or "nfs-server" for the
    storage node's server side (the summary lists these under mounts, not twice)."""
    return mount if mount == "nfs-server" else f"mount {mount}"


def mount_drift(stack: InstalledStack, wanted: list[str]) -> tuple[dict[str, str], list[Drift]]:
    seen = {m.path: m for m in stack.mounts}
    states, drift = {}, []
    for path in wanted:
        m = seen.get(path)
        state = "ok" if m and m.mounted and m.healthy else ("not answering" if m and m.mounted else "not mounted")
        states[path] = state
        if state != "ok":
            drift.append(Drift(mount_item(path), "mounted and answering", state))
    return states, drift


def judge_host(
    node: Node, cluster: Cluster, stack: InstalledStack, os_name: str, kernel: str, now: float | None = None
) -> HostStatus:
    """Everything `status` says about one reachable host."""
    now = time.time() if now is None else now
    drift = venv_drift(node, stack)
    if nvidia_expected(node, stack):
        drift += nvidia_drift(node, stack)
    mounts, mdrift = mount_drift(stack, expected_mounts(node, cluster))
    status = HostStatus(
        node.name, True, os=os_name, kernel=kernel, versions=versions(stack), mounts=mounts, drift=drift + mdrift
    )
    installed = _driver_version(stack)
    status.reboot_pending = stack.reboot_required or bool(
        stack.loaded_driver and installed and stack.loaded_driver != installed
    )
    backup_text, status.last_backup_age_s = last_backup(stack, now)
    status.last_backup = backup_text or status.last_backup
    storage = cluster.storage_node()
    if storage is not None and storage.name == node.name and node.settings.nfs_exports:
        # The server side of the shares every other node mounts.
        served = stack.nfs_server or "unknown"
        status.mounts["nfs-server"] = "ok" if served == "active" else served
        if served != "active":
            status.drift.append(Drift(mount_item("nfs-server"), "active", served))
    return status


def last_backup(stack: InstalledStack, now: float) -> tuple[str | None, float | None]:
    """(text, age of the last successful backup): from the stamp the backup script writes on
    success, which outlives reboots; a failed run since then is said, never hidden."""
    failed = stack.backup_result not in (None, "success")
    success = stack.backup_success_epoch
    if success is None and stack.backup_result == "success" and stack.backup_finished_epoch:
        success = stack.backup_finished_epoch  # hosts set up before the stamp existed
    if success is None:
        return ("never succeeded (last run: failed)", None) if failed else (None, None)
    age = now - success
    return f"{format_age(age)} ago" + (" (last run: failed)" if failed else " (success)"), age


def format_age(seconds: float) -> str:
    """A duration as people read it: 45s, 12m, 3h, 2d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
