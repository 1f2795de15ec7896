"""Files baked into the base image (the same for every node) and the per-node files a
seed disk carries. Kept as data so the image recipe hash covers them: changing any of
these rebuilds the image.

Boot time under TCG is dominated by process starts (each fork/exec is emulated), so the
seed step is one copy, and the NICs are configured by systemd-networkd (one daemon)
instead of ifupdown's scripts.
"""

from __future__ import annotations

SEED_LABEL = "PVSEED"  # ext4 label of the per-node seed disk
SEED_SERIAL = "PVSEED"  # its virtio serial: the guest finds it in /sys/block/*/serial
CLUSTER_CIDR = "10.77.0.0/24"  # the private network that exists only inside the testbed
USER_NET_ADDRESS = "10.0.2.15/24"  # qemu user networking's fixed guest address
USER_NET_GATEWAY = "10.0.2.2"  # ... its gateway (the host, NATed)
USER_NET_DNS = "10.0.2.3"  # ... its DNS forwarder

# The seed script runs before networking and sshd on every boot. The seed disk holds a
# tree (its own host key, root's authorized_keys, networkd files, /etc/hosts) that is
# copied over / as it is (/etc/hosts on the first boot only); the shared base image
# carries no host key at all. The disk is found by its serial in sysfs with shell
# builtins only, so nothing waits for udev.
SEED_SCRIPT = f"""#!/bin/sh
# provision testbed: copy this node's identity from the seed disk into place.
set -eu
dev=""
i=0
while [ -z "$dev" ]; do
    for serial in /sys/block/*/serial; do
        value=""
        read -r value < "$serial" || true  # sysfs serials may lack a final newline
        if [ "$value" = "{SEED_SERIAL}" ]; then
            dev="${{serial%/serial}}"
            dev="/dev/${{dev##*/}}"
        fi
    done
    i=$((i + 1))
    if [ -z "$dev" ]; then
        if [ "$i" -gt 150 ]; then echo "provision-seed: no disk with serial {SEED_SERIAL}" >&2; exit 1; fi
        sleep 0.2
    fi
done
mnt=/run/provision-seed
mkdir -p "$mnt"
mount -o ro -t ext4 "$dev" "$mnt"
# /etc/hosts is seeded on the first boot only: after that it belongs to the node (the base
# step adds a block to it), as on a bare-metal server. Copying it on every boot would undo
# that block and make each `up` after a reboot report a change.
if [ -e /var/lib/provision-seed.done ]; then cp -a /etc/hosts /run/provision-seed.hosts; fi
cp -a "$mnt/tree/." /
if [ -e /run/provision-seed.hosts ]; then cp -a /run/provision-seed.hosts /etc/hosts; fi
: > /var/lib/provision-seed.done
umount "$mnt"
"""

SEED_UNIT = """[Unit]
Description=provision testbed: node identity from the seed disk
DefaultDependencies=no
After=local-fs.target
Wants=network-pre.target
Before=network-pre.target systemd-networkd.service ssh.service

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

# chrony's configuration, in place before the base step installs chrony (chrony's postinst
# hands the file to ucf, which keeps one it finds and writes its own beside it as
# chrony.conf.ucf-dist: checked in a bookworm chroot with apt's options of the base step).
# Debian's own names the
# public NTP pool, and a testbed VM reaches nothing outside this machine but the package
# mirror. No source at all: the VMs boot with the host's clock, and `ntp_servers` in the
# inventory still adds servers through /etc/chrony/sources.d, as on a real host.
CHRONY_CONF = """# provision testbed: Debian's chrony.conf without its public pool (see guest_files.py)
confdir /etc/chrony/conf.d
sourcedir /run/chrony-dhcp
sourcedir /etc/chrony/sources.d
keyfile /etc/chrony/chrony.keys
driftfile /var/lib/chrony/chrony.drift
ntsdumpdir /var/lib/chrony
logdir /var/log/chrony
maxupdateskew 100.0
rtcsync
makestep 1 3
leapsectz right/UTC
"""

INTERFACES = """# provision testbed: eth0 and eth1 are configured by systemd-networkd
# (/etc/systemd/network/, written from the seed disk at boot).
auto lo
iface lo inet loopback
"""

# The initrd only has to find an ext4 root on a virtio disk. The default (MODULES=most)
# makes a 130 MB initrd that takes seconds to unpack under TCG on every boot.
INITRAMFS_CONF = "MODULES=list\n"
INITRAMFS_MODULES = "virtio_pci\nvirtio_blk\next4\n"

# Units masked in the image: timers that would grab the dpkg lock or touch disks in the
# middle of a test run, and ifupdown's networking.service (networkd does the NICs).
MASKED_UNITS = (
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "e2scrub_reap.service",  # costs seconds of every TCG boot, finds nothing on a fresh VM
    "networking.service",
)

# Units the image's packages enable that must not start on every node: MariaDB, baked in
# for the head's slurm_accounting, is the head's alone (`up` enables it there), and its
# socket units too: socket activation listens on every address, bind-address or not (the
# accounting e2e test found *:3306 on a node that runs no accounting). slurmdbd needs no
# entry: its unit waits for /etc/slurm/slurmdbd.conf, which only the head gets.
DISABLED_UNITS = ("mariadb.service", "mariadb.socket", "mariadb-extra.socket")

# Units enabled in the image: (wanted-by target, unit file path in the image).
ENABLED_UNITS = (
    ("multi-user.target", "/etc/systemd/system/provision-seed.service"),
    ("multi-user.target", "/lib/systemd/system/systemd-networkd.service"),
    ("sockets.target", "/lib/systemd/system/systemd-networkd.socket"),
)


APT_SOURCES = "etc/apt/sources.list.d/debian.sources"  # the guest's sources, inside the rootfs


def image_files(label: str, apt_sources: str) -> dict[str, tuple[str, int]]:
    """Path inside the rootfs -> (content, mode) for the shared base image."""
    return {
        "etc/fstab": (f"LABEL={label} / ext4 rw,errors=remount-ro 0 0\n", 0o644),
        "etc/resolv.conf": (f"nameserver {USER_NET_DNS}\n", 0o644),
        "etc/machine-id": ("", 0o444),  # empty: each node makes its own on first boot
        "etc/network/interfaces": (INTERFACES, 0o644),
        APT_SOURCES: (apt_sources, 0o644),
        "etc/ssh/sshd_config.d/provision-testbed.conf": (SSHD_CONFIG, 0o644),
        "etc/chrony/chrony.conf": (CHRONY_CONF, 0o644),
        "usr/local/sbin/provision-seed": (SEED_SCRIPT, 0o755),
        "etc/systemd/system/provision-seed.service": (SEED_UNIT, 0o644),
        "etc/initramfs-tools/conf.d/provision-testbed.conf": (INITRAMFS_CONF, 0o644),
        "etc/initramfs-tools/modules": (INITRAMFS_MODULES, 0o644),
    }


def node_networks(mgmt_mac: str, cluster_mac: str, cluster_address: str, prefix: int) -> dict[str, str]:
    """The node's systemd-networkd files, matched by MAC so NIC order cannot swap them:
    eth0 on qemu user networking (default route), eth1 on the cluster (no route off it)."""
    return {
        "10-eth0.network": (
            f"[Match]\nMACAddress={mgmt_mac}\n\n[Network]\nAddress={USER_NET_ADDRESS}\n"
            f"Gateway={USER_NET_GATEWAY}\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n"
        ),
        "20-eth1.network": (
            f"[Match]\nMACAddress={cluster_mac}\n\n[Network]\nAddress={cluster_address}/{prefix}\n"
            "LinkLocalAddressing=no\nIPv6AcceptRA=no\n"
        ),
    }


def node_hosts(own: str, peers: dict[str, str]) -> str:
    """/etc/hosts: localhost, the node's own name on 127.0.1.1 as the Debian installer
    writes it (so `up` meets what a freshly installed server has: base must put the
    cluster addresses above that line), and every node by its cluster address."""
    lines = ["127.0.0.1 localhost", f"127.0.1.1 {own}", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{address} {name}" for name, address in peers.items()]
    return "\n".join(lines) + "\n"
