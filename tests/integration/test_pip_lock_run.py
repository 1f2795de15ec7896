"""An install from an index, as the frameworks step builds it (rules.frameworks), run by a
real pip into a real venv: with the lock's hash pip installs; with any other hash it
refuses and installs nothing. The index is a local PEP 503 folder holding one wheel that
pip downloads from the package registry first (the same registry the suite installs from)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import venv
from pathlib import Path

from provision.operations.venv import install_command
from provision.rules import frameworks as framework_rules
from provision.settings import Settings

WHEEL = "nvidia-ml-py==13.580.126"  # small, pure Python, one of the pins


def _index(tmp_path: Path) -> tuple[str, str]:
    """A file:// simple index with the wheel; returns (index URL, the wheel's sha256)."""
    wheels = tmp_path / "download"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", WHEEL, "-d", str(wheels)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("*.whl")
    project = tmp_path / "simple" / "nvidia-ml-py"
    project.mkdir(parents=True)
    wheel.rename(project / wheel.name)
    (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return (tmp_path / "simple").as_uri(), hashlib.sha256((project / wheel.name).read_bytes()).hexdigest()


def _install(tmp_path: Path, index: str, digest: str) -> subprocess.CompletedProcess[str]:
    target = tmp_path / f"venv-{digest[:8]}"
    venv.create(target, with_pip=True)
    lock = tmp_path / f"lock-{digest[:8]}.txt"
    lock.write_text(f"{WHEEL} \\\n    --hash=sha256:{digest}\n")
    settings = Settings(pip_index_url=index, pip_lock_file=str(lock))
    command = install_command(str(target / "bin" / "pip"), [], framework_rules.pip_source_args(settings))
    assert f"--require-hashes -r {framework_rules.REMOTE_LOCK}" in command
    command = command.replace(framework_rules.REMOTE_LOCK, str(lock))  # the uploaded copy's place
    return subprocess.run(
        f"{command} --no-cache-dir --isolated", shell=True, capture_output=True, text=True, timeout=300
    )


def test_pip_installs_what_the_lock_hashes_and_refuses_anything_else(tmp_path: Path) -> None:
    index, digest = _index(tmp_path)
    good = _install(tmp_path, index, digest)
    assert good.returncode == 0, good.stderr
    assert list((tmp_path / f"venv-{digest[:8]}").glob("lib/python*/site-packages/pynvml.py"))

    wrong = "0" * 64
    bad = _install(tmp_path, index, wrong)
    assert bad.returncode != 0
    assert "DO NOT MATCH THE HASHES" in bad.stderr, bad.stderr
    assert not list((tmp_path / f"venv-{wrong[:8]}").glob("lib/python*/site-packages/pynvml.py"))
