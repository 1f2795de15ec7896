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
    assert verdict.accel == "tcg" and "/dev/kvm" in verdict.reason


def test_auto_falls_back_to_tcg_when_the_probe_vm_does_not_boot(tmp_path: Path) -> None:
    verdict = accel.choose("auto", tmp_path / "v.json", lambda: (False, "no login prompt in 60s"),
                           device_usable=lambda: True)
    assert (verdict.accel, verdict.reason, verdict.cached) == ("tcg", "no login prompt in 60s", False)


def test_auto_uses_kvm_when_the_probe_vm_boots_and_caches_it(tmp_path: Path) -> None:
    cache = tmp_path / "v.json"
    first = accel.choose("auto", cache, lambda: (True, "booted in 5s"), device_usable=lambda: True)
    second = accel.choose("auto", cache, _never, device_usable=lambda: True)
    assert (first.accel, first.cached) == ("kvm", False)
    assert (second.accel, second.cached) == ("kvm", True)


def test_a_verdict_for_another_host_or_qemu_is_not_reused(tmp_path: Path) -> None:
    cache = tmp_path / "v.json"
    cache.write_text('{"host": "other kernel | other qemu", "accel": "kvm", "reason": "old"}')
    verdict = accel.choose("auto", cache, lambda: (False, "hung"), device_usable=lambda: True)
    assert verdict.accel == "tcg"
