"""Preflight: look at every host before anything is changed, and stop the ones that
cannot be provisioned, with the reason and what to do. Changes nothing.

Checks: supported OS; apt/dpkg lock free (waits a bounded time when another apt, usually
unattended-upgrades, holds it); free space on /; when the volumes step runs, the data
disks it would use (present, not the system disk, no foreign data); training_uid free
or already the training user's; and, when the nvidia step is in the run and will touch
the host: x86_64, GPU generation (open vs proprietary modules), Secure Boot vs signed
modules, headers for the running kernel.
A pending reboot is reported, not refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import server

from provision.engine import Step, current_node, current_steps, note, refuse
from provision.facts.blockdevices import BlockDevice, BlockDevices
from provision.facts.gpus import Gpus, NvidiaDevices
from provision.facts.probes import HostProbe, Probe, lock_wait_command
from provision.facts.system import SUPPORTED_OS, Os, OsInfo
from provision.rules import disks as disk_rules
from provision.rules import nvidia as nvidia_rules
from provision.rules.packages import (
    choose_driver_source,
    kernel_headers,
    signed_modules_package,
    use_open_modules,
)
from provision.settings import Settings


@dataclass(frozen=True)
class Verdict:
    """Preflight's judgement of one host."""

    problems: list[str]  # reasons to stop this host; empty means go on
    notes: list[str]  # things worth saying that stop nothing
    wait_for_lock: bool  # an apt/dpkg lock is held now: wait for it (bounded) first


def judge(
    os_info: OsInfo,
    probe: HostProbe,
    gpus: Gpus,
    disks: list[BlockDevice],
    settings: Settings,
    nvidia_runs: bool,
    volumes_runs: bool = False,
    hostname: str = "host",
) -> Verdict:
    """The pure verdict: facts in, problems and notes out.

    When the volumes step is part of this run, its disk checks (missing disk, system disk,
    someone else's data) are made here, so such a host stops before base changes anything."""
    problems: list[str] = []
    notes: list[str] = []
    if not os_info.supported:
        wanted = ", ".join(f"{i} {v}" for i, v in sorted(SUPPORTED_OS))
        problems.append(f"{os_info.pretty_name} is not supported (supported: {wanted})")
    if probe.root_free_gb < settings.min_root_free_gb:
        problems.append(
            f"only {probe.root_free_gb:.1f} GB free on /, {settings.min_root_free_gb} GB needed "
            "(free space, or lower min_root_free_gb)"
        )
    if volumes_runs:
        problems += [p.removeprefix(f"{hostname}: ") for p in disk_rules.check_disks(settings, disks, hostname)]
    problems += account_problems(probe, settings)
    if probe.reboot_pending:
        notes.append("a reboot was already pending before this run (/var/run/reboot-required)")
    if nvidia_runs:
        problems += arch_problems(os_info)
    if nvidia_runs and os_info.supported:
        nv_problems, nv_notes = nvidia_checks(os_info, probe, gpus, settings)
        problems += nv_problems
        notes += nv_notes
    return Verdict(problems, notes, bool(probe.apt_locks_held))


def account_problems(probe: HostProbe, settings: Settings) -> list[str]:
    """The training user and its group must get training_uid on every node: files on the
    NFS shares carry numeric ids, so a user with another uid on one node could not write
    its own checkpoints there. An existing account is never renumbered behind its back."""
    user, uid = settings.training_user, settings.training_uid
    problems = []
    if probe.user_uid is not None and probe.user_uid != uid:
        problems.append(
            f"user {user} exists with uid {probe.user_uid}, training_uid is {uid} "
            f"(set training_uid: {probe.user_uid} for every node, or renumber {user} by hand)"
        )
    elif probe.user_uid is None and probe.uid_owner:
        problems.append(f"uid {uid} (training_uid) belongs to user {probe.uid_owner}; choose a free training_uid")
    if probe.group_gid is not None and probe.group_gid != uid:
        problems.append(
            f"group {user} exists with gid {probe.group_gid}, training_uid is {uid} "
            f"(set training_uid to match on every node, or renumber the group by hand)"
        )
    elif probe.group_gid is None and probe.gid_owner:
        problems.append(f"gid {uid} (training_uid) belongs to group {probe.gid_owner}; choose a free training_uid")
    return problems


def arch_problems(os_info: OsInfo) -> list[str]:
    """The nvidia step knows only NVIDIA's x86_64 repository (nvidia_repo_url) and packages;
    on aarch64 (GH200) it would fail after base had already changed the host."""
    if os_info.arch == "x86_64":
        return []
    return [
        f"architecture {os_info.arch or 'unknown'} (uname -m): the nvidia step supports x86_64 only, "
        "aarch64 is not supported yet; set nvidia: skip for this host or run with --skip nvidia"
    ]


def nvidia_checks(os_info: OsInfo, probe: HostProbe, gpus: Gpus, settings: Settings) -> tuple[list[str], list[str]]:
    """GPU generation, Secure Boot against signed modules, kernel headers."""
    problems, notes = [], []
    ids = [g.device_id for g in gpus.gpus]
    open_modules = use_open_modules(settings.nvidia_kernel_modules, ids)
    if settings.nvidia_kernel_modules == "open" and not use_open_modules("auto", ids):
        problems.append(
            "nvidia_kernel_modules is 'open' but a GPU is older than Turing, which "
            "the open modules do not drive; use 'auto' or 'proprietary'"
        )
    names = sorted({g.description for g in gpus.gpus}) or ["no NVIDIA GPU on the PCI bus"]
    notes.append(
        f"GPUs: {'; '.join(names)} -> {'open' if open_modules else 'proprietary'} modules"
        + (", NVSwitch (fabric manager)" if gpus.has_nvswitch else "")
    )
    signed = signed_modules_package(settings.nvidia_driver_branch, open_modules, os_info.kernel)
    # An image shipped before any apt update has no package lists, so every candidate reads
    # "none": what apt has is known only after base's update, and the nvidia step checks then.
    unread = probe.apt_lists == 0
    try:
        source = choose_driver_source(
            os_info, probe.secure_boot.enabled, probe.candidates.get(signed) is not None, settings.nvidia_driver_source
        )
        notes.append(f"Secure Boot: {probe.secure_boot.detail}; driver from {source}")
    except ValueError as e:
        if unread and os_info.id == "ubuntu":
            notes.append(
                f"Secure Boot: {probe.secure_boot.detail}; apt has no package lists yet, so "
                "whether Canonical's signed modules exist is checked by the nvidia step"
            )
        else:
            problems.append(str(e))
    if settings.nvidia_kernel_headers:
        if unread:
            notes.append("apt has no package lists yet: the kernel headers are checked by the nvidia step")
        else:
            problems += headers_problems(os_info.kernel, probe)
    return problems, notes


def headers_problems(running: str, probe: HostProbe) -> list[str]:
    """DKMS builds the driver for the running kernel and for the newest installed one (the
    one the next boot runs): apt must have headers for both."""
    problems = []
    for kernel in kernel_headers(running, probe.headers_candidate, probe.kernels).missing:
        if kernel == running:
            problems.append(
                f"no linux-headers-{kernel} in the apt sources: the driver cannot be built "
                "for the running kernel; boot a kernel whose headers are published or add "
                "the repository that has them"
            )
        else:
            problems.append(
                f"no linux-headers-{kernel} in the apt sources: the driver cannot be built "
                f"for kernel {kernel}, the newest installed, which the next boot runs; "
                "remove that kernel's package or add the repository that has its headers"
            )
    return problems


@deploy("Preflight")
def preflight() -> None:
    node = current_node()
    settings = node.settings
    os_info = host.get_fact(Os)
    gpus = host.get_fact(NvidiaDevices)
    # Like the volumes check: the nvidia checks are this run's business only when the
    # nvidia step is in it (`up --skip nvidia` on a Secure Boot host must not stop).
    runs = "nvidia" in current_steps() and nvidia_rules.skip_reason(node, gpus) is None
    kernel = os_info.kernel
    branch = settings.nvidia_driver_branch
    checks = (signed_modules_package(branch, True, kernel), signed_modules_package(branch, False, kernel))
    probe = host.get_fact(
        Probe, packages=checks if os_info.id == "ubuntu" else (), user=settings.training_user, uid=settings.training_uid
    )
    volumes_runs = "volumes" in current_steps() and disk_rules.applies(node) is None
    verdict = judge(
        os_info,
        probe,
        gpus,
        host.get_fact(BlockDevices) or [],
        settings,
        runs,
        volumes_runs=volumes_runs,
        hostname=node.name,
    )
    for text in verdict.notes:
        note(f"preflight: {text}")
    if verdict.problems:
        refuse("preflight", "; ".join(verdict.problems))
        return
    if verdict.wait_for_lock:
        server.shell(
            name=f"Wait for apt/dpkg lock ({probe.lock_holders or 'unknown holder'})",
            commands=[lock_wait_command(settings.apt_lock_wait_s)],
        )


step = Step("preflight", preflight, "check every host first (OS, disks, locks, GPUs, Secure Boot); changes nothing")
