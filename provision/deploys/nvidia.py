"""NVIDIA stack: CUDA apt repository, pinned driver branch, open or proprietary modules,
nouveau blacklisted, headers, holds, persistence daemon, fabric manager, CUDA toolkit.

Runs on hosts with an NVIDIA GPU (lspci), on hosts in the gpu_nodes group, and wherever
the ``nvidia`` setting says ``force``. Package names come from the pure helpers in
``packages.py``. Reboots are not done here: ``provision.up.reboots`` decides after the step.
"""

from __future__ import annotations

from collections.abc import Callable
from io import StringIO
from typing import Any

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import apt, files, server

from provision.engine import Step, current_node, note, refuse, skip
from provision.facts.apt import AptSourceFiles
from provision.facts.gpus import Gpus, NvidiaDevices
from provision.facts.probes import HostProbe, Probe, lock_wait_command
from provision.facts.system import Os, OsInfo
from provision.operations.nvidia import apt_pinned, driver_daemon, fabricmanager, held, verified_download
from provision.operations.stamps import follow_up
from provision.resources import render_template, templates_dir
from provision.rules import packages as pkgs
from provision.rules import slurm
from provision.rules.nvidia import applies, driver_choice, other_sources, skip_reason, wants_fabricmanager
from provision.settings import Settings, nccl_version_pattern

KEYRING = "/etc/apt/keyrings/cuda-archive-keyring.gpg"
PIN_FILE = "/etc/apt/preferences.d/90-provision-nvidia"
NOUVEAU_FILE = "/etc/modprobe.d/blacklist-nouveau.conf"
PERSISTENCED_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/provision.conf"


def sources_file(os_info: OsInfo) -> str:
    return f"/etc/apt/sources.list.d/cuda-{pkgs.cuda_distro(os_info)}.sources"


def sources_text(url: str) -> str:
    """deb822 .sources for NVIDIA's flat repository (Suites: "/" and no Components)."""
    return (
        "# Written by provision: NVIDIA CUDA repository (nvidia_repo_url).\n"
        "Types: deb\n"
        f"URIs: {url}\n"
        "Suites: /\n"
        f"Signed-By: {KEYRING}\n"
    )


def any_changed(*ops: object) -> Callable[[], bool]:
    return lambda: any(op.did_change() for op in ops)  # type: ignore[attr-defined]


def wait_for_apt_locks(settings: Settings, **global_args: object) -> None:
    """apt-get update fails at once while another apt (apt-daily, unattended-upgrades)
    holds the lists lock; DPkg::Lock::Timeout covers only the dpkg lock."""
    server.shell(name="wait for apt locks", commands=[lock_wait_command(settings.apt_lock_wait_s)], **global_args)  # type: ignore[arg-type]


def repository(settings: Settings, os_info: OsInfo, repo_candidate: str | None) -> bool:
    """NVIDIA's repository, its key and the branch pin; False when the host was refused.
    ``repo_candidate``: apt's candidate of a package only that repository has; None means
    apt has not read the repository's lists (yet)."""
    distro = pkgs.cuda_distro(os_info)
    url = settings.nvidia_repo_url.format(distro=distro)
    removed, problems = other_sources(host.get_fact(AptSourceFiles), url, sources_file(os_info))
    if problems:
        refuse("nvidia", "; ".join(problems))
        return False
    apt.packages(
        name="download tools (curl, CA certificates)", packages=["curl", "ca-certificates"], no_recommends=True
    )
    keyring_dir = files.directory(name="/etc/apt/keyrings", path="/etc/apt/keyrings", mode="755")
    keyring = verified_download(
        name="CUDA repository keyring",
        src=settings.nvidia_keyring_url.format(distro=distro),
        dest=KEYRING,
        sha256=settings.nvidia_keyring_sha256,
        fingerprint=settings.nvidia_key_fingerprint,
    )
    removals = []
    for path in removed:  # before ours is written, so no run ever leaves both in place
        note(
            f"nvidia: removes {path}: it names NVIDIA's CUDA repository, which the nvidia step now "
            f"configures in {sources_file(os_info)}"
        )
        removals.append(
            files.file(name=f"remove {path} (same CUDA repository, other Signed-By)", path=path, present=False)
        )
    sources = files.put(
        name="CUDA repository (deb822, Signed-By)",
        src=StringIO(sources_text(url)),
        dest=sources_file(os_info),
        mode="644",
    )
    pin = files.put(
        name=f"apt pin: NVIDIA driver branch {settings.nvidia_driver_branch}",
        src=StringIO(pkgs.apt_pin_preferences(settings.nvidia_driver_branch)),
        dest=PIN_FILE,
        mode="644",
    )
    # A run that died after writing these files but before apt update finished changes none
    # of them when re-run, so a missing candidate also asks for the update.
    if repo_candidate is None:
        wait_for_apt_locks(settings)
        apt.update(name="apt update (CUDA repository not read yet)")
    else:
        changed = any_changed(keyring_dir, keyring, sources, pin, *removals)
        wait_for_apt_locks(settings, _if=changed)
        apt.update(name="apt update (CUDA repository changed)", _if=changed)
    return True


def kernel_side(settings: Settings, os_info: OsInfo, probe: HostProbe) -> None:
    blacklist = templates_dir() / "nvidia" / "blacklist-nouveau.conf.j2"
    nouveau = files.template(name="blacklist nouveau", dest=NOUVEAU_FILE, mode="644", src=str(blacklist))
    follow_up(
        "update initramfs (nouveau blacklisted)",
        "initramfs-nouveau",
        [blacklist.read_text()],
        ["update-initramfs -u"],
        nouveau.did_change,
    )
    if not settings.nvidia_kernel_headers:
        return
    # Headers for every installed kernel, not only the running one: the reboot after the
    # driver install boots the newest, and DKMS builds only for kernels with headers.
    headers = pkgs.kernel_headers(os_info.kernel, probe.headers_candidate, probe.kernels)
    for kernel in headers.skipped:
        note(
            f"nvidia: no linux-headers-{kernel} in the apt sources: no driver module for kernel {kernel} "
            "(neither running nor newest)"
        )
    apt.packages(
        name=f"kernel headers for {', '.join(h.removeprefix('linux-headers-') for h in headers.install)}",
        packages=headers.install,
        no_recommends=True,
    )


def extra_packages(settings: Settings) -> list[str]:
    """The CUDA toolkit and container toolkit packages the settings ask for (NCCL is
    installed on its own, pinned to the toolkit's CUDA version: ``nccl_pins``)."""
    toolkit = pkgs.cuda_toolkit_package(settings.cuda_toolkit_version)
    extras = [toolkit] if toolkit else []
    return extras + (["nvidia-container-toolkit"] if settings.install_container_toolkit else [])


def nccl_pins(settings: Settings) -> dict[str, str]:
    """NCCL package -> apt version glob, or nothing when NCCL is not wanted."""
    if not settings.install_nccl:
        return {}
    pattern = nccl_version_pattern(settings.cuda_toolkit_version, settings.nccl_version)
    return {name: pattern for name in pkgs.NCCL_PACKAGES}


def wants_cuda_repository_extras(settings: Settings) -> bool:
    return bool(extra_packages(settings) or nccl_pins(settings))


def drain_before_driver_change(settings: Settings, name: str) -> None:
    """On a Slurm node whose driver packages are about to change: drained first (the reboot's
    own reason) and its jobs waited for, bounded. The new userspace libraries beside the
    still-loaded old module fail every CUDA call ("driver/library version mismatch") until
    the reboot; provision.up.reboots then reboots and resumes the node, or resumes it at once
    where no reboot is needed. It fails closed like the reboot's drain: Slurm not answering,
    or jobs still running at the end, fails the host before any package changed. On a host
    without slurmd the command does nothing."""
    # The wait shares the step's deadline with the installs after it: it gets half of it.
    wait_s = max(0, min(settings.slurm_drain_wait_s, settings.step_timeout_s // 2))
    server.shell(
        name="Slurm: drain before the driver changes, wait for the node's jobs",
        commands=[slurm.drain_for_reboot(name, wait_s, held_back="driver not changed")],
        _timeout=wait_s + 4 * slurm.SLURM_CALL_S + 60,
    )


def driver(settings: Settings, choice: pkgs.DriverChoice, gpus: Gpus, name: str) -> list[str]:
    """Install the driver (and fabric manager, toolkit, extras); return the names to hold."""
    driver_packages: dict[str, Any] = {"packages": choice.install, "extra_install_args": "--allow-change-held-packages"}
    # apt.packages' own decision, asked before its operation is made (pyinfra runs operations
    # in the order they are made, and the drain must come first).
    if any(True for _ in apt.packages._inner(**driver_packages)):
        drain_before_driver_change(settings, name)
    apt.packages(
        name=f"NVIDIA driver {settings.nvidia_driver_branch} "
        f"({'open' if choice.open_modules else 'proprietary'} modules, {choice.source})",
        **driver_packages,
    )
    hold = list(choice.hold)
    if wants_fabricmanager(settings, gpus):
        version = choice.version
        arg, name = pkgs.fabricmanager_package(settings.nvidia_driver_branch, version, choice.source)
        fabricmanager(name=f"fabric manager {arg}", package=name, driver_package=choice.hold[0], version=version)
        hold.append(name)
    extras = extra_packages(settings)
    if extras:
        apt.packages(name="CUDA toolkit and extras", packages=extras, no_recommends=True)
    nccl = nccl_pins(settings)
    if nccl:
        pattern = next(iter(nccl.values()))
        apt_pinned(name=f"NCCL {pattern}", packages=nccl)
        # Held, so neither apt upgrade nor a later toolkit install moves NCCL to a build
        # for another CUDA version.
        hold += list(nccl)
    return hold


# systemctl try-restart leaves a daemon that is not running alone.
PERSISTENCED_RESTART = (
    'if [ "$(cat /sys/module/nvidia/version 2>/dev/null)" = "$(modinfo -F version nvidia 2>/dev/null | head -n1)" ]; '
    "then systemctl try-restart nvidia-persistenced.service; fi"
)


def daemons(settings: Settings, gpus: Gpus, hold: list[str]) -> None:
    dropin_text = render_template("nvidia/persistenced-override.conf.j2")
    dropin = files.put(
        name="nvidia-persistenced: persistence mode on", src=StringIO(dropin_text), dest=PERSISTENCED_DROPIN, mode="644"
    )
    # A running daemon is restarted so the drop-in's persistence mode takes effect now (one
    # that is not running is left to driver_daemon); after a run stopped before this, too.
    # Only on the module that is installed: after a driver upgrade the old one is still
    # loaded until the reboot, and a daemon restarted on it fails (API mismatch).
    follow_up(
        "systemd daemon-reload (persistenced drop-in)",
        "nvidia-persistenced-dropin",
        [dropin_text],
        ["systemctl daemon-reload", PERSISTENCED_RESTART],
        dropin.did_change,
    )
    # persistenced like fabric manager: with no reboot to come, only this run starts it.
    driver_daemon(name="nvidia-persistenced enabled", service="nvidia-persistenced")
    if wants_fabricmanager(settings, gpus):
        # Without it an NVSwitch host's CUDA fails (error 802, system not yet initialized).
        driver_daemon(name="nvidia-fabricmanager enabled", service="nvidia-fabricmanager")
    held(name="hold NVIDIA driver packages", explicit=hold, branch=settings.nvidia_driver_branch)


@deploy("NVIDIA stack")
def nvidia() -> None:
    node = current_node()
    settings = node.settings
    gpus = host.get_fact(NvidiaDevices)
    reason = skip_reason(node, gpus)
    if reason:
        skip("nvidia", reason)
        return
    os_info = host.get_fact(Os)
    open_modules = pkgs.use_open_modules(settings.nvidia_kernel_modules, [g.device_id for g in gpus.gpus])
    signed = pkgs.signed_modules_package(settings.nvidia_driver_branch, open_modules, os_info.kernel)
    meta = pkgs.cuda_driver_metapackage(settings.nvidia_driver_branch, open_modules)
    canonical = pkgs.canonical_driver_package(settings.nvidia_driver_branch, open_modules)
    probe = host.get_fact(Probe, packages=(signed, canonical, meta) if os_info.id == "ubuntu" else (meta,))
    try:
        choice = driver_choice(settings, os_info, gpus, probe.secure_boot.enabled, probe.candidates)
    except ValueError as e:  # Secure Boot with no signed modules (preflight could not tell yet), or
        refuse("nvidia", str(e))  # a bare version Canonical's archive does not have
        return
    # The driver comes from NVIDIA's repository, or (Secure Boot on Ubuntu) from Canonical's
    # signed packages; the CUDA toolkit, NCCL and the container toolkit come only from
    # NVIDIA's repository, so it is configured whenever one of them is wanted.
    wants_repository = choice.source == "cuda-repo" or wants_cuda_repository_extras(settings)
    if wants_repository and not repository(settings, os_info, probe.candidates.get(meta)):
        return
    kernel_side(settings, os_info, probe)
    hold = driver(settings, choice, gpus, node.name)
    daemons(settings, gpus, hold)


step = Step("nvidia", nvidia, "CUDA repo, pinned driver, fabric manager, persistenced, CUDA toolkit", applies)
