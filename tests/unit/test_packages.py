"""Package-name helpers: which packages for which OS, branch and GPU generation."""

from __future__ import annotations

import pytest

from provision.rules import packages as pkgs
from tests.helpers.deploy_facts import H100, P100, os_info


@pytest.mark.parametrize(
    ("fixture", "distro"),
    [
        ("ubuntu-22.04-jammy", "ubuntu2204"),
        ("ubuntu-24.04.3-noble", "ubuntu2404"),
        ("debian-12-bookworm", "debian12"),
    ],
)
def test_cuda_distro_names_the_repository_directory(fixture: str, distro: str) -> None:
    assert pkgs.cuda_distro(os_info(fixture)) == distro


def test_open_modules_for_hopper_proprietary_for_pascal() -> None:
    assert pkgs.use_open_modules("auto", [H100.device_id]) is True
    assert pkgs.use_open_modules("auto", [H100.device_id, P100.device_id]) is False
    assert pkgs.use_open_modules("proprietary", [H100.device_id]) is False
    assert pkgs.use_open_modules("open", [P100.device_id]) is True


def test_cuda_repo_branch_metapackages() -> None:
    open_choice = pkgs.driver_packages("cuda-repo", "580", None, True, "6.1.0-18-amd64")
    assert open_choice.install == ["nvidia-open-580"]
    assert open_choice.hold == ["nvidia-open-580"]
    prop = pkgs.driver_packages("cuda-repo", "570", "570.195.03", False, "6.1.0-18-amd64")
    assert prop.install == ["cuda-drivers-570=570.195.03-1"]


def test_ubuntu_server_packages_include_signed_modules_for_the_running_kernel() -> None:
    choice = pkgs.driver_packages("ubuntu-server", "580", None, True, "6.8.0-45-generic")
    assert choice.install == ["nvidia-driver-580-server-open", "linux-modules-nvidia-580-server-open-6.8.0-45-generic"]
    prop = pkgs.driver_packages("ubuntu-server", "570", "570.195.03-0ubuntu0.22.04.1", False, "5.15.0-185-generic")
    assert prop.install == [
        "nvidia-driver-570-server=570.195.03-0ubuntu0.22.04.1",
        "linux-modules-nvidia-570-server-5.15.0-185-generic",
    ]


def test_fabricmanager_name_drops_branch_suffix_from_580() -> None:
    assert pkgs.fabricmanager_package("570", None) == ("nvidia-fabricmanager-570=570.*", "nvidia-fabricmanager-570")
    assert pkgs.fabricmanager_package("580", "580.95.05") == (
        "nvidia-fabricmanager=580.95.05-1",
        "nvidia-fabricmanager",
    )


def test_fabricmanager_from_canonical_keeps_the_branch_suffix_and_its_own_revisions() -> None:
    assert pkgs.fabricmanager_package("580", None, "ubuntu-server") == (
        "nvidia-fabricmanager-580=580.*",
        "nvidia-fabricmanager-580",
    )
    assert pkgs.fabricmanager_package("580", "580.95.05-0ubuntu0.24.04.1", "ubuntu-server") == (
        "nvidia-fabricmanager-580=580.95.05-*",
        "nvidia-fabricmanager-580",
    )


def test_secure_boot_on_debian_stops_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"enroll a MOK.*disable Secure Boot.*Debian has no signed"):
        pkgs.choose_driver_source(os_info("debian-12-bookworm"), True, False, "auto")


def test_secure_boot_on_ubuntu_without_signed_modules_names_a_signed_flavour() -> None:
    with pytest.raises(ValueError, match="signed kernel flavour"):
        pkgs.choose_driver_source(os_info("ubuntu-24.04.3-noble"), True, False, "auto")


def test_secure_boot_on_ubuntu_with_signed_modules_takes_canonical_packages() -> None:
    assert pkgs.choose_driver_source(os_info("ubuntu-22.04-jammy"), True, True, "auto") == "ubuntu-server"


def test_secure_boot_off_takes_the_cuda_repository() -> None:
    assert pkgs.choose_driver_source(os_info("ubuntu-22.04-jammy"), False, True, "auto") == "cuda-repo"
    with pytest.raises(ValueError, match="needs Ubuntu"):
        pkgs.choose_driver_source(os_info("debian-12-bookworm"), False, False, "ubuntu-server")


def test_cuda_toolkit_name_and_version_pins() -> None:
    assert pkgs.cuda_toolkit_package("12.8") == "cuda-toolkit-12-8"
    assert pkgs.cuda_toolkit_package(None) is None
    assert pkgs.apt_version("580.95.05") == "580.95.05-1"
    assert pkgs.apt_version("580.95.05-0ubuntu1") == "580.95.05-0ubuntu1"


def test_driver_version_check_against_branch_or_exact_pin() -> None:
    assert pkgs.driver_version_ok("580.95.05", "580", None)
    assert not pkgs.driver_version_ok("590.48.01", "580", None)
    assert pkgs.driver_version_ok("580.95.05", "580", "580.95.05-1")
    assert not pkgs.driver_version_ok("580.82.07", "580", "580.95.05")


def test_pin_preferences_keep_driver_packages_on_the_branch() -> None:
    text = pkgs.apt_pin_preferences("580")
    assert "Pin: version 580.*\n" in text
    assert "Pin-Priority: 1000" in text


def test_newest_kernel_is_ordered_as_grub_orders_them_not_as_text() -> None:
    kernels = ["5.15.0-91-generic", "5.15.0-185-generic", "6.8.0-60-generic", "6.8.0-100-generic"]
    assert max(kernels, key=pkgs.kernel_sort_key) == "6.8.0-100-generic"
    assert max(kernels[:2], key=pkgs.kernel_sort_key) == "5.15.0-185-generic"


def test_base_installs_the_python_headers_triton_compiles_against() -> None:
    # torch.compile's Triton backend builds its launcher against Python.h: no header, no --compile
    assert "python3-dev" in pkgs.BASE_PACKAGES
