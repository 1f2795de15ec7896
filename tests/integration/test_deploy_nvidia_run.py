"""The nvidia step's keyring download commands run for real against local files."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.unit.test_deploy_nvidia import run_download


def test_a_keyring_with_another_sha256_never_reaches_its_place(tmp_path: Path) -> None:
    served = tmp_path / "served.gpg"
    served.write_bytes(b"the repository key")
    dest = tmp_path / "keyrings" / "cuda-archive-keyring.gpg"
    wrong = run_download(tmp_path, "a" * 64)
    assert wrong.returncode == 1
    assert f"SHA-256 is not {'a' * 64}" in wrong.stderr
    assert list(dest.parent.iterdir()) == []  # neither the keyring nor the temporary file
    right = run_download(tmp_path, hashlib.sha256(served.read_bytes()).hexdigest())
    assert right.returncode == 0, right.stderr
    assert dest.read_bytes() == b"the repository key"
    assert oct(dest.stat().st_mode)[-3:] == "644"
    assert list(dest.parent.iterdir()) == [dest]
