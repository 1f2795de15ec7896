"""Shared test helpers: run the CLI in-process and capture what a user would see."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import pytest

# pyinfra's CLI package monkey-patches threading with gevent when first imported. Patched
# after paramiko was imported, paramiko's SSH threads deadlock later in the session (seen:
# gather_facts hung for good in a full run, when the e2e conftest imported pyinfra.api
# before provision.testbed). Imported here, first of all, every test session patches before
# anything can import paramiko, whatever order the tiers and conftests load in.
# The GPU tier alone (benchmarks/gpu_check.sh, on a lent GPU machine whose image has torch
# and pytest but no pyinfra, paramiko or gevent) runs without it, on real threads, which
# its per-phase deadlines and NVML sampling thread need; nothing there imports paramiko.
try:
    import pyinfra_cli  # noqa: F401  # isort: skip
except ImportError:
    if os.environ.get("PROVISION_GPU_CHECK") != "1":
        raise


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


# The tier of a test is its folder: tests/integration, tests/e2e and tests/gpu give their
# marker to every test in them (tests/unit gives none), so `-m` selects by folder too.
TIER_MARKERS = {"integration": "integration", "e2e": "e2e", "gpu": "gpu"}


def _tier(item) -> str | None:
    parts = item.path.relative_to(item.config.rootpath).parts
    return TIER_MARKERS.get(parts[1]) if len(parts) > 2 and parts[0] == "tests" else None


def pytest_collection_modifyitems(config, items):
    """Every test gets its folder's tier marker. Then: fast tiers first (unit,
    integration), then end-to-end tests on the shared testbed, and the destructive drills
    (killing VMs, rebooting the NFS server) last of all, so the testbed is whole for every
    other test. Order is otherwise kept."""
    for item in items:
        tier = _tier(item)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
    items.sort(
        key=lambda item: (
            item.get_closest_marker("destructive") is not None,
            item.get_closest_marker("e2e") is not None,
        )
    )


# CI stops a run at 90 minutes from its first command, and a run killed there says nothing.
# So under a limit (PROVISION_TEST_BUDGET_S: .ci/run sets CI's 5400 s), end-to-end tests run
# last and each one starts only when what it can take still ends inside the limit, less
# MARGIN_S (the testbed's teardown, the report): its `takes_s` mark (the longest CI has seen
# it take, its module's first fixtures included), else DEFAULT_TAKES_S. One that would not
# fit is SKIPPED with the reason, named again at the end, and the run FAILS: a skipped test
# proves nothing, so a green run means every test ran. PROVISION_TEST_REQUIRE_ALL=0 makes
# such a skip a warning (a local run). The clock starts when scripts/test starts
# (PROVISION_SUITE_STARTED_AT, set before the bootstrap, which on a new machine takes
# minutes of CI's 90), else when pytest does. Without a limit (a person's ./scripts/test,
# where nothing stops the run) every test runs however long the machine takes: a first run
# builds the image and provisions the testbed for real, and a busy machine is slower.
_LIMIT = os.environ.get("PROVISION_TEST_BUDGET_S", "").strip()
SUITE_LIMIT_S = float(_LIMIT) if _LIMIT else None
MARGIN_S = 150
DEFAULT_TAKES_S = 300
_SUITE_START = float(os.environ.get("PROVISION_SUITE_STARTED_AT") or time.time())  # wall clock: another process sets it


_NOT_RUN_FOR_TIME: list[str] = []  # e2e tests skipped by the budget, named again at the end


def pytest_configure(config):
    # SIGTERM (CI stopping a job, scripts/test stopping its e2e tier) ends the run the way
    # Ctrl-C does, so session fixtures tear down: the testbed's VMs are daemons and would
    # outlive a pytest killed by the default SIGTERM action.
    import signal

    def _interrupt(signum, frame):
        # Raised in whichever greenlet runs when the signal lands: during a pyinfra run
        # (the shared `up`) that is often one of its host greenlets, which the exception
        # would end while the run went on (seen: a SIGTERM during the shared `up` was lost,
        # and its VMs lived on). It goes to the root greenlet, the test's own code, instead.
        import greenlet

        current = greenlet.getcurrent()
        root = current
        while root.parent is not None:
            root = root.parent
        if current is not root:
            root.throw(KeyboardInterrupt(f"signal {signum}"))
            return
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _interrupt)


def pytest_runtest_setup(item):
    if not item.get_closest_marker("e2e") or SUITE_LIMIT_S is None:
        return
    elapsed = time.time() - _SUITE_START
    mark = item.get_closest_marker("takes_s")
    takes = float(mark.args[0]) if mark else DEFAULT_TAKES_S
    if elapsed + takes > SUITE_LIMIT_S - MARGIN_S:
        _NOT_RUN_FOR_TIME.append(item.nodeid)
        pytest.skip(
            f"time budget: the run has used {elapsed / 60:.0f} of its {SUITE_LIMIT_S / 60:.0f} minutes and "
            f"this end-to-end test can take {takes / 60:.0f}; it would not end in time "
            "(set PROVISION_TEST_BUDGET_S to run it)"
        )


REQUIRE_ALL = os.environ.get("PROVISION_TEST_REQUIRE_ALL", "1") != "0"


def pytest_sessionfinish(session, exitstatus):
    # Skipped for time is not passed: with REQUIRE_ALL the run fails, whatever else it did.
    if REQUIRE_ALL and _NOT_RUN_FOR_TIME and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    # A skipped e2e test proves nothing: say so in words at the very end, where a reader
    # looks, instead of leaving it in the skip list.
    if _NOT_RUN_FOR_TIME:
        terminalreporter.section("NOT RUN: time budget", sep="!", red=True, bold=True)
        verdict = "this run FAILS" if REQUIRE_ALL else "this run does not prove what they test"
        terminalreporter.write_line(f"{len(_NOT_RUN_FOR_TIME)} end-to-end tests did not run, so {verdict}:")
        for nodeid in _NOT_RUN_FOR_TIME:
            terminalreporter.write_line(f"  {nodeid}")
