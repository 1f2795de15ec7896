"""Custom pyinfra operations of the nvidia step: facts in, commands out.

Each compares what the host has (apt's installed versions and holds, a file's SHA-256) with
what is wanted and yields only the commands that close the gap; the shell text comes from
pure builders (install_matching, download_commands) that quote every value."""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Generator
from typing import Any

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.files import File, Sha256File
from pyinfra.operations import systemd

from provision.facts.probes import AptHolds, RebootProbe
from provision.rules import packages as pkgs
from provision.rules.nvidia import hold_names


@operation()
def held(explicit: list[str], branch: str) -> Generator[Any, None, None]:
    """apt-mark hold the driver packages (read after the install, at execution time)."""
    installed, already = host.get_fact(AptHolds)
    names = hold_names(installed, already, explicit, branch)
    if names:
        yield f"apt-mark hold {' '.join(names)}"


@operation()
def fabricmanager(package: str, driver_package: str, version: str | None) -> Generator[Any, None, None]:
    """Install fabric manager at the driver's version (it refuses to run otherwise).

    ``version`` is the driver version when pinned (bare or with its revision); otherwise
    the driver's version is read at execution time, after the driver was installed, from
    the installed metapackage. Only the upstream part must match (``580.95.05-*``): Canonical
    builds fabric manager and the -server driver from separate sources, whose revisions
    (0ubuntu0.22.04.N) need not be equal; in NVIDIA's repository both are ``-1``.
    """
    installed, _ = host.get_fact(AptHolds)
    driver_version = installed.get(driver_package)
    if version is None and driver_version is None:
        if host.state.is_executing:  # the driver step ran before this, so this is a real error
            yield (f"echo 'fabric manager: no installed version of {driver_package} to match' >&2; exit 1")
        else:  # planning: the driver is not installed yet, so its version is not known
            yield f"apt-get install -y {package}=<driver version>"
        return
    command = install_matching(installed, {package: f"{pkgs.upstream(version or driver_version or '')}-*"})
    if command:
        yield command


@operation()
def apt_pinned(packages: dict[str, str]) -> Generator[Any, None, None]:
    """Install each package at a version matching its apt version glob, unless the installed
    one already matches. pyinfra's apt.packages compares versions literally, so a glob such
    as ``*+cuda12.8`` would reinstall at every run; apt itself resolves the glob to the
    newest matching version. Held packages may be moved: the pin is what decides."""
    installed, _ = host.get_fact(AptHolds)
    command = install_matching(installed, packages, recommends=False)
    if command:
        yield command


def install_matching(installed: dict[str, str], packages: dict[str, str], recommends: bool = True) -> str | None:
    """The apt-get line that brings each package to a version matching its pattern (an exact
    version or an apt version glob), or None when every installed one already matches.
    Held packages may be moved: the pin is what decides."""
    todo = [
        shlex.quote(f"{name}={pattern}")
        for name, pattern in packages.items()
        if not fnmatch.fnmatchcase(installed.get(name, ""), pattern)
    ]
    if not todo:
        return None
    return (
        f"DEBIAN_FRONTEND=noninteractive apt-get install -y {'' if recommends else '--no-install-recommends '}"
        f"--allow-change-held-packages -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
        f"{' '.join(todo)}"
    )


def download_commands(src: str, dest: str, sha256: str | None, fingerprint: str | None = None) -> list[str]:
    """Fetch to a temporary name beside ``dest``, check the SHA-256 and the key's
    fingerprint, then move into place: apt trusts whatever key sits at ``dest``, so a wrong
    file never gets there (pyinfra's files.download checks its sum only after the move)."""
    new = f"{dest}.provision-new"
    commands = [f"curl -sSLf --retry 3 -o {shlex.quote(new)} {shlex.quote(src)}"]
    if sha256:
        commands.append(
            f"echo {shlex.quote(f'{sha256}  {new}')} | sha256sum -c --quiet - "
            f"|| {{ rm -f {shlex.quote(new)}; echo {shlex.quote(f'{src}: SHA-256 is not {sha256}')} >&2; "
            "exit 1; }"
        )
    if fingerprint:
        why = f"{src}: the keyring does not hold exactly the key {fingerprint.upper()}"
        commands.append(
            f"{fingerprint_command(new, fingerprint)} "
            f"|| {{ rm -f {shlex.quote(new)}; echo {shlex.quote(why)} >&2; exit 1; }}"
        )
    commands.append(f"chmod 644 {shlex.quote(new)} && mv -f {shlex.quote(new)} {shlex.quote(dest)}")
    return commands


def fingerprint_command(path: str, fingerprint: str) -> str:
    """python3 on the node: exit 0 only when the keyring at ``path`` holds one primary key
    and it has ``fingerprint`` (one extra key in it would be trusted by apt as well)."""
    import inspect

    from provision.rules.nvidia import keyring_fingerprints, packet_header

    script = "".join(inspect.getsource(f) for f in (packet_header, keyring_fingerprints)) + (
        "import sys\nwith open(sys.argv[1], 'rb') as f:\n    keys = keyring_fingerprints(f.read())\n"
        "sys.exit(0 if keys == [sys.argv[2].upper()] else 1)\n"
    )
    return f"python3 -c {shlex.quote(script)} {shlex.quote(path)} {shlex.quote(fingerprint)}"


@operation()
def verified_download(
    src: str, dest: str, sha256: str | None, fingerprint: str | None = None
) -> Generator[Any, None, None]:
    """Download ``src`` to ``dest`` when it is missing, or when its SHA-256 is not ``sha256``."""
    if sha256:
        if host.get_fact(Sha256File, path=dest) == sha256:
            return
    elif host.get_fact(File, path=dest):
        return
    yield from download_commands(src, dest, sha256, fingerprint)


@operation()
def driver_daemon(service: str) -> Generator[Any, None, None]:
    """Enable a daemon that needs the NVIDIA kernel module; start it too when the kernel
    runs the installed module (read at execution time, after the install), since then no
    reboot follows to start it. After a driver install or upgrade the module is not
    loaded, or an older one is, and a daemon started now would fail on the version
    mismatch: it stays enabled only, for the reboot. (A changed configuration restarts a
    running daemon through its own follow-up: deploys/nvidia.py.)"""
    live = host.get_fact(RebootProbe).runs_installed_module
    yield from systemd.service._inner(service=service, running=True if live else None, enabled=True)
