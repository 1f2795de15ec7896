"""KVM or TCG. On our build machines /dev/kvm exists but nested KVM hangs silently, so
"KVM works" means a probe VM booted to its login prompt within a timeout, not that the
device exists. The verdict is cached per host kernel and qemu version, so the probe's
cost is paid once."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from provision.errors import InputError, Problem
from provision.state import write_atomic
from provision.testbed import procs, qemu

PROBE_TIMEOUT_S = 60.0  # a KVM boot to login takes a few seconds; a hung one never does
CHOICES = ("auto", "kvm", "tcg")


@dataclass(frozen=True)
class Verdict:
    """Which accelerator the testbed uses, and why."""

    accel: str  # "kvm" or "tcg"
    reason: str  # one line for people: "probe VM booted in 6.1s", "/dev/kvm missing"
    cached: bool = False  # True when read from the verdict cache


def host_key() -> str:
    """What the verdict depends on: the host kernel and the qemu build."""
    try:
        version = subprocess.run(
            ["qemu-system-x86_64", "--version"], capture_output=True, text=True, timeout=10
        ).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        version = "unknown qemu"
    return f"{platform.release()} | {version}"


def kvm_device_usable(device: str = "/dev/kvm") -> bool:
    return os.path.exists(device) and os.access(device, os.R_OK | os.W_OK)


def choose(
    requested: str,
    cache_file: Path,
    probe: Callable[[], tuple[bool, str]],
    device_usable: Callable[[], bool] = kvm_device_usable,
) -> Verdict:
    """Decide the accelerator. ``probe`` boots a VM under KVM: (booted, reason)."""
    if requested not in CHOICES:
        raise InputError(Problem("--accel", f"{requested!r} is not one of {', '.join(CHOICES)}"))
    if requested != "auto":
        return Verdict(requested, f"--accel {requested} given")
    if not device_usable():
        return Verdict("tcg", "/dev/kvm is missing or not accessible")
    key = host_key()
    cached = _load(cache_file, key)
    if cached:
        return cached
    booted, reason = probe()
    verdict = Verdict("kvm" if booted else "tcg", reason)
    _save(cache_file, key, verdict)
    return verdict


def _load(cache_file: Path, key: str) -> Verdict | None:
    try:
        raw = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return None
    if raw.get("host") != key or raw.get("accel") not in ("kvm", "tcg"):
        return None
    return Verdict(raw["accel"], raw.get("reason", ""), cached=True)


def _save(cache_file: Path, key: str, verdict: Verdict) -> None:
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(cache_file, json.dumps({"host": key, "accel": verdict.accel, "reason": verdict.reason}) + "\n")


def probe_boot(base_spec: qemu.VmSpec, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Boot ``base_spec`` (a throwaway VM under KVM) and wait for its login prompt.

    The VM is stopped by its pid and its run dir removed whatever happens.
    """
    run_dir = base_spec.run_dir
    marker = f"{run_dir}/"
    started = time.monotonic()
    try:
        done = subprocess.run(qemu.argv(base_spec), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return False, f"KVM probe VM did not start: {done.stderr.strip()[-200:]}"
        while time.monotonic() - started < timeout_s:
            if b"login:" in _read(base_spec.console_log):
                return True, f"KVM probe VM booted in {time.monotonic() - started:.1f}s"
            if not procs.alive(procs.read_pidfile(base_spec.pidfile)):
                return False, "KVM probe VM exited before its login prompt"
            time.sleep(0.5)
        return False, f"KVM probe VM showed no login prompt within {timeout_s:.0f}s (nested KVM hangs)"
    except subprocess.TimeoutExpired:
        return False, "KVM probe VM hung while starting"
    finally:
        procs.stop(procs.read_pidfile(base_spec.pidfile), marker, hard=True)
        shutil.rmtree(run_dir, ignore_errors=True)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
