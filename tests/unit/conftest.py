"""The unit tier runs in this process alone: a unit test that starts a process or opens a
socket fails, naming what it did (such a test belongs in tests/integration).

Python's audit events see every way in (subprocess, os.fork/exec/posix_spawn, socket bind
and connect), also through gevent, which pyinfra's CLI patches in."""

from __future__ import annotations

import sys

import pytest

_WATCHED = (
    "subprocess.Popen",
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.exec",
    "os.spawn",
    "os.system",
    "socket.bind",
    "socket.connect",
    "pty.spawn",
)
_seen: list[str] | None = None  # what the running unit test did; None between tests


def _audit(event: str, args: tuple) -> None:
    if _seen is not None and event in _WATCHED:
        _seen.append(f"{event} {str(args)[:100]}")


sys.addaudithook(_audit)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    global _seen
    _seen = []
    try:
        result = yield
    finally:
        seen, _seen = _seen, None
    if seen:
        pytest.fail(
            "a unit test starts no process and opens no socket (move it to tests/integration): " + "; ".join(seen[:3]),
            pytrace=False,
        )
    return result


@pytest.fixture
def stand_in_nvml():
    """Install NVML stand-ins into the real pynvml module for this test: call it with a
    captured model name (and StandInGpu changes) or a StandInNvmlLibrary; restored after."""
    import contextlib

    from tests.standins import nvml_from_captures as nvml

    with contextlib.ExitStack() as stack:

        def install(model: str | nvml.StandInNvmlLibrary | None, **changes: object):
            library = nvml.stand_in_library(model, **changes) if isinstance(model, str) else model
            return stack.enter_context(nvml.installed(library))

        yield install
