"""templates/, training/ and inventories/ live at the repository root but must still be
found when provision is installed from a wheel (non-editable)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)], check=True, timeout=300
    )
    (built,) = out.glob("provision-*.whl")
    return built


def test_wheel_bundles_the_top_level_resource_trees(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "provision/_bundled/inventories/example.py" in names
    assert "provision/_bundled/templates/README.md" in names
    if (ROOT / "training" / "train_ddp.py").exists():
        assert "provision/_bundled/training/train_ddp.py" in names


def test_non_editable_install_finds_resources_outside_the_source_tree(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
    probe = (
        "from provision.resources import inventories_dir, templates_dir; "
        "d = inventories_dir(); print(d); assert (d / 'example.py').is_file(); "
        "assert (templates_dir() / 'README.md').is_file()"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the installed copy
    result = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    inventories = Path(result.stdout.splitlines()[0])
    assert str(env_dir) in str(inventories), "resources must come from the installed wheel"
