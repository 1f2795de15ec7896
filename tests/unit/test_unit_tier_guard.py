"""The guard of tests/unit/conftest.py itself: it tells a spawning test from a pure one."""

from __future__ import annotations

import pytest

from tests.unit import conftest


def test_the_guard_records_a_process_start_and_a_socket_and_nothing_else() -> None:
    seen: list[str] = []
    previous, conftest._seen = conftest._seen, seen
    try:
        conftest._audit("subprocess.Popen", ("true",))
        conftest._audit("socket.connect", ("sock", ("127.0.0.1", 22)))
        conftest._audit("open", ("/etc/hostname",))
    finally:
        conftest._seen = previous
    assert [s.split()[0] for s in seen] == ["subprocess.Popen", "socket.connect"]


def test_between_tests_nothing_is_recorded() -> None:
    previous, conftest._seen = conftest._seen, None
    try:
        conftest._audit("subprocess.Popen", ("true",))
    finally:
        conftest._seen = previous
    assert conftest._seen is previous


@pytest.mark.parametrize("event", ["os.fork", "os.posix_spawn", "socket.bind"])
def test_every_way_to_start_a_process_or_listen_is_watched(event: str) -> None:
    assert event in conftest._WATCHED
