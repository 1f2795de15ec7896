# An inventory for real servers: pyinfra's own format.
#
# Each top-level list is a group. A host is a name, or (name, data). Host data holds
# pyinfra's SSH keys (ssh_hostname, ssh_user, ssh_key, ...) and provision's settings;
# `provision inventory knobs` lists every setting with its default. Settings shared by
# many hosts go in group_data/<group>.py (group_data/all.py for every host).
#
# The management network (ssh_hostname) and the cluster network (cluster_address) are
# kept apart, as on a real rack: SSH goes over the first, NCCL, NFS and iperf3 over
# the second.

gpu_nodes = [
    ("gpu01", {"ssh_hostname": "192.0.2.11", "cluster_address": "10.10.0.11",
               "data_disks": ["/dev/disk/by-id/nvme-SAMSUNG_MZ1L23T8HBLA-00A07_S6EXAMPLE0001"]}),
    ("gpu02", {"ssh_hostname": "192.0.2.12", "cluster_address": "10.10.0.12",
               "data_disks": "auto"}),
]

# The NFS server and backup target. A host may sit in several groups.
storage = ["gpu01"]
