"""Shared test helpers: run the CLI in-process and capture what a user would see."""

from __future__ import annotations

import os
import sys
import time
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


# CI stops a run at 90 minutes and then nothing lands. The destructive drills run last; if
# the suite has already used its budget when one is due, that drill is SKIPPED with the
# reason (pytest -ra lists it in the summary) instead of pushing the run past the limit.
SUITE_BUDGET_S = float(os.environ.get("PROVISION_TEST_BUDGET_S", 70 * 60))
_SUITE_START = time.monotonic()


def pytest_runtest_setup(item):
    elapsed = time.monotonic() - _SUITE_START
    if item.get_closest_marker("destructive") and elapsed > SUITE_BUDGET_S:
        pytest.skip(f"time budget: the suite has run {elapsed / 60:.0f} of its {SUITE_BUDGET_S / 60:.0f} "
                    "minutes; this destructive drill did not fit (set PROVISION_TEST_BUDGET_S to run it)")
