"""`provision verify`: a pytest-testinfra suite shipped with the package, run against the
hosts of an inventory. It checks what the deploys promise (packages and versions, holds,
services, files, mounts), from the outside, over SSH.

The suite reads the expected state from a JSON spec the runner writes (per host: its
settings and whether the nvidia step applies), and reaches hosts through an OpenSSH
config generated from the inventory (provision.remote.ssh_config), so host keys stay
pinned exactly as for every other command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from provision.errors import ProvisionError
from provision.inventory import Cluster
from provision.remote import ssh_config

SUITE = Path(__file__).resolve().parent
SPEC_ENV = "PROVISION_VERIFY_SPEC"


@dataclass
class VerifyResult:
    """Outcome of one verify run."""

    exit_code: int  # pytest's: 0 all passed, 1 some failed, other: could not run
    junit_xml: str  # path of the JUnit report
    output: str  # pytest's terminal output


def spec(cluster: Cluster) -> dict[str, dict[str, object]]:
    """Per host: settings, groups and cluster address, for the suite's expectations."""
    return {
        n.name: {
            "settings": asdict(n.settings),
            "groups": list(n.groups),
            "cluster_address": n.cluster_address,
            "all_nodes": {m.name: m.cluster_address for m in cluster.nodes},
            "storage_node": _storage_name(cluster),
        }
        for n in cluster.nodes
    }


def _storage_name(cluster: Cluster) -> str | None:
    storage = cluster.storage_node()
    return storage.name if storage else None


def run(
    cluster: Cluster, workdir: str | None = None, extra: list[str] | None = None, timeout_s: int = 1800
) -> VerifyResult:
    """Run the suite against every host; returns pytest's exit code and its output."""
    import importlib.util

    if importlib.util.find_spec("testinfra") is None:  # a hand-trimmed install: say so, not "No module"
        raise ProvisionError(
            "provision verify needs pytest-testinfra on this controller: "
            "pip install 'pytest-testinfra>=10' (a normal install of provision brings it)"
        )
    work = Path(workdir or tempfile.mkdtemp(prefix="provision-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "ssh_config").write_text(ssh_config(cluster.nodes))
    (work / "spec.json").write_text(json.dumps(spec(cluster), default=str))
    junit = work / "verify.xml"
    hosts = ",".join(f"ssh://{n.name}" for n in cluster.nodes)
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(SUITE),
        f"--hosts={hosts}",
        f"--ssh-config={work / 'ssh_config'}",
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "--rootdir",
        str(SUITE),
        "-q",
        "-rfEs",
        *(extra or []),
    ]
    env = os.environ | {SPEC_ENV: str(work / "spec.json")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=work)
    return VerifyResult(done.returncode, str(junit), done.stdout + done.stderr)
