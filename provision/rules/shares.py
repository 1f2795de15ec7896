"""Where the NFS shares live: the storage host's exported directories and the path every
node (server included) sees each share at. The nfs step sets them up; the monitoring
step's node collector checks that each is mounted."""

from __future__ import annotations

from provision.settings import Settings


def export_paths(settings: Settings) -> list[str]:
    """Server-side directories that are exported, one per share."""
    return [f"{settings.nfs_export_root}/{name}" for name in settings.nfs_exports]


def mount_paths(settings: Settings) -> list[str]:
    """Where every node (server included) sees the shares."""
    return [f"{settings.nfs_mount_root}/{name}" for name in settings.nfs_exports]
