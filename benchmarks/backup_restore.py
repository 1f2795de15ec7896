"""Backup and restore time for checkpoint-like data, as ratios of a plain copy of the
same bytes on the same host, measured in the same run.

    .venv/bin/python benchmarks/backup_restore.py INVENTORY [--size-mib 1024] [--target 20]

Runs on a provisioned cluster (the testbed after `provision up`). On the storage host it
writes --size-mib of incompressible files (like checkpoints: a few large files) into the
checkpoints share, then times: a plain `cp -a` of them on the data volume (reference),
`provision backup run`'s unit (restic backup + retention), and a restore of that
snapshot into a new directory (restic restore --verify). Prints backup/copy and
restore/copy; exits 1 when either is over --target. Removes its files and forgets its
snapshot afterwards.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time

import pyinfra_cli  # noqa: F401  (gevent's patches before paramiko's threads, as the CLI does)

from provision import inventory, remote
from provision.backup import runs as backup
from provision.rules import backups as backup_layout

FILE_MIB = 128  # size of each checkpoint-like file


def sh(node: inventory.Node, command: str, timeout_s: float = 3600) -> float:
    """Run a command; return its wall time in seconds (fails the benchmark if it fails)."""
    start = time.monotonic()
    result = remote.run(node, command, timeout=timeout_s)
    if not result.ok:
        raise SystemExit(f"{node.name}: {command[:80]}: {result.stderr.strip()[-500:]}")
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory")
    parser.add_argument("--size-mib", type=int, default=1024, help="bytes of checkpoint-like data")
    parser.add_argument("--target", type=float, default=20.0, help="highest acceptable ratio to a copy")
    args = parser.parse_args()
    cluster = inventory.load(args.inventory)
    node = cluster.storage_node()
    if node is None:
        raise SystemExit("needs a storage host")
    tag = secrets.token_hex(4)
    data = f"{node.settings.nfs_mount_root}/checkpoints/bench-{tag}"
    copy = f"{node.settings.data_mount}/restores/bench-copy-{tag}"
    files = max(1, args.size_mib // FILE_MIB)
    sh(
        node,
        f"mkdir -p {data} && for i in $(seq 1 {files}); do "
        f"head -c {args.size_mib // files}M /dev/urandom > {data}/step-$i.pt; done && sync",
    )
    try:
        sh(node, "sync && echo 3 > /proc/sys/vm/drop_caches")
        copy_s = sh(node, f"mkdir -p {copy} && cp -a {data} {copy}/ && sync")
        sh(node, "sync && echo 3 > /proc/sys/vm/drop_caches")
        ran = backup.run_now(node)
        if not ran.ok:
            raise SystemExit(f"backup failed: {ran.detail}")
        snapshot = ran.data["snapshot"]["id"]
        restored = backup.restore(node, snapshot, None, False, f"bench-{tag}")
        if not restored.ok:
            raise SystemExit(f"restore failed: {restored.detail}")
    finally:
        remote.run(node, f"rm -rf {data} {copy} {node.settings.data_mount}/restores/bench-{tag}", timeout=600)
    remote.run(node, backup.as_root(node, f"{backup_layout.WRAPPER} forget {snapshot} --prune"), timeout=1800)
    print(
        f"{args.size_mib} MiB in {files} files on {node.name}: copy {copy_s:.1f}s, "
        f"backup {ran.seconds:.1f}s, restore {restored.seconds:.1f}s"
    )
    code = 0
    for what, seconds in (("backup", ran.seconds), ("restore", restored.seconds)):
        ratio = seconds / copy_s
        ok = ratio <= args.target
        code |= 0 if ok else 1
        print(f"{what}_vs_copy: {ratio:.2f} (target <= {args.target}) {'OK' if ok else 'MISSED'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
