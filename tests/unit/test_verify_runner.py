"""`provision verify` on the controller: its dependencies are the package's own."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from provision import verify
from provision.errors import ProvisionError
from provision.inventory import Cluster

ROOT = Path(__file__).resolve().parents[2]


def test_pytest_and_testinfra_are_runtime_dependencies() -> None:
    # verify is a shipped command, so a plain `pip install provision` must be able to run it.
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps}
    assert {"pytest", "pytest-testinfra"} <= names


def test_a_controller_without_testinfra_gets_one_clear_error(monkeypatch, tmp_path) -> None:
    real = importlib.util.find_spec

    def test_stand_in_find_spec(name: str, *args: object) -> object:
        return None if name == "testinfra" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", test_stand_in_find_spec)
    with pytest.raises(ProvisionError, match="needs pytest-testinfra"):
        verify.run(Cluster(tmp_path / "inv.py", ()), workdir=str(tmp_path / "work"))
