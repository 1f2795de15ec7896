"""The controller's local state: files written whole or not at all, secrets 0600 from
their first byte, and one `provision up` per inventory at a time."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from provision import state
from tests.helpers.example_inventory import locked_example


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _fail_at_fsync(monkeypatch, seen: list[tuple[str, int]]):
    """Make the write crash after the data is written and before the rename, recording
    each temp file's name and mode at that moment."""

    def crash(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        seen.append((path, stat.S_IMODE(os.stat(path).st_mode)))
        raise OSError("injected: power cut")

    monkeypatch.setattr(state.os, "fsync", crash)


def test_a_crash_mid_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "history.json"
    state.write_atomic(target, "old\n")
    _fail_at_fsync(monkeypatch, seen := [])
    with pytest.raises(OSError, match="power cut"):
        state.write_atomic(target, "new and longer\n")
    assert target.read_text() == "old\n"
    assert len(seen) == 1
    assert Path(seen[0][0]).parent == tmp_path, "the temp file is beside the target"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json"]


def test_a_write_replaces_the_whole_file():
    target = state.state_dir()
    target.mkdir(parents=True)
    state.write_atomic(target / "f", "a much longer first version\n")
    state.write_atomic(target / "f", b"short\n")
    assert (target / "f").read_bytes() == b"short\n"


def test_a_secret_is_0600_from_its_first_byte(tmp_path, monkeypatch):
    _fail_at_fsync(monkeypatch, seen := [])
    with pytest.raises(OSError, match="power cut"):
        state.generated_secret(tmp_path / "restic-password")
    (path, mode) = seen[0]
    assert path != str(tmp_path / "restic-password"), "written to a temp file first"
    assert mode == 0o600
    assert not (tmp_path / "restic-password").exists()


def test_a_generated_secret_is_kept_across_calls_with_mode_0600(tmp_path):
    first = state.generated_secret(tmp_path / "pw").read_text()
    assert state.generated_secret(tmp_path / "pw").read_text() == first
    assert stat.S_IMODE(os.stat(tmp_path / "pw").st_mode) == 0o600


def test_a_second_run_on_the_same_inventory_is_refused_naming_the_holder(tmp_path):
    inventory = tmp_path / "cluster.py"
    with state.inventory_lock(inventory), pytest.raises(state.LockHeld) as refused, state.inventory_lock(inventory):
        pass
    message = str(refused.value)
    assert message.startswith(f"another provision up (pid {os.getpid()}, started ")
    assert f"holds the lock on {inventory}" in message
    assert refused.value.exit_code == 2


def test_the_lock_is_free_again_when_the_run_ends(tmp_path):
    inventory = tmp_path / "cluster.py"
    with state.inventory_lock(inventory):
        pass
    with state.inventory_lock(inventory):  # no LockHeld
        pass


def test_a_lock_left_by_a_dead_run_is_taken_over(tmp_path):
    # flock dies with its process; the file still names the dead holder and is rewritten.
    inventory = tmp_path / "cluster.py"
    lock_file = state.inventory_dir(inventory) / "up.lock"
    lock_file.write_text("999999999 2026-01-01T00:00:00+0000\n")
    with state.inventory_lock(inventory):
        assert lock_file.read_text().split()[0] == str(os.getpid())


def test_two_inventories_have_two_locks(tmp_path):
    with state.inventory_lock(tmp_path / "a.py"), state.inventory_lock(tmp_path / "b.py"):
        pass


def test_up_exits_2_naming_the_holder_when_another_up_holds_the_inventory(cli, tmp_path):
    inventory = locked_example(tmp_path)
    with state.inventory_lock(inventory):
        result = cli("up", str(inventory))
    assert result.code == 2
    assert f"another provision up (pid {os.getpid()}" in result.err
    assert "holds the lock on" in " ".join(result.err.split())


def test_a_file_gets_exactly_its_mode_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        state.write_atomic(tmp_path / "hosts", "127.0.0.1 localhost\n", mode=0o644)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "hosts").st_mode) == 0o644
