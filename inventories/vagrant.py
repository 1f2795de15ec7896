# The two VMs of the repository's Vagrantfile: pyinfra's own inventory format.
#
#   vagrant up --provider=libvirt          (or --provider=virtualbox)
#   provision up inventories/vagrant.py
#
# The provider is taken from PROVISION_VAGRANT_PROVIDER or VAGRANT_DEFAULT_PROVIDER, else
# from the keys `vagrant up` left under .vagrant/machines/, else libvirt.
#
# SSH goes to the fixed forwarded ports on 127.0.0.1 with the key Vagrant made for each
# VM; cluster traffic (NFS, iperf3, torchrun) uses the private network 10.78.0.0/24.
# Host keys: the VMs' keys are not known in advance, so the first connection pins them
# in .vagrant/known_hosts (accept-new); after that a changed key is refused.

import os
from pathlib import Path

_root = Path(__file__).resolve().parent.parent  # the directory holding the Vagrantfile
# The provider: as set in the environment, else the one `vagrant up` made keys for.
_made = [p for p in ("libvirt", "virtualbox")
         if (_root / ".vagrant" / "machines" / "vagrant1" / p / "private_key").is_file()]
_provider = (os.environ.get("PROVISION_VAGRANT_PROVIDER") or os.environ.get("VAGRANT_DEFAULT_PROVIDER")
             or (_made[0] if _made else "libvirt"))
# Data disks by stable id: virtio serials under libvirt, SATA serials under VirtualBox.
_disk_prefix = "ata-VBOX_HARDDISK_" if _provider == "virtualbox" else "virtio-"


def _host(name, ssh_port, cluster_address):
    return (name, {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": ssh_port,
        "ssh_user": "vagrant",
        "ssh_key": str(_root / ".vagrant" / "machines" / name / _provider / "private_key"),
        "ssh_known_hosts_file": str(_root / ".vagrant" / "known_hosts"),
        "ssh_strict_host_key_checking": "accept-new",
        "cluster_address": cluster_address,
        "cluster_cidr": "10.78.0.0/24",
        "cluster_interface": "eth1",
        "data_disks": [f"/dev/disk/by-id/{_disk_prefix}NVME-{name}-{k}" for k in (1, 2)],
        # pip checks every file from the index against this lock (README, "Supply chain").
        "pip_lock_file": str(_root / "inventories" / "pip-lock.txt"),
    })


nodes = [
    _host("vagrant1", 2222, "10.78.0.11"),
    _host("vagrant2", 2200, "10.78.0.12"),
]

# The NFS server and backup target.
storage = ["vagrant1"]
