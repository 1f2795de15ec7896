"""What the nvidia step promises on hosts it applies to: pinned, held driver, repository
(and its keyring's SHA-256 when set), nouveau blacklisted, persistence mode, fabric manager
matching the driver, the pinned CUDA toolkit, NCCL built for it and held."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest

from provision.deploys.packages import NCCL_PACKAGES, cuda_toolkit_package, nccl_version_pattern
from provision.verify.conftest import nvidia_applies


@pytest.fixture
def nvidia_host(host: Any, expected: dict[str, Any]) -> Any:
    if not nvidia_applies(host, expected):
        pytest.skip("the nvidia step does not apply to this host (no NVIDIA GPU, not forced)")
    return host


def driver_version(host: Any) -> str:
    return host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1").strip()


def test_cuda_repository_is_signed(nvidia_host: Any) -> None:
    listed = nvidia_host.run("ls /etc/apt/sources.list.d/cuda-*.sources")
    if listed.rc != 0 and nvidia_host.run("dpkg-query -W 'nvidia-driver-*-server*'").rc == 0:
        # Secure Boot on Ubuntu: the driver is Canonical's signed one, and with no CUDA
        # toolkit, NCCL or container toolkit wanted, the step adds no NVIDIA repository.
        pytest.skip("driver from Canonical's signed packages and nothing wanted from NVIDIA's repository")
    out = nvidia_host.check_output("cat /etc/apt/sources.list.d/cuda-*.sources")
    assert "Signed-By: /etc/apt/keyrings/cuda-archive-keyring.gpg" in out
    assert nvidia_host.file("/etc/apt/keyrings/cuda-archive-keyring.gpg").size > 0


def test_keyring_has_the_pinned_sha256(nvidia_host: Any, settings: dict[str, Any]) -> None:
    if not settings["nvidia_keyring_sha256"]:
        pytest.skip("nvidia_keyring_sha256 is not set")
    keyring = nvidia_host.file("/etc/apt/keyrings/cuda-archive-keyring.gpg")
    assert keyring.exists and keyring.sha256sum == settings["nvidia_keyring_sha256"]


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
        assert package.is_installed and fnmatch.fnmatchcase(package.version, pattern), (name, package.version)
        assert name in held


def test_driver_answers_with_the_pinned_version(nvidia_host: Any, settings: dict[str, Any]) -> None:
    version = driver_version(nvidia_host)
    if settings["nvidia_driver_version"]:
        assert version == settings["nvidia_driver_version"].split("-")[0]
    else:
        assert version.startswith(settings["nvidia_driver_branch"] + ".")


def test_driver_packages_are_held(nvidia_host: Any, settings: dict[str, Any]) -> None:
    held = nvidia_host.check_output("apt-mark showhold").split()
    branch = settings["nvidia_driver_branch"]
    assert any(name in held for name in (f"nvidia-open-{branch}", f"cuda-drivers-{branch}",
                                         f"nvidia-driver-{branch}-server-open", f"nvidia-driver-{branch}-server"))


def test_nouveau_is_blacklisted(nvidia_host: Any) -> None:
    assert nvidia_host.file("/etc/modprobe.d/blacklist-nouveau.conf").contains("^blacklist nouveau")


def test_persistence_daemon_enabled_in_persistence_mode(nvidia_host: Any) -> None:
    dropin = nvidia_host.file("/etc/systemd/system/nvidia-persistenced.service.d/provision.conf")
    assert dropin.contains("--persistence-mode")
    assert nvidia_host.service("nvidia-persistenced").is_enabled


def test_fabric_manager_matches_the_driver(nvidia_host: Any) -> None:
    installed = nvidia_host.run("dpkg-query -W -f='${Version}' 'nvidia-fabricmanager*' 2>/dev/null")
    if installed.rc != 0 or not installed.stdout.strip():
        pytest.skip("no fabric manager on this host (no NVSwitch, not forced)")
    assert installed.stdout.strip().split("-")[0] == driver_version(nvidia_host)
