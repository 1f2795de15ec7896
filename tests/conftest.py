"""Shared test helpers: run the CLI in-process and capture what a user would see."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest


@dataclass
class CliResult:
    code: int  # the process exit code a user would get
    out: str  # stdout
    err: str  # stderr


@pytest.fixture
def cli(capsys, monkeypatch):
    """Call `provision ARGS...` in this process (main() with its error handling)."""

    def run(*args: str) -> CliResult:
        from provision.cli import main

        monkeypatch.setattr(sys, "argv", ["provision", *args])
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def pytest_collection_modifyitems(config, items):
    """Destructive drills (killing VMs, rebooting the NFS server) run after everything else,
    so the shared testbed is whole for every other test. Order is otherwise kept."""
    items.sort(key=lambda item: item.get_closest_marker("destructive") is not None)
