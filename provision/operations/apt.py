"""apt installs that several deploys share: wait for apt's locks, then install what is missing."""

from __future__ import annotations

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt, server

from provision.facts.probes import lock_wait_command


def install(name: str, packages: list[str], lock_wait_s: int, recommends: bool = True) -> None:
    """Install what is missing. The apt cache is refreshed only then, so a re-run with
    everything in place changes nothing (apt.packages(update=True) would refresh it hourly).
    The nfs, backups and monitoring steps use this too."""
    installed = host.get_fact(DebPackages) or {}
    missing = [p for p in packages if p not in installed]
    if missing:
        # These steps run after provision's reboot, when apt-daily often refreshes the lists:
        # apt waits for the dpkg lock by itself (base's DPkg::Lock::Timeout) but fails at
        # once on the lists lock that its update takes.
        server.shell(name=f"{name}: wait for apt locks", commands=[lock_wait_command(lock_wait_s)])
        apt.packages(name=name, packages=missing, update=True, cache_time=3600, no_recommends=not recommends)
