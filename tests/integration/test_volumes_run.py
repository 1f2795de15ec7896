"""The blank guard run for real in a shell against a stand-in blkid."""

from __future__ import annotations

import pytest

from tests.unit.test_volumes import _a_block_device, _run_guard


def test_blank_guard_lets_through_only_a_device_blkid_finds_nothing_on(tmp_path):
    device = _a_block_device()
    passed = _run_guard(tmp_path, device, 2)
    assert passed.returncode == 0
    assert passed.stdout == "guard-passed\n"
    found = _run_guard(tmp_path, device, 0)
    assert found.returncode == 1
    assert not found.stdout
    assert found.stderr == f"refusing to format {device}: blkid -p finds a signature on it\n"


@pytest.mark.parametrize("status", [4, 8, 127])
def test_blank_guard_refuses_when_blkid_fails_or_is_unsure(tmp_path, status):
    device = _a_block_device()
    result = _run_guard(tmp_path, device, status)
    assert result.returncode == 1
    assert not result.stdout
    assert result.stderr == f"refusing to format {device}: blkid -p failed (exit {status})\n"


def test_blank_guard_refuses_a_path_that_is_not_a_block_device(tmp_path):
    # mke2fs would create a regular file at a missing path
    result = _run_guard(tmp_path, str(tmp_path / "virtio-GONE"), 2)
    assert result.returncode == 1
    assert not result.stdout
    assert "not a block device" in result.stderr
