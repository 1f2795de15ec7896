"""Pure helpers that choose package names and versions per OS, driver branch and GPU.

Everything here is a function from plain values to names, so the branching that decides
what lands on a server is tested directly (tests/unit/test_packages.py), without hosts.

Naming conventions used below, and where they come from:

* NVIDIA's CUDA apt repository (``developer.download.nvidia.com/compute/cuda/repos/<distro>``)
  publishes per-branch driver metapackages: ``nvidia-open-<branch>`` (open kernel modules)
  and ``cuda-drivers-<branch>`` (proprietary modules). Both exist for the branches this
  tool pins (515 and later for ``nvidia-open-<branch>``). Package versions in that repository
  carry the Debian revision ``-1`` (``580.95.05-1``).
* Fabric manager in the CUDA repository is ``nvidia-fabricmanager-<branch>`` up to branch 575;
  from 580 on NVIDIA ships it as plain ``nvidia-fabricmanager`` (version-locked to the driver
  by its version number instead of its name).
* Canonical's Ubuntu archive publishes ``nvidia-driver-<branch>-server[-open]`` and, for each
  kernel, signed precompiled modules ``linux-modules-nvidia-<branch>-server[-open]-<uname -r>``.
  Those signed modules are the only way to load the driver with Secure Boot on and no MOK
  enrolled. Debian has no signed NVIDIA modules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from provision.facts.gpus import supports_open_modules
from provision.facts.system import OsInfo

DriverSource = Literal["cuda-repo", "ubuntu-server"]

# NVIDIA renamed the fabric manager package (dropped the branch suffix) starting with 580.
FABRICMANAGER_UNSUFFIXED_FROM = 580

# The CUDA repository directory name for each supported OS ({distro} in the repo URL).
_CUDA_DISTROS = {("ubuntu", "22.04"): "ubuntu2204", ("ubuntu", "24.04"): "ubuntu2404", ("debian", "12"): "debian12"}

# Packages the base step installs on every node (kept exactly to this set: the testbed
# installs them under TCG, where every package costs seconds).
BASE_PACKAGES = [
    "build-essential",
    "python3-venv",
    # Python.h of the system python the frameworks venv is made from: Triton compiles a
    # C launcher against it the first time a `--compile` (torch.compile) kernel runs.
    "python3-dev",
    "numactl",
    "pciutils",
    "nvme-cli",
    "mdadm",
    "fio",
    "iperf3",
    "chrony",
    "rsync",
]

# unattended-upgrades must never move these: a library upgraded under a loaded kernel
# module is the classic "Failed to initialize NVML: Driver/library version mismatch".
UNATTENDED_BLACKLIST = ["nvidia-", "libnvidia-", "cuda-", "libcuda", "libnccl", "nvidia-fabricmanager"]


def cuda_distro(os_info: OsInfo) -> str:
    """The CUDA repository's name for this OS: ubuntu2204, ubuntu2404 or debian12."""
    try:
        return _CUDA_DISTROS[(os_info.id, os_info.version_id)]
    except KeyError:
        raise ValueError(f"no CUDA repository for {os_info.pretty_name}") from None


def apt_version(version: str) -> str:
    """A driver version as apt wants it: 580.95.05 becomes 580.95.05-1 (the CUDA repo's
    revision); a version that already has a revision is kept as given."""
    return version if "-" in version else f"{version}-1"


def upstream(version: str) -> str:
    """The driver's own version in a package version: 580.95.05-0ubuntu1 -> 580.95.05;
    1:580.95.05-1 -> 580.95.05. Kernel module, nvidia-smi and fabric manager compare this."""
    return version.split(":", 1)[-1].split("-", 1)[0]


def use_open_modules(setting: str, device_ids: list[str]) -> bool:
    """Open vs proprietary kernel modules. ``auto`` takes open modules when every GPU is
    Turing or newer (the open modules refuse older GPUs), and when there are no GPUs at all
    (a host forced into the nvidia step): NVIDIA recommends open modules from 560 on."""
    if setting in ("open", "proprietary"):
        return setting == "open"
    return all(supports_open_modules(d) for d in device_ids)


@dataclass(frozen=True)
class DriverChoice:
    """What the nvidia step installs for the driver, and what it holds."""

    source: DriverSource  # where the driver comes from
    install: list[str]  # apt arguments, versions pinned with '='
    hold: list[str]  # package names to apt-mark hold
    open_modules: bool  # open kernel modules (True) or proprietary
    version: str | None = None  # the driver version setting, made exact where it had to be


def driver_packages(
    source: DriverSource, branch: str, version: str | None, open_modules: bool, kernel: str
) -> DriverChoice:
    """The driver packages for a branch, optionally an exact version.

    cuda-repo: NVIDIA's per-branch metapackage (nvidia-open-<branch> / cuda-drivers-<branch>).
    ubuntu-server: Canonical's nvidia-driver-<branch>-server[-open] plus the signed
    precompiled modules for the running kernel (linux-modules-nvidia-...-<uname -r>).
    """
    if source == "cuda-repo":
        name = cuda_driver_metapackage(branch, open_modules)
        install = [f"{name}={apt_version(version)}" if version else name]
        return DriverChoice(source, install, [name], open_modules, version)
    driver = canonical_driver_package(branch, open_modules)
    modules = f"linux-modules-nvidia-{driver.removeprefix('nvidia-driver-')}-{kernel}"
    # Canonical's versions carry an Ubuntu revision (580.95.05-0ubuntu0.24.04.1), so only a
    # version with a revision can be pinned exactly (canonical_version resolves a bare one).
    pinned = f"{driver}={version}" if version and "-" in version else driver
    return DriverChoice(source, [pinned, modules], [driver, modules], open_modules, version)


def canonical_driver_package(branch: str, open_modules: bool) -> str:
    """Canonical's driver package for the signed-modules path: nvidia-driver-580-server[-open]."""
    return f"nvidia-driver-{branch}-server{'-open' if open_modules else ''}"


def canonical_version(version: str | None, package: str, candidate: str | None) -> str | None:
    """The exact Canonical version for a driver version setting. A bare version (580.95.05)
    names no package there; it is taken when it is the upstream part of apt's candidate,
    and otherwise refused: installing the branch's newest instead would leave the host on
    another driver than the rest of the fleet, found only after its reboot."""
    if not version or "-" in version:
        return version
    if candidate is not None and upstream(candidate) == version:
        return candidate
    offered = f"offers {package} {candidate}" if candidate else f"has no {package}"
    raise ValueError(
        f"nvidia_driver_version {version}: this host takes Canonical's signed driver (Secure Boot), and apt "
        f"{offered}; set nvidia_driver_version to a version it has, revision included "
        f"(apt-cache policy {package}), or unset it to take the branch's newest"
    )


def cuda_driver_metapackage(branch: str, open_modules: bool) -> str:
    """NVIDIA's per-branch driver metapackage. Only NVIDIA's repository has it, so its apt
    candidate also says whether apt has read that repository's lists."""
    return f"nvidia-open-{branch}" if open_modules else f"cuda-drivers-{branch}"


@dataclass(frozen=True)
class HeadersChoice:
    """Which linux-headers packages the nvidia step asks apt for."""

    install: list[str]  # package names, running kernel first
    missing: list[str]  # kernels DKMS must build for whose headers apt does not have
    skipped: list[str]  # other installed kernels (neither running nor newest) apt has no headers for


def kernel_sort_key(release: str) -> list[tuple[int, int | str]]:
    """Orders kernel releases as GRUB's version_sort (sort -V) does: digit runs as
    numbers, so 6.8.0-100-generic comes after 6.8.0-45-generic."""
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.findall(r"\d+|\D+", release)]


def kernel_headers(running: str, running_candidate: str | None, installed: dict[str, str | None]) -> HeadersChoice:
    """Headers for the running kernel and every installed one, so DKMS builds the driver
    for the kernel the host boots next (GRUB's default is the newest: a fresh image often
    has one installed and pending).

    apt fails a whole install when one name has no candidate, so the headers of another
    kernel that left the archive are skipped. The running and the newest kernel's are
    asked for whatever apt has: without them the driver is missing now or after the
    reboot (``missing`` names them; preflight refuses such a host).
    """
    candidates = {**installed, running: running_candidate}
    newest = max(candidates, key=kernel_sort_key)
    required = [running] + ([newest] if newest != running else [])
    others = sorted((k for k in candidates if k not in required), key=kernel_sort_key)
    return HeadersChoice(
        install=[f"linux-headers-{k}" for k in required + [k for k in others if candidates[k]]],
        missing=[k for k in required if candidates[k] is None],
        skipped=[k for k in others if candidates[k] is None],
    )


def signed_modules_package(branch: str, open_modules: bool, kernel: str) -> str:
    """Canonical's signed precompiled module package for this branch and running kernel."""
    flavour = f"{branch}-server-open" if open_modules else f"{branch}-server"
    return f"linux-modules-nvidia-{flavour}-{kernel}"


def choose_driver_source(
    os_info: OsInfo, secure_boot: bool, signed_modules_available: bool, setting: str
) -> DriverSource:
    """Where the driver comes from, or ValueError with what to do.

    With Secure Boot on, an unsigned (DKMS-built) module will not load. Only Ubuntu's
    signed precompiled modules load without a MOK, so ``auto`` takes them there; anywhere
    else the user has to act, and the message says how.
    """
    if setting == "ubuntu-server" and os_info.id != "ubuntu":
        raise ValueError(f"nvidia_driver_source 'ubuntu-server' needs Ubuntu, not {os_info.pretty_name}")
    if not secure_boot:
        return "cuda-repo" if setting == "auto" else setting  # type: ignore[return-value]
    if os_info.id == "ubuntu" and signed_modules_available and setting in ("auto", "ubuntu-server"):
        return "ubuntu-server"
    raise ValueError(secure_boot_advice(os_info, signed_modules_available))


def secure_boot_advice(os_info: OsInfo, signed_modules_available: bool) -> str:
    """The message for a Secure Boot host whose driver would not load."""
    if os_info.id == "ubuntu" and signed_modules_available:
        return (
            "Secure Boot is on and nvidia_driver_source is 'cuda-repo', whose DKMS modules are "
            "unsigned: set nvidia_driver_source to 'auto' or 'ubuntu-server' (Canonical's signed "
            "modules), enroll a MOK for DKMS (mokutil --import), or disable Secure Boot"
        )
    kernel_hint = (
        "use a signed kernel flavour for which Canonical publishes "
        "linux-modules-nvidia-*-server packages (e.g. -generic)"
        if os_info.id == "ubuntu"
        else "Debian has no signed NVIDIA modules"
    )
    return (
        f"Secure Boot is on and no signed NVIDIA modules exist for kernel {os_info.kernel}: "
        f"enroll a MOK so DKMS-built modules load (mokutil --import), disable Secure Boot "
        f"in the firmware, or {kernel_hint}"
    )


def fabricmanager_package(branch: str, version: str | None, source: DriverSource = "cuda-repo") -> tuple[str, str]:
    """(apt argument, name to hold) for fabric manager, version-matched to the driver.

    Fabric manager refuses to start unless its version equals the driver's, so it is
    always pinned: to the exact driver version when one is set, else to the branch
    (``=<branch>.*`` is an apt version glob). NVIDIA's repository drops the branch suffix
    from 580 on; Canonical's archive (the signed ``-server`` drivers) keeps it and builds it
    from its own source, with its own revisions: only the upstream version is matched there.
    """
    if source == "ubuntu-server":
        name = f"nvidia-fabricmanager-{branch}"
        pinned = f"{upstream(version)}-*" if version and "-" in version else f"{branch}.*"
        return f"{name}={pinned}", name
    name = "nvidia-fabricmanager" if int(branch) >= FABRICMANAGER_UNSUFFIXED_FROM else f"nvidia-fabricmanager-{branch}"
    pinned = apt_version(version) if version else f"{branch}.*"
    return f"{name}={pinned}", name


def cuda_toolkit_package(version: str | None) -> str | None:
    """cuda-toolkit-12-8 style metapackage name for "12-8" (or "12.8"); None skips it."""
    if not version:
        return None
    return f"cuda-toolkit-{version.replace('.', '-')}"


NCCL_PACKAGES = ["libnccl2", "libnccl-dev"]


def apt_pin_preferences(branch: str) -> str:
    """apt_preferences(5) text that keeps every NVIDIA driver package on the branch, so a
    plain `apt upgrade` never jumps to the next branch even for packages we did not hold."""
    return (
        "# Written by provision: keep NVIDIA driver packages on branch "
        f"{branch}.\n"
        "Package: /^(nvidia-|libnvidia-|libcuda|cuda-drivers|xserver-xorg-video-nvidia)/\n"
        f"Pin: version {branch}.*\n"
        "Pin-Priority: 1000\n"
    )


def driver_version_ok(answered: str, branch: str, version: str | None) -> bool:
    """Does the driver version nvidia-smi reports match the pin (exact version or branch)?"""
    answered = answered.strip()
    if version:
        return answered == version.split("-")[0]
    return answered.startswith(f"{branch}.")
