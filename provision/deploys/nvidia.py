"""NVIDIA stack: CUDA apt repository, pinned driver branch, open or proprietary modules,
nouveau blacklisted, headers, holds, persistence daemon, fabric manager, CUDA toolkit.

Runs on hosts with an NVIDIA GPU (lspci), on hosts in the gpu_nodes group, and wherever
the ``nvidia`` setting says ``force``. Package names come from the pure helpers in
``packages.py``. Reboots are not done here: ``provision.up.reboots`` decides after the step.
"""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Callable
from io import StringIO

from pyinfra import host
from pyinfra.api import deploy, operation
from pyinfra.facts.apt import AptRepo
from pyinfra.facts.files import File, Sha256File
from pyinfra.operations import apt, files, server, systemd

from provision.engine import Step, current_node, note, refuse, skip
from provision.facts.apt import AptSourceFiles
from provision.facts.gpus import Gpus, NvidiaDevices
from provision.facts.probes import AptHolds, HostProbe, Probe, RebootProbe, lock_wait_command
from provision.facts.system import Os, OsInfo
from provision.inventory import Node
from provision.resources import templates_dir
from provision.rules import packages as pkgs
from provision.settings import Settings, nccl_version_pattern

KEYRING = "/etc/apt/keyrings/cuda-archive-keyring.gpg"
PIN_FILE = "/etc/apt/preferences.d/90-provision-nvidia"
NOUVEAU_FILE = "/etc/modprobe.d/blacklist-nouveau.conf"
PERSISTENCED_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/provision.conf"
SOURCES_LIST = "/etc/apt/sources.list"


def skip_reason(node: Node, gpus: Gpus | None = None) -> str | None:
    """Why the nvidia step does not run on this host, or None when it does.

    ``gpus`` is None when only the inventory is known (the controller decides before
    contacting hosts); then ``auto`` runs and the deploy looks at lspci itself.
    """
    switch = node.settings.nvidia
    if switch == "skip":
        return "nvidia: skip"
    if switch == "force" or node.has_role("gpu_nodes"):
        return None
    if gpus is not None and not gpus.gpus:
        return "no NVIDIA GPU on the PCI bus"
    return None


def applies(node: Node) -> str | None:
    return skip_reason(node)


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


def driver_choice(settings: Settings, os_info: OsInfo, gpus: Gpus, secure_boot: bool,
                  candidates: dict[str, str | None]) -> pkgs.DriverChoice:
    """Which driver packages, from where. ``candidates``: apt's candidate versions of the
    signed modules and Canonical's driver package (Ubuntu). Raises ValueError with advice
    when no driver can be chosen (Secure Boot without signed modules, a bare version
    Canonical does not have)."""
    branch = settings.nvidia_driver_branch
    open_modules = pkgs.use_open_modules(settings.nvidia_kernel_modules,
                                         [g.device_id for g in gpus.gpus])
    signed = pkgs.signed_modules_package(branch, open_modules, os_info.kernel)
    source = pkgs.choose_driver_source(os_info, secure_boot, candidates.get(signed) is not None,
                                       settings.nvidia_driver_source)
    version = settings.nvidia_driver_version
    if source == "ubuntu-server":
        driver = pkgs.canonical_driver_package(branch, open_modules)
        version = pkgs.canonical_version(version, driver, candidates.get(driver))
    return pkgs.driver_packages(source, branch, version, open_modules, os_info.kernel)


def wants_fabricmanager(settings: Settings, gpus: Gpus) -> bool:
    return settings.fabric_manager == "force" or (settings.fabric_manager == "auto" and gpus.has_nvswitch)


def hold_names(installed: dict[str, str], held: set[str], explicit: list[str], branch: str) -> list[str]:
    """Packages to apt-mark hold now: the explicit ones, and every installed driver package
    of the branch (the metapackage's dependencies would otherwise still move)."""
    wanted = {n for n in explicit if n in installed}
    wanted |= {n for n, v in installed.items()
               if n.startswith(("nvidia-", "libnvidia-", "libcuda")) and v.startswith(f"{branch}.")}
    return sorted(wanted - held)


@operation()
def held(explicit: list[str], branch: str):
    """apt-mark hold the driver packages (read after the install, at execution time)."""
    installed, already = host.get_fact(AptHolds)
    names = hold_names(installed, already, explicit, branch)
    if names:
        yield f"apt-mark hold {' '.join(names)}"


@operation()
def fabricmanager(package: str, driver_package: str, version: str | None):
    """Install fabric manager at the driver's version (it refuses to run otherwise).

    ``version`` is the driver version when pinned (bare or with its revision); otherwise
    the driver's version is read at execution time, after the driver was installed, from
    the installed metapackage. Only the upstream part must match (``580.95.05-*``): Canonical
    builds fabric manager and the -server driver from separate sources, whose revisions
    (0ubuntu0.22.04.N) need not be equal; in NVIDIA's repository both are ``-1``.
    """
    installed, _ = host.get_fact(AptHolds)
    driver_version = installed.get(driver_package)
    if version is None and driver_version is None:
        if host.state.is_executing:  # the driver step ran before this, so this is a real error
            yield (f"echo 'fabric manager: no installed version of {driver_package} to match' >&2; exit 1")
        else:  # planning: the driver is not installed yet, so its version is not known
            yield f"apt-get install -y {package}=<driver version>"
        return
    command = install_matching(installed, {package: f"{pkgs.upstream(version or driver_version or '')}-*"})
    if command:
        yield command


@operation()
def apt_pinned(packages: dict[str, str]):
    """Install each package at a version matching its apt version glob, unless the installed
    one already matches. pyinfra's apt.packages compares versions literally, so a glob such
    as ``*+cuda12.8`` would reinstall at every run; apt itself resolves the glob to the
    newest matching version. Held packages may be moved: the pin is what decides."""
    installed, _ = host.get_fact(AptHolds)
    command = install_matching(installed, packages, recommends=False)
    if command:
        yield command


def install_matching(installed: dict[str, str], packages: dict[str, str], recommends: bool = True) -> str | None:
    """The apt-get line that brings each package to a version matching its pattern (an exact
    version or an apt version glob), or None when every installed one already matches.
    Held packages may be moved: the pin is what decides."""
    todo = [shlex.quote(f"{name}={pattern}") for name, pattern in packages.items()
            if not fnmatch.fnmatchcase(installed.get(name, ""), pattern)]
    if not todo:
        return None
    return (f"DEBIAN_FRONTEND=noninteractive apt-get install -y {'' if recommends else '--no-install-recommends '}"
            f"--allow-change-held-packages -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
            f"{' '.join(todo)}")


def download_commands(src: str, dest: str, sha256: str | None) -> list[str]:
    """Fetch to a temporary name beside ``dest``, check the SHA-256, then move into place:
    apt trusts whatever key sits at ``dest``, so a wrong file never gets there (pyinfra's
    files.download checks its sum only after the move)."""
    new = f"{dest}.provision-new"
    commands = [f"curl -sSLf --retry 3 -o {shlex.quote(new)} {shlex.quote(src)}"]
    if sha256:
        commands.append(f"echo {shlex.quote(f'{sha256}  {new}')} | sha256sum -c --quiet - "
                        f"|| {{ rm -f {shlex.quote(new)}; echo {shlex.quote(f'{src}: SHA-256 is not {sha256}')} >&2; "
                        "exit 1; }")
    commands.append(f"chmod 644 {shlex.quote(new)} && mv -f {shlex.quote(new)} {shlex.quote(dest)}")
    return commands


@operation()
def verified_download(src: str, dest: str, sha256: str | None):
    """Download ``src`` to ``dest`` when it is missing, or when its SHA-256 is not ``sha256``."""
    if sha256:
        if host.get_fact(Sha256File, path=dest) == sha256:
            return
    elif host.get_fact(File, path=dest):
        return
    yield from download_commands(src, dest, sha256)


def any_changed(*ops: object) -> Callable[[], bool]:
    return lambda: any(op.did_change() for op in ops)  # type: ignore[attr-defined]


def other_sources(source_files: dict[str, list[AptRepo]], url: str, ours: str) -> tuple[list[str], list[str]]:
    """Other apt source files that name NVIDIA's repository: (files to remove, problems).

    apt refuses every command when two entries for one URI name different Signed-By keys,
    as NVIDIA's cuda-keyring .list and our .sources do. A sources.list.d file that names
    only this repository is removed; /etc/apt/sources.list, or a file that names other
    repositories too, is left to the user: removing it would drop those as well.
    """
    remove, problems = [], []
    for path, repos in sorted(source_files.items()):
        same = [r for r in repos if r.url.rstrip("/") == url.rstrip("/")]
        if path == ours or not same:
            continue
        if path == SOURCES_LIST or len(same) < len(repos):
            entry = f"{same[0].type} {same[0].url} {same[0].distribution}"
            problems.append(f"{path} names NVIDIA's CUDA repository ({entry}), which the nvidia step "
                            f"configures in {ours} with another Signed-By key, and apt refuses both: remove "
                            f"that entry from {path} and re-run")
        else:
            remove.append(path)
    return remove, problems


def wait_for_apt_locks(settings: Settings, **global_args: object) -> None:
    """apt-get update fails at once while another apt (apt-daily, unattended-upgrades)
    holds the lists lock; DPkg::Lock::Timeout covers only the dpkg lock."""
    server.shell(name="wait for apt locks", commands=[lock_wait_command(settings.apt_lock_wait_s)],
                 **global_args)  # type: ignore[arg-type]


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
    apt.packages(name="download tools (curl, CA certificates)", packages=["curl", "ca-certificates"],
                 no_recommends=True)
    keyring_dir = files.directory(name="/etc/apt/keyrings", path="/etc/apt/keyrings", mode="755")
    keyring = verified_download(name="CUDA repository keyring", src=settings.nvidia_keyring_url.format(distro=distro),
                                dest=KEYRING, sha256=settings.nvidia_keyring_sha256)
    removals = []
    for path in removed:  # before ours is written, so no run ever leaves both in place
        note(f"nvidia: removes {path}: it names NVIDIA's CUDA repository, which the nvidia step now "
             f"configures in {sources_file(os_info)}")
        removals.append(files.file(name=f"remove {path} (same CUDA repository, other Signed-By)",
                                   path=path, present=False))
    sources = files.put(name="CUDA repository (deb822, Signed-By)", src=StringIO(sources_text(url)),
                        dest=sources_file(os_info), mode="644")
    pin = files.put(name=f"apt pin: NVIDIA driver branch {settings.nvidia_driver_branch}",
                    src=StringIO(pkgs.apt_pin_preferences(settings.nvidia_driver_branch)),
                    dest=PIN_FILE, mode="644")
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
    nouveau = files.template(name="blacklist nouveau", dest=NOUVEAU_FILE, mode="644",
                             src=str(templates_dir() / "nvidia" / "blacklist-nouveau.conf.j2"))
    server.shell(name="update initramfs (nouveau blacklisted)", commands=["update-initramfs -u"],
                 _if=nouveau.did_change)
    if not settings.nvidia_kernel_headers:
        return
    # Headers for every installed kernel, not only the running one: the reboot after the
    # driver install boots the newest, and DKMS builds only for kernels with headers.
    headers = pkgs.kernel_headers(os_info.kernel, probe.headers_candidate, probe.kernels)
    for kernel in headers.skipped:
        note(f"nvidia: no linux-headers-{kernel} in the apt sources: no driver module for kernel {kernel} "
             "(neither running nor newest)")
    apt.packages(name=f"kernel headers for {', '.join(h.removeprefix('linux-headers-') for h in headers.install)}",
                 packages=headers.install, no_recommends=True)


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


def driver(settings: Settings, choice: pkgs.DriverChoice, gpus: Gpus) -> list[str]:
    """Install the driver (and fabric manager, toolkit, extras); return the names to hold."""
    apt.packages(name=f"NVIDIA driver {settings.nvidia_driver_branch} "
                      f"({'open' if choice.open_modules else 'proprietary'} modules, {choice.source})",
                 packages=choice.install, extra_install_args="--allow-change-held-packages")
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


@operation()
def driver_daemon(service: str, config_changed: Callable[[], bool] | None = None):
    """Enable a daemon that needs the NVIDIA kernel module; start it too when the kernel
    runs the installed module (read at execution time, after the install), since then no
    reboot follows to start it. After a driver install or upgrade the module is not
    loaded, or an older one is, and a daemon started now would fail on the version
    mismatch: it stays enabled only, for the reboot. ``config_changed``: restart a
    running daemon when its configuration changed in this run."""
    live = host.get_fact(RebootProbe).runs_installed_module
    restart = bool(live and config_changed and host.state.is_executing and config_changed())
    yield from systemd.service._inner(service=service, running=True if live else None, enabled=True,
                                      restarted=restart)


def daemons(settings: Settings, gpus: Gpus, hold: list[str]) -> None:
    dropin = files.template(name="nvidia-persistenced: persistence mode on",
                            src=str(templates_dir() / "nvidia" / "persistenced-override.conf.j2"),
                            dest=PERSISTENCED_DROPIN, mode="644")
    systemd.daemon_reload(name="systemd daemon-reload (persistenced drop-in)", _if=dropin.did_change)
    # persistenced like fabric manager: with no reboot to come, only this run starts it,
    # or restarts it so the drop-in's persistence mode takes effect.
    driver_daemon(name="nvidia-persistenced enabled", service="nvidia-persistenced",
                  config_changed=dropin.did_change)
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
    hold = driver(settings, choice, gpus)
    daemons(settings, gpus, hold)


step = Step("nvidia", nvidia, "CUDA repo, pinned driver, fabric manager, persistenced, CUDA toolkit",
            applies)
