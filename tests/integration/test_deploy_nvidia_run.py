"""The nvidia step's keyring download commands run for real against local files."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from provision.rules.nvidia import keyring_fingerprints
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


def _gpg_key(tmp_path: Path, name: str) -> tuple[bytes, str]:
    """A fresh RSA key exported binary, as NVIDIA's keyring file is, and gpg's own
    fingerprint of it."""
    home = tmp_path / f"gnupg-{name}"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    uid = f"{name} <{name}@test.invalid>"
    try:
        gpg = ["gpg", "--batch", "--passphrase", ""]
        subprocess.run([*gpg, "--quick-generate-key", uid, "rsa2048", "sign", "never"], env=env, check=True)
        key = subprocess.run(["gpg", "--batch", "--export", uid], env=env, check=True, capture_output=True).stdout
        listing = ["gpg", "--batch", "--with-colons", "--fingerprint", uid]
        colons = subprocess.run(listing, env=env, check=True, capture_output=True, text=True).stdout
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, capture_output=True, timeout=30)
    fingerprint = next(line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr:"))
    return key, fingerprint


def test_the_keyring_reaches_its_place_only_when_it_holds_exactly_the_published_key(tmp_path: Path) -> None:
    key, fingerprint = _gpg_key(tmp_path, "repo")
    other, _ = _gpg_key(tmp_path, "intruder")
    assert keyring_fingerprints(key) == [fingerprint]  # the same fingerprint as gpg's
    served = tmp_path / "served.gpg"
    dest = tmp_path / "keyrings" / "cuda-archive-keyring.gpg"
    served.write_bytes(key + other)  # one more key: apt would trust it too
    refused = run_download(tmp_path, None, fingerprint)
    assert refused.returncode == 1
    assert f"does not hold exactly the key {fingerprint}" in refused.stderr
    assert list(dest.parent.iterdir()) == []
    served.write_bytes(other)
    assert run_download(tmp_path, None, fingerprint).returncode == 1
    served.write_bytes(key)
    right = run_download(tmp_path, None, fingerprint.lower())
    assert right.returncode == 0, right.stderr
    assert dest.read_bytes() == key


def test_persistenced_is_restarted_for_its_drop_in_only_on_the_installed_module(tmp_path: Path) -> None:
    """After a driver upgrade the old module stays loaded until the reboot, and a daemon
    restarted on it fails (API mismatch): the restart runs only when the loaded module is
    the installed one. modinfo and systemctl are stand-ins on PATH that say what they were
    asked; the loaded module's version is a file in place of /sys/module/nvidia/version."""
    from provision.deploys import nvidia

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "modinfo").write_text("#!/bin/sh\necho 580.95.05\n")
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    for stub in bin_dir.iterdir():
        stub.chmod(0o755)
    loaded = tmp_path / "version"
    command = nvidia.PERSISTENCED_RESTART.replace("/sys/module/nvidia/version", str(loaded))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def restarts(version: str | None) -> list[str]:
        calls.unlink(missing_ok=True)
        loaded.unlink(missing_ok=True)
        if version is not None:
            loaded.write_text(version + "\n")
        subprocess.run(["sh", "-c", command], env=env, check=True, timeout=30)
        return calls.read_text().splitlines() if calls.exists() else []

    assert restarts("580.95.05") == ["try-restart nvidia-persistenced.service"]
    assert restarts("580.82.07") == []  # an older module still loaded: the reboot starts it
    assert restarts(None) == []  # no module loaded
