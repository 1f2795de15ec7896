"""The suite's time budget (tests/conftest.py): an end-to-end test skipped for time is named
at the end, and it fails the run (unless PROVISION_TEST_REQUIRE_ALL=0). Run as a child pytest
on a throwaway tree that has the real conftest and one e2e-tier test, so the hooks are the
ones CI runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


ONE = "def test_due():\n    assert 1 + 1 == 2\n"


def _tree(tmp_path: Path, tests_text: str, budget_s: str | None) -> dict[str, str]:
    """A throwaway tree with the real conftest and one e2e-tier module; the environment a
    child pytest runs it in (the defaults CI has, and this budget)."""
    tests = tmp_path / "tests"
    (tests / "e2e").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "e2e" / "test_one.py").write_text(tests_text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    takes_s(seconds): as in pyproject.toml\n")
    drop = ("PROVISION_TEST_REQUIRE_ALL", "PROVISION_SUITE_STARTED_AT", "PROVISION_TEST_BUDGET_S")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if budget_s is not None:
        env["PROVISION_TEST_BUDGET_S"] = budget_s
    return env


def _suite(
    tmp_path: Path,
    budget_s: str | None,
    require_all: str | None = None,
    tests_text: str = ONE,
    started_at: float | None = None,
) -> subprocess.CompletedProcess[str]:
    env = _tree(tmp_path, tests_text, budget_s)
    if require_all is not None:
        env["PROVISION_TEST_REQUIRE_ALL"] = require_all
    if started_at is not None:
        env["PROVISION_SUITE_STARTED_AT"] = str(started_at)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_under_a_limit_an_e2e_test_skipped_for_time_fails_the_run_and_is_named(tmp_path: Path) -> None:
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


def test_without_a_limit_every_e2e_test_runs_however_late(tmp_path: Path) -> None:
    """A person's ./scripts/test sets no limit: nothing stops the run, so a test is never
    skipped for time, even ten hours after the clock started (a first run on a slow,
    busy machine)."""
    done = _suite(tmp_path, None, started_at=time.time() - 36000)
    assert done.returncode == 0, done.stdout
    assert "1 passed" in done.stdout
    assert "NOT RUN" not in done.stdout


def test_ci_runs_under_its_90_minute_limit(tmp_path: Path) -> None:
    """.ci/run, CI's entry point, sets the limit CI stops a run at, unless one is given:
    the real file, run in a tree whose scripts/test only says what limit it was given."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "test").write_text('#!/bin/sh\necho "limit=${PROVISION_TEST_BUDGET_S:-none}"\n')
    (tmp_path / "scripts" / "test").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PROVISION_TEST_BUDGET_S"}
    said = [
        subprocess.run(["bash", ".ci/run"], cwd=tmp_path, env=env | extra, capture_output=True, text=True, timeout=30)
        for extra in ({}, {"PROVISION_TEST_BUDGET_S": "9000"})
    ]
    assert [s.stdout.strip() for s in said] == ["limit=5400", "limit=9000"], said


def test_a_test_that_would_end_past_the_limit_is_skipped_while_a_short_one_still_runs(tmp_path: Path) -> None:
    """Each e2e test is held to what it can take (its takes_s mark, else 5 minutes): in an
    hour's limit, a 58-minute test does not start, and the 5-minute one beside it runs."""
    two = "import pytest\n\n\n@pytest.mark.takes_s(3480)\ndef test_long():\n    pass\n\n\n" + ONE
    done = _suite(tmp_path, "3600", tests_text=two)
    assert done.returncode == 1, done.stdout
    assert "1 passed, 1 skipped" in done.stdout
    assert "tests/e2e/test_one.py::test_long" in done.stdout.split("NOT RUN: time budget")[1]
    assert "can take 58" in done.stdout


def test_the_clock_starts_when_scripts_test_does(tmp_path: Path) -> None:
    """scripts/test sets PROVISION_SUITE_STARTED_AT before its bootstrap: minutes the
    bootstrap took count against CI's limit."""
    done = _suite(tmp_path, "3600", started_at=time.time() - 3400)
    assert done.returncode == 1, done.stdout
    assert "the run has used 57 of its 60 minutes" in done.stdout


BUSY_GREENLETS = """
import os
import threading
import time

import gevent.monkey
import pytest

gevent.monkey.patch_all()  # as pyinfra's CLI does: threads are greenlets


@pytest.fixture(scope="session")
def torn_down():
    yield
    with open(os.environ["TORN_DOWN_MARK"], "w") as f:
        f.write("yes")


def spin():
    n = 0
    while True:  # pure Python work: the signal mostly lands in one of these threads
        n += 1
        if n % 2000000 == 0:  # rarely: the hub, where an interrupt would reach the test anyway, seldom runs
            time.sleep(0)


def test_busy(torn_down):
    workers = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for w in workers:
        w.start()
    print("spinning", flush=True)
    workers[0].join(60)
"""


def test_sigterm_while_greenlets_run_ends_the_run_and_tears_down(tmp_path: Path) -> None:
    """SIGTERM (CI stopping the job, scripts/test stopping its e2e tier) while patched
    threads work, as during the shared `up`'s pyinfra run: the run ends within seconds and
    the session fixtures (the testbed's VMs) are torn down, not left running. (Raised in a
    thread's greenlet, the interrupt ended that thread and the run went on: seen in session
    47, a SIGTERM during the shared `up` lost and its VMs left running.)"""
    env = _tree(tmp_path, BUSY_GREENLETS, "3600")
    env["TORN_DOWN_MARK"] = str(tmp_path / "torn-down")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "tests"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "spinning" in line:
                break
        time.sleep(1)
        proc.send_signal(15)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in out, out
    assert (tmp_path / "torn-down").read_text() == "yes", out
