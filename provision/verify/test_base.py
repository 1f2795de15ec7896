"""What the base step promises on every node."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from provision.rules.packages import BASE_PACKAGES  # what the base step installs


def ipaddress_or_none(value: str) -> Any:
    import ipaddress

    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


@pytest.mark.parametrize("name", BASE_PACKAGES)
def test_base_package_installed(host: Any, name: str) -> None:
    assert host.package(name).is_installed


def test_chrony_runs_and_starts_at_boot(host: Any) -> None:
    chrony = host.service("chrony")
    assert chrony.is_running
    assert chrony.is_enabled


def test_memlock_and_nofile_limits(host: Any, settings: dict[str, Any]) -> None:
    limits = host.file("/etc/security/limits.d/90-provision.conf")
    assert limits.contains("hard memlock unlimited")
    assert limits.contains(f"hard nofile  {settings['nofile_limit']}")


def test_network_sysctls_are_applied(host: Any) -> None:
    assert host.sysctl("net.core.rmem_max") == 268435456
    assert host.sysctl("net.ipv4.tcp_slow_start_after_idle") == 0


def test_every_node_resolves_to_its_cluster_address(host: Any, expected: dict[str, Any]) -> None:
    """What the resolver answers, not what the file contains: an earlier line for the same
    name (a "127.0.1.1 <hostname>" from the installer, a stale address) wins over the
    block base writes, and torchrun, NCCL and NFS would then use that address."""
    for name, address in expected["all_nodes"].items():
        answer = host.run(f"getent hosts {shlex.quote(name)}").stdout.split()
        assert answer[:1] == [address], f"{name} resolves to {answer[:1]}, not its cluster address {address}"


def test_every_login_and_job_gets_the_nodes_cluster_interface(
    host: Any, expected: dict[str, Any], settings: dict[str, Any]
) -> None:
    """NCCL and gloo pick their NIC by these names; left unset they took the first
    interface that is up, and a two-node job dialled the wrong network."""
    address = expected["all_nodes"][host.backend.get_hostname()]
    if not settings.get("cluster_interface") and not ipaddress_or_none(address):
        pytest.skip("a DNS-named cluster address and no cluster_interface: base finds no interface (it says so)")
    lines = host.file("/etc/environment").content_string.splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    interface = env.get("PROVISION_CLUSTER_IFNAME")
    assert interface, "/etc/environment names no cluster interface"
    assert env.get("NCCL_SOCKET_IFNAME") == interface
    assert env.get("GLOO_SOCKET_IFNAME") == interface
    held = host.run(f"ip -o addr show dev {shlex.quote(interface)}").stdout
    assert f" {address}/" in held, f"{interface} does not hold the cluster address {address}"


def test_cloud_init_leaves_etc_hosts_alone(host: Any) -> None:
    """cloud-init's manage_etc_hosts: true would rewrite /etc/hosts at boot without the
    cluster nodes (Debian's cloud images set it)."""
    if not host.file("/etc/cloud/cloud.cfg.d").is_directory:
        pytest.skip("no cloud-init on this host")
    assert host.file("/etc/cloud/cloud.cfg.d/99-provision-etc-hosts.cfg").contains("^manage_etc_hosts: false$")


def test_training_user_has_the_cluster_key(host: Any, settings: dict[str, Any]) -> None:
    user = settings["training_user"]
    home = f"/home/{user}"
    assert host.user(user).exists
    # One uid/gid on every node, so files on the NFS shares belong to the same account.
    assert host.user(user).uid == settings["training_uid"]
    assert host.user(user).gid == settings["training_uid"]
    key = host.file(f"{home}/.ssh/id_ed25519")
    assert key.user == user
    assert key.mode == 0o600
    assert host.file(f"{home}/.ssh/authorized_keys").contains("ssh-ed25519")
    assert host.file(f"{home}/.ssh/known_hosts").size > 0
    # The private key and the authorized key are one pair: each node accepts the key every
    # node logs in with (one cluster key, written by the base step to every node).
    public = host.run(f"ssh-keygen -y -f {shlex.quote(f'{home}/.ssh/id_ed25519')}")
    assert public.rc == 0, f"{home}/.ssh/id_ed25519 is not a readable private key: {public.stderr.strip()}"
    authorized = host.file(f"{home}/.ssh/authorized_keys").content_string.split("\n")
    mine = " ".join(public.stdout.split()[:2])
    assert any(" ".join(line.split()[:2]) == mine for line in authorized), (
        f"{home}/.ssh/authorized_keys does not hold the public half of id_ed25519 ({mine[:40]}...)"
    )


def test_training_user_reaches_every_other_node_by_ssh(
    host: Any, settings: dict[str, Any], expected: dict[str, Any]
) -> None:
    """The promise the keys exist for: as the training user, every other node answers over
    SSH at its cluster address with no prompt. known_hosts lists each node's host keys
    under its name and cluster address, so strict host-key checking passes; verify logs in
    as root, hence runuser."""
    me = host.backend.get_hostname()
    others = {name: address for name, address in expected["all_nodes"].items() if name != me}
    if not others:
        pytest.skip("a one-node cluster: no other node to reach")
    user = shlex.quote(settings["training_user"])
    for name, address in others.items():
        done = host.run(
            f"timeout 60 runuser -u {user} -- ssh -o BatchMode=yes -o StrictHostKeyChecking=yes "
            f"-o ConnectTimeout=10 {shlex.quote(address)} true"
        )
        # On a refusal: which key this node offered, to compare with the other's authorized_keys.
        offered = "" if done.rc == 0 else host.run(f"ssh-keygen -lf /home/{user}/.ssh/id_ed25519").stdout.strip()
        assert done.rc == 0, f"{user} cannot reach {name} at {address}: {done.stderr.strip()} (offered: {offered})"


def test_unattended_upgrades_never_touch_nvidia_or_cuda(host: Any) -> None:
    conf = host.file("/etc/apt/apt.conf.d/51provision-unattended-upgrades")
    for prefix in ("nvidia-", "libnvidia-", "cuda-"):
        assert conf.contains(f'"{prefix}";')
