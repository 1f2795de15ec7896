"""Files baked into the base image (the same for every node) and the per-node files a
seed disk carries. Kept as data so the image recipe hash covers them: changing any of
these rebuilds the image."""

from __future__ import annotations

SEED_LABEL = "PVSEED"  # ext4 label of the per-node seed disk
CLUSTER_CIDR = "10.77.0.0/24"  # the private network that exists only inside the testbed
USER_NET_ADDRESS = "10.0.2.15/24"  # qemu user networking's fixed guest address
USER_NET_GATEWAY = "10.0.2.2"  # ... its gateway (the host, NATed)
USER_NET_DNS = "10.0.2.3"  # ... its DNS forwarder

# The seed script runs before networking and sshd on every boot. It copies this node's
# identity (its own host key, root's authorized_keys, static network, /etc/hosts) from
# the seed disk; the shared base image carries no host key at all.
SEED_SCRIPT = f"""#!/bin/sh
# provision testbed: copy this node's identity from the seed disk into place.
set -eu
dev=/dev/disk/by-label/{SEED_LABEL}
i=0
while [ ! -e "$dev" ]; do
    i=$((i + 1))
    if [ "$i" -gt 150 ]; then echo "provision-seed: $dev not found" >&2; exit 1; fi
    sleep 0.2
done
mnt=/run/provision-seed
mkdir -p "$mnt"
mount -o ro "$dev" "$mnt"
rm -f /etc/ssh/ssh_host_*
install -m 0600 "$mnt/ssh/ssh_host_ed25519_key" /etc/ssh/ssh_host_ed25519_key
install -m 0644 "$mnt/ssh/ssh_host_ed25519_key.pub" /etc/ssh/ssh_host_ed25519_key.pub
install -d -m 0700 /root/.ssh
install -m 0600 "$mnt/root/authorized_keys" /root/.ssh/authorized_keys
install -d -m 0755 /etc/network/interfaces.d
install -m 0644 "$mnt/network/interfaces" /etc/network/interfaces.d/provision-testbed
install -m 0644 "$mnt/hosts" /etc/hosts
umount "$mnt"
"""

SEED_UNIT = """[Unit]
Description=provision testbed: node identity from the seed disk
DefaultDependencies=no
After=local-fs.target systemd-udev-trigger.service
Wants=systemd-udev-trigger.service network-pre.target
Before=network-pre.target networking.service ssh.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/provision-seed

[Install]
WantedBy=multi-user.target
"""

SSHD_CONFIG = """# provision testbed: key-only root login with the host key from the seed disk.
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
PermitRootLogin prohibit-password
UseDNS no
"""

INTERFACES = """# provision testbed: per-node interfaces come from the seed disk.
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback
"""

# Timers that would grab the dpkg lock or touch disks in the middle of a test run.
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
)


def image_files(label: str, apt_sources: str) -> dict[str, tuple[str, int]]:
    """Path inside the rootfs -> (content, mode) for the shared base image."""
    return {
        "etc/fstab": (f"LABEL={label} / ext4 rw,errors=remount-ro 0 0\n", 0o644),
        "etc/resolv.conf": (f"nameserver {USER_NET_DNS}\n", 0o644),
        "etc/machine-id": ("", 0o444),  # empty: each node makes its own on first boot
        "etc/network/interfaces": (INTERFACES, 0o644),
        "etc/apt/sources.list.d/debian.sources": (apt_sources, 0o644),
        "etc/ssh/sshd_config.d/provision-testbed.conf": (SSHD_CONFIG, 0o644),
        "usr/local/sbin/provision-seed": (SEED_SCRIPT, 0o755),
        "etc/systemd/system/provision-seed.service": (SEED_UNIT, 0o644),
    }


def node_interfaces(cluster_address: str, prefix: int) -> str:
    """The node's /etc/network/interfaces.d file: eth0 on user net, eth1 on the cluster."""
    return (
        f"auto eth0\niface eth0 inet static\n    address {USER_NET_ADDRESS}\n"
        f"    gateway {USER_NET_GATEWAY}\n\n"
        f"auto eth1\niface eth1 inet static\n    address {cluster_address}/{prefix}\n"
    )


def node_hosts(peers: dict[str, str]) -> str:
    """/etc/hosts: localhost and every node by its cluster address (name -> address)."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{address} {name}" for name, address in peers.items()]
    return "\n".join(lines) + "\n"
