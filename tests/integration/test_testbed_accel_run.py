"""The testbed's accelerator probe with real probe processes."""

from __future__ import annotations

from pathlib import Path

from provision.testbed import accel
from tests.unit.test_testbed_accel import _never


def test_auto_falls_back_to_tcg_when_the_probe_vm_does_not_boot(tmp_path: Path) -> None:
    verdict = accel.choose(
        "auto", tmp_path / "v.json", lambda: (False, "no login prompt in 60s"), device_usable=lambda: True
    )
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
