"""KVM only when a probe VM really boots; otherwise TCG. The verdict is cached."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.errors import InputError
from provision.testbed import accel


def _never() -> tuple[bool, str]:
    raise AssertionError("the probe must not run")


def test_explicit_choice_is_taken_without_probing(tmp_path: Path) -> None:
    for choice in ("kvm", "tcg"):
        assert accel.choose(choice, tmp_path / "v.json", _never).accel == choice


def test_unknown_choice_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        accel.choose("hvf", tmp_path / "v.json", _never)


def test_auto_without_usable_kvm_device_is_tcg(tmp_path: Path) -> None:
    verdict = accel.choose("auto", tmp_path / "v.json", _never, device_usable=lambda: False)
    assert verdict.accel == "tcg"
    assert "/dev/kvm" in verdict.reason
