"""The suite's time budget (tests/conftest.py): an end-to-end test skipped for time is named
at the end, and it fails the run (unless PROVISION_TEST_REQUIRE_ALL=0). Run as a child pytest
on a throwaway tree that has the real conftest and one e2e-tier test, so the hooks are the
ones CI runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _suite(tmp_path: Path, budget_s: str, require_all: str | None = None) -> subprocess.CompletedProcess[str]:
    tests = tmp_path / "tests"
    (tests / "e2e").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "e2e" / "test_one.py").write_text("def test_due():\n    assert 1 + 1 == 2\n")
    env = {k: v for k, v in os.environ.items() if k != "PROVISION_TEST_REQUIRE_ALL"}  # the default, as CI has it
    env["PROVISION_TEST_BUDGET_S"] = budget_s
    if require_all is not None:
        env["PROVISION_TEST_REQUIRE_ALL"] = require_all
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_by_default_an_e2e_test_skipped_for_time_fails_the_run_and_is_named(tmp_path: Path) -> None:
    done = _suite(tmp_path, "0")
    assert done.returncode == 1, done.stdout
    assert "NOT RUN: time budget" in done.stdout
    assert "tests/e2e/test_one.py::test_due" in done.stdout
    assert "1 skipped" in done.stdout


def test_within_the_budget_the_same_test_runs_and_passes(tmp_path: Path) -> None:
    done = _suite(tmp_path, "3600")
    assert done.returncode == 0, done.stdout
    assert "1 passed" in done.stdout
    assert "NOT RUN" not in done.stdout


def test_without_require_all_a_skip_for_time_is_named_and_the_run_passes(tmp_path: Path) -> None:
    done = _suite(tmp_path, "0", require_all="0")
    assert done.returncode == 0, done.stdout
    assert "NOT RUN: time budget" in done.stdout
    assert "tests/e2e/test_one.py::test_due" in done.stdout
