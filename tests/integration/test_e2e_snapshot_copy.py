"""The testbed cache copies the inventory's secrets whole (tests/e2e/snapshot.py): they are
per host, in folders, and a restored testbed whose hosts hold passwords the controller lacks
fails its next `up` (the backups step refuses to replace a host's password)."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.e2e import snapshot


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        str(p.relative_to(root)): (stat.S_IMODE(p.stat().st_mode), p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    }


def test_secrets_in_folders_are_copied_with_their_modes(tmp_path: Path) -> None:
    src = tmp_path / "controller"
    (src / "backup-passwords").mkdir(parents=True, mode=0o700)
    (src / "backup-keys").mkdir(mode=0o700)
    for path, text in {
        "train_ed25519": "training key",
        "backup-passwords/node1": "one",
        "backup-passwords/node2": "two",
        "backup-keys/node2_ed25519": "key",
    }.items():
        (src / path).write_text(text)
        (src / path).chmod(0o600)
    snapshot._copy_tree(src, tmp_path / "copy")
    assert _tree(tmp_path / "copy") == _tree(src)
    assert _tree(tmp_path / "copy")["backup-passwords/node2"] == (0o600, b"two")
