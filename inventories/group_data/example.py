# Settings for every host of inventories/example.py: pyinfra puts each host of an
# inventory file into a group named after the file, and group_data/<group>.py applies to
# that group. Settings for every host of every inventory in this folder would go in
# group_data/all.py. See `provision inventory knobs` for the full list.

ssh_user = "ubuntu"
_sudo = True  # pyinfra global argument: run operations through sudo

cluster_cidr = "10.10.0.0/24"  # NFS exports go to this network only
nvidia_driver_branch = "580"
torch_version = "2.13.0"

# pip checks every file it takes from the index against this lock's hashes; `up` refuses an
# index install without one. Make it from the pins above against your index (README,
# "Supply chain"): uv pip compile --universal --generate-hashes pins.in -o inventories/pip-lock.txt
# pip_lock_file = "inventories/pip-lock.txt"
