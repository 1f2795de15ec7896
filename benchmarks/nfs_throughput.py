"""NFS throughput from a client, as a ratio of the same fio job on the server's own data
volume, measured in the same run.

    .venv/bin/python benchmarks/nfs_throughput.py INVENTORY [--size-mib 256] [--target 0.10]

Runs on a provisioned cluster (the testbed after `provision up`): the storage host
exports /data/shared, the first other node mounts it at /shared. One fio job (sequential
1 MiB blocks, O_DIRECT, a write pass then a read pass) runs twice: on the client against
/shared/scratch, and on the server against /data (the volume the share lives on). The
figures are client/server for write and read. Exits 1 when either is under --target.
"""

from __future__ import annotations

import argparse
import shlex
import sys

import pyinfra_cli  # noqa: F401  (gevent's patches before paramiko's threads, as the CLI does)

from provision import inventory, remote
from provision.validate.parsers import fio_jobs


def fio_command(directory: str, size_mib: int, user: str | None) -> str:
    """The job, run as ``user`` (on a client root is squashed and may not write the share)."""
    name = f"{directory}/bench-fio.dat"
    common = (
        f"--filename={name} --size={size_mib}M --bs=1M --direct=1 --ioengine=psync --numjobs=1 --output-format=json"
    )

    def as_user(command: str) -> str:
        return f"su -s /bin/sh {user} -c {shlex.quote(command)}" if user else command

    return (
        f"{as_user(f'fio --name=write --rw=write --end_fsync=1 {common}')} && "
        f"sync && echo 3 > /proc/sys/vm/drop_caches && "
        f"{as_user(f'fio --name=read --rw=read {common}')}; rc=$?; {as_user(f'rm -f {name}')}; exit $rc"
    )


def measure(node: inventory.Node, directory: str, size_mib: int, user: str | None = None) -> tuple[float, float]:
    """(write, read) bytes/s of the job in directory on node."""
    result = remote.run(node, fio_command(directory, size_mib, user), timeout=1800)
    if not result.ok:
        raise SystemExit(f"{node.name}: fio failed: {result.stderr.strip() or result.stdout[-500:]}")
    # two JSON reports back to back: split where the second one starts
    first, _, second = result.stdout.partition("\n}\n{")
    write = fio_jobs(first + "\n}\n")["write"].write_bytes_per_s
    read = fio_jobs("{" + second)["read"].read_bytes_per_s
    return write, read


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory")
    parser.add_argument("--size-mib", type=int, default=256, help="file size of the fio job")
    parser.add_argument("--target", type=float, default=0.10, help="lowest acceptable NFS/local ratio")
    args = parser.parse_args()
    cluster = inventory.load(args.inventory)
    server = cluster.storage_node()
    clients = [n for n in cluster.nodes if server and n.name != server.name]
    if server is None or not clients:
        raise SystemExit("needs a storage host and at least one other node")
    s = server.settings
    local_w, local_r = measure(server, s.data_mount, args.size_mib)
    nfs_w, nfs_r = measure(clients[0], f"{s.nfs_mount_root}/scratch", args.size_mib, s.training_user)
    mib = 2**20
    print(f"server local {s.data_mount}: write {local_w / mib:.1f} MiB/s, read {local_r / mib:.1f} MiB/s")
    print(f"client {clients[0].name} over NFS: write {nfs_w / mib:.1f} MiB/s, read {nfs_r / mib:.1f} MiB/s")
    code = 0
    for what, ratio in (("write", nfs_w / local_w), ("read", nfs_r / local_r)):
        ok = ratio >= args.target
        code |= 0 if ok else 1
        print(f"nfs_{what}_vs_local: {ratio:.3f} (target >= {args.target}) {'OK' if ok else 'MISSED'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
