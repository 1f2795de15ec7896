"""What the nvidia step promises on hosts it applies to: pinned, held driver (every package
of the branch), repository and apt pin (and its keyring's SHA-256 when set), nouveau
blacklisted and not loaded, headers for the running kernel, persistence daemon running in
persistence mode, fabric manager where wanted (held, running, matching the driver), the
pinned CUDA toolkit, NCCL built for it and held.

Where the deploy has a rule or a name, the checks import it (nvidia_rules.wants_fabricmanager,
nvidia_rules.hold_names, packages.apt_pin_preferences) rather than restate it."""

from __future__ import annotations

import fnmatch
from typing import Any, cast

import pytest

from provision.deploys import nvidia
from provision.facts.gpus import Gpus, NvidiaDevices
from provision.facts.probes import AptHolds, parse_holds
from provision.rules import nvidia as nvidia_rules
from provision.rules import packages as pkgs
from provision.rules.packages import NCCL_PACKAGES, cuda_toolkit_package
from provision.settings import Settings, nccl_version_pattern
from provision.verify.conftest import nvidia_applies


@pytest.fixture
def nvidia_host(host: Any, expected: dict[str, Any]) -> Any:
    if not nvidia_applies(host, expected):
        pytest.skip("the nvidia step does not apply to this host (no NVIDIA GPU, not forced)")
    return host


def driver_version(host: Any) -> str:
    answer = host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1")
    return cast(str, answer).strip()


def apt_state(host: Any) -> tuple[dict[str, str], set[str]]:
    """Installed packages (name -> version) and held names, read as the deploy reads them."""
    return parse_holds(host.check_output(AptHolds().command()).splitlines())


def unit_state(host: Any, verb: str, unit: str) -> str:
    """`systemctl is-enabled|is-active UNIT`'s one word ("enabled", "active", "inactive", ...)."""
    return cast(str, host.run(f"systemctl {verb} {unit}").stdout.strip())


def skip_without_cuda_repository(host: Any) -> None:
    listed = host.run("ls /etc/apt/sources.list.d/cuda-*.sources")
    if listed.rc != 0 and host.run("dpkg-query -W 'nvidia-driver-*-server*'").rc == 0:
        # Secure Boot on Ubuntu: the driver is Canonical's signed one, and with no CUDA
        # toolkit, NCCL or container toolkit wanted, the step adds no NVIDIA repository
        # (nor its apt pin, which is written with it).
        pytest.skip("driver from Canonical's signed packages and nothing wanted from NVIDIA's repository")


def test_cuda_repository_is_signed(nvidia_host: Any) -> None:
    skip_without_cuda_repository(nvidia_host)
    out = nvidia_host.check_output("cat /etc/apt/sources.list.d/cuda-*.sources")
    assert "Signed-By: /etc/apt/keyrings/cuda-archive-keyring.gpg" in out
    assert nvidia_host.file("/etc/apt/keyrings/cuda-archive-keyring.gpg").size > 0


def test_keyring_has_the_pinned_sha256(nvidia_host: Any, settings: dict[str, Any]) -> None:
    if not settings["nvidia_keyring_sha256"]:
        pytest.skip("nvidia_keyring_sha256 is not set")
    keyring = nvidia_host.file("/etc/apt/keyrings/cuda-archive-keyring.gpg")
    assert keyring.exists
    assert keyring.sha256sum == settings["nvidia_keyring_sha256"]


def test_cuda_toolkit_is_the_pinned_one(nvidia_host: Any, settings: dict[str, Any]) -> None:
    package = cuda_toolkit_package(settings["cuda_toolkit_version"])
    if package is None:
        pytest.skip("cuda_toolkit_version is null")
    assert nvidia_host.package(package).is_installed


def test_nccl_is_built_for_the_toolkit_cuda_and_held(nvidia_host: Any, settings: dict[str, Any]) -> None:
    if not settings["install_nccl"]:
        pytest.skip("install_nccl is false")
    pattern = nccl_version_pattern(settings["cuda_toolkit_version"], settings["nccl_version"])
    held = nvidia_host.check_output("apt-mark showhold").split()
    for name in NCCL_PACKAGES:
        package = nvidia_host.package(name)
        assert package.is_installed, (name, package.version)
        assert fnmatch.fnmatchcase(package.version, pattern), (name, package.version)
        assert name in held


def test_driver_answers_with_the_pinned_version(nvidia_host: Any, settings: dict[str, Any]) -> None:
    version = driver_version(nvidia_host)
    if settings["nvidia_driver_version"]:
        assert version == settings["nvidia_driver_version"].split("-")[0]
    else:
        assert version.startswith(settings["nvidia_driver_branch"] + ".")


def test_every_driver_package_of_the_branch_is_held(nvidia_host: Any, settings: dict[str, Any]) -> None:
    """A held metapackage alone does not stop apt upgrading its dependencies (libnvidia-*,
    the module package) under a loaded driver; the deploy holds every installed package of
    the branch (nvidia_rules.hold_names), so every one of them must be held."""
    installed, held = apt_state(nvidia_host)
    branch = settings["nvidia_driver_branch"]
    kernel = nvidia_host.check_output("uname -r")
    # The metapackages and signed module package the deploy may have chosen; hold_names
    # keeps only the installed ones.
    explicit = [
        name
        for source in ("cuda-repo", "ubuntu-server")
        for open_modules in (True, False)
        for name in pkgs.driver_packages(source, branch, None, open_modules, kernel).hold
    ]
    driver = nvidia_rules.hold_names(installed, set(), explicit, branch)
    assert driver, f"no driver package of branch {branch} is installed"
    assert sorted(set(driver) - held) == []


def test_apt_pin_keeps_driver_packages_on_the_branch(nvidia_host: Any, settings: dict[str, Any]) -> None:
    """The pin is what keeps packages nobody held (and new dependencies) off the next branch."""
    skip_without_cuda_repository(nvidia_host)
    pin = nvidia_host.file(nvidia.PIN_FILE)
    assert pin.exists
    assert pin.content_string == pkgs.apt_pin_preferences(settings["nvidia_driver_branch"])


def test_nouveau_is_blacklisted(nvidia_host: Any) -> None:
    assert nvidia_host.file(nvidia.NOUVEAU_FILE).contains("^blacklist nouveau")


def test_nouveau_is_not_loaded(nvidia_host: Any) -> None:
    """The blacklist acts only through the rebuilt initramfs and a reboot; a loaded nouveau
    holds the GPUs and the NVIDIA module cannot bind. /proc/modules is what lsmod reads."""
    modules = nvidia_host.check_output("cat /proc/modules").splitlines()
    assert [line for line in modules if line.split()[:1] == ["nouveau"]] == []


def test_headers_for_the_running_kernel_are_installed(nvidia_host: Any, settings: dict[str, Any]) -> None:
    """DKMS builds the driver's module against them; a kernel without its headers (a new
    kernel booted since) gets no NVIDIA module."""
    if not settings["nvidia_kernel_headers"]:
        pytest.skip("nvidia_kernel_headers is false")
    kernel = nvidia_host.check_output("uname -r")
    assert nvidia_host.package(f"linux-headers-{kernel}").is_installed


def test_persistence_daemon_runs_in_persistence_mode(nvidia_host: Any) -> None:
    """Enabled is not enough: the deploy only enables it and the reboot starts it; a daemon
    that is not running leaves the GPUs to initialise again for every job."""
    assert nvidia_host.file(nvidia.PERSISTENCED_DROPIN).contains("--persistence-mode")
    assert unit_state(nvidia_host, "is-enabled", "nvidia-persistenced") == "enabled"
    assert unit_state(nvidia_host, "is-active", "nvidia-persistenced") == "active"


def nvidia_devices(host: Any) -> Gpus:
    """NVIDIA PCI devices as the nvidia step sees them: its own fact's command and parser
    (NVSwitches show on the PCI bus with no driver)."""
    fact = NvidiaDevices()
    return fact.process(host.check_output(fact.command()).splitlines())


def test_fabric_manager_is_held_running_and_matches_the_driver(nvidia_host: Any, settings: dict[str, Any]) -> None:
    """On NVSwitch hosts (or fabric_manager: force) the GPUs cannot use NVLink without fabric
    manager, and it refuses to start at any version but the driver's. Where the nvidia step
    wants it (its own rule, nvidia_rules.wants_fabricmanager), it must be installed at the driver's
    version, held, enabled and running."""
    if not nvidia_rules.wants_fabricmanager(Settings(**settings), nvidia_devices(nvidia_host)):
        pytest.skip("fabric manager is not wanted here (no NVSwitch on lspci, fabric_manager not force)")
    installed, held = apt_state(nvidia_host)
    branch = settings["nvidia_driver_branch"]
    names = {pkgs.fabricmanager_package(branch, None, source)[1] for source in ("cuda-repo", "ubuntu-server")}
    found = {name: installed[name] for name in names if name in installed}
    assert found, f"fabric manager is not installed (none of {sorted(names)})"
    for name, version in found.items():
        assert pkgs.upstream(version) == driver_version(nvidia_host), (name, version)
        assert name in held, f"{name} is not held"
    assert unit_state(nvidia_host, "is-enabled", "nvidia-fabricmanager") == "enabled"
    assert unit_state(nvidia_host, "is-active", "nvidia-fabricmanager") == "active"
