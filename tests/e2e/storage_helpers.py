"""Helpers shared by the storage e2e tests: the CLI as a user runs it, commands on a node,
and inventories derived from the testbed's (one host, extra host data); and the state
fingerprint the plan tests (test_up, test_nvidia_standins) compare before and after."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provision import remote
from provision.inventory import Cluster, Node

# What `plan` must leave untouched: the package database, the files the steps write (apt
# sources, keyrings, pins, modprobe.d, systemd units, drop-ins and enablement links: path,
# size, mtime, mode, link target), the venv.
FINGERPRINT = (
    "md5sum /var/lib/dpkg/status /etc/hosts /etc/security/limits.d/* /etc/sysctl.d/* "
    "/etc/apt/apt.conf.d/* /home/train/.ssh/* 2>&1; "
    "find /etc/apt/sources.list.d /etc/apt/keyrings /etc/apt/preferences.d /etc/modprobe.d "
    "/etc/systemd/system -printf '%p %s %T@ %m %l\\n' 2>&1 | sort; "
    "ls -la --time-style=full-iso /etc/apt /opt/provision /var/lib/apt/periodic 2>&1"
)


@dataclass
class CliRun:
    """One `provision ...` invocation, with everything it printed."""

    exit_code: int  # the process's exit code
    stdout: str  # standard output (JSON with --json)
    stderr: str  # progress and errors

    def json(self) -> Any:
        return json.loads(self.stdout)


def cli(*args: str, timeout_s: float = 1800) -> CliRun:
    done = subprocess.run([sys.executable, "-m", "provision", *args], capture_output=True, text=True, timeout=timeout_s)
    return CliRun(done.returncode, done.stdout, done.stderr)


def sh(node: Node, command: str, timeout_s: float = 300) -> str:
    """Run a command on a node as root; fail the test with its output if it fails."""
    result = remote.run(node, command, timeout=timeout_s)
    assert result.ok, f"{node.name}: {command}: exit {result.exited}: {result.stderr or result.stdout}"
    return result.stdout


def derived_inventory(source: Path, dest: Path, hosts: list[str], extra: dict[str, dict[str, Any]]) -> Path:
    """A copy of a testbed inventory with only ``hosts``, each host's data updated from
    ``extra`` (e.g. force_format); the storage group is kept when its host is included."""
    namespace: dict[str, Any] = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)  # the testbed's own file
    nodes = [(name, {**data, **extra.get(name, {})}) for name, data in namespace["nodes"] if name in hosts]
    storage = [n for n in namespace.get("storage", []) if n in hosts]
    dest.write_text(f"nodes = {nodes!r}\nstorage = {storage!r}\n")
    return dest


def node_of(cluster: Cluster, name: str) -> Node:
    return cluster.node(name)
