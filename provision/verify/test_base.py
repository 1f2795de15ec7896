"""What the base step promises on every node."""

from __future__ import annotations

from typing import Any

import pytest

BASE_PACKAGES = ["build-essential", "python3-venv", "numactl", "pciutils", "nvme-cli",
                 "mdadm", "fio", "iperf3", "chrony", "rsync"]


@pytest.mark.parametrize("name", BASE_PACKAGES)
def test_base_package_installed(host: Any, name: str) -> None:
    assert host.package(name).is_installed


def test_chrony_runs_and_starts_at_boot(host: Any) -> None:
    chrony = host.service("chrony")
    assert chrony.is_running and chrony.is_enabled


def test_memlock_and_nofile_limits(host: Any, settings: dict[str, Any]) -> None:
    limits = host.file("/etc/security/limits.d/90-provision.conf")
    assert limits.contains("hard memlock unlimited")
    assert limits.contains(f"hard nofile  {settings['nofile_limit']}")


def test_network_sysctls_are_applied(host: Any) -> None:
    assert host.sysctl("net.core.rmem_max") == 268435456
    assert host.sysctl("net.ipv4.tcp_slow_start_after_idle") == 0


def test_every_node_resolves_by_cluster_address(host: Any, expected: dict[str, Any]) -> None:
    hosts = host.file("/etc/hosts").content_string
    for name, address in expected["all_nodes"].items():
        assert f"{address} {name}" in hosts


def test_training_user_has_the_cluster_key(host: Any, settings: dict[str, Any]) -> None:
    user = settings["training_user"]
    home = f"/home/{user}"
    assert host.user(user).exists
    # One uid/gid on every node, so files on the NFS shares belong to the same account.
    assert host.user(user).uid == settings["training_uid"] and host.user(user).gid == settings["training_uid"]
    key = host.file(f"{home}/.ssh/id_ed25519")
    assert key.user == user and key.mode == 0o600
    assert host.file(f"{home}/.ssh/authorized_keys").contains("ssh-ed25519")
    assert host.file(f"{home}/.ssh/known_hosts").size > 0


def test_unattended_upgrades_never_touch_nvidia_or_cuda(host: Any) -> None:
    conf = host.file("/etc/apt/apt.conf.d/51provision-unattended-upgrades")
    for prefix in ("nvidia-", "libnvidia-", "cuda-"):
        assert conf.contains(f'"{prefix}";')
