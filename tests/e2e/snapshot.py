"""The provisioned testbed, cached: provisioning is paid once per change, not once per run.

After the shared `provision up` succeeds, the nodes are powered off cleanly and their disks
(root overlay, data disks), their host keys, the testbed's client key, the controller-side
secrets `up` generated for the inventory (training key, restic password, backup key) and
`up`'s own report are copied to ``<image cache>/../snapshots/<key>/``; the nodes are then
booted again, so a cold run and a warm one test the same thing: a provisioned cluster that
has rebooted once since its `up`. A run whose image cache is new (CI's clean clone, a first
run on a machine) saves nothing: nobody reads that cache again, and the save costs about two
minutes (tests/e2e/conftest.py).

The key is a hash of everything `up` depends on: every module of the package except the
other commands (validate, launch, status, demo, verify, backup, cli: the layer rules in
tests/unit/test_layers.py forbid `up` and the deploys from importing them), the templates,
the base image's recipe (its name carries its hash), the wheelhouse's wheels, the testbed's
shape, pyinfra's version, and this module. A change to any of them misses the cache, and the
run provisions for real (and stores a new snapshot), so the tests exercise `up` whenever it
changed. With the same key, the report the tests read is the one that identical code
produced when it built the snapshot; every later `up`, `plan` and `verify` runs for real.

What the key cannot see is the Debian mirror: a package updated there since the snapshot
was made would only meet a real `up` at the next change. So a snapshot older than
MAX_AGE_S is not used (the run provisions and replaces it). Only the newest snapshot is
kept. Set PROVISION_TEST_SNAPSHOT=0 to ignore and not write the cache (a run that must
provision).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from provision import inventory, remote, state
from provision.engine import Failure, HostResult, RunReport
from provision.resources import templates_dir
from provision.testbed import Testbed, node, wheelhouse

ROOT = Path(__file__).resolve().parents[2]
NOT_UP_INPUTS = ("validate", "launch", "status", "demo", "verify", "backup", "cli", "tune", "jobs")  # other commands
NODE_FILES = ("root.qcow2", "ssh_host_ed25519_key", "ssh_host_ed25519_key.pub")
REPORT = "report.json"
MAX_AGE_S = 3 * 86400
POWEROFF_S = 180  # a TCG guest's clean shutdown takes seconds to a minute


def enabled() -> bool:
    return os.environ.get("PROVISION_TEST_SNAPSHOT", "1") != "0"


def _up_inputs() -> list[Path]:
    package = ROOT / "provision"
    files = [
        p for p in package.rglob("*.py") if p.relative_to(package).parts[0] not in NOT_UP_INPUTS or p.parent == package
    ]
    files += [p for p in templates_dir().rglob("*") if p.is_file()]
    return sorted(files)


def key(testbed: Testbed, shape: dict[str, Any]) -> str:
    """The hash of everything the provisioned disks depend on."""
    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())  # how the snapshot is made and restored
    for path in _up_inputs():
        h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    facts = {
        "image": testbed.recipe().name,
        "shape": shape,
        "wheels": wheelhouse.requirements(),
        "pyinfra": importlib.metadata.version("pyinfra"),
    }
    h.update(json.dumps(facts, sort_keys=True).encode())
    return h.hexdigest()[:16]


def snapshots_dir(testbed: Testbed) -> Path:
    return testbed.images_dir.parent / "snapshots"


def restore(testbed: Testbed, digest: str, inventory_path: Path, nodes: list[str]) -> RunReport | None:
    """Put the snapshot's files where Testbed.up and `up` look for them (before the nodes
    exist); return the report of the `up` that made it, or None when there is no snapshot."""
    where = snapshots_dir(testbed) / digest
    if not enabled() or not (where / REPORT).is_file():
        return None
    if time.time() - (where / REPORT).stat().st_mtime > MAX_AGE_S:
        return None
    for name in nodes:
        dest = node.files(testbed.state_dir, name).dir
        dest.mkdir(parents=True, exist_ok=True)
        for f in (where / "nodes" / name).iterdir():
            _copy(f, dest / f.name)
    _copy_tree(where / "keys", testbed.state_dir / "keys")
    # The inventory's secrets are the snapshot's alone: a directory left under the same
    # inventory path by an earlier run (pytest reuses its numbered temp paths) must not
    # add a password or key the snapshot's hosts never had.
    controller = state.inventory_dir(inventory_path)
    shutil.rmtree(controller)
    _copy_tree(where / "controller", controller)
    return report_from_json(json.loads((where / REPORT).read_text()))


def save(testbed: Testbed, digest: str, inventory_path: Path, report: RunReport, nodes: list[str]) -> None:
    """Power the nodes off cleanly, copy what restore() needs, keep only this snapshot,
    and boot the nodes again."""
    if not enabled() or report.exit_code != 0:
        return
    root = snapshots_dir(testbed)
    work = root / f".{digest}.partial"
    shutil.rmtree(work, ignore_errors=True)
    try:
        if not _power_off(testbed, inventory_path):
            return  # a node had to be cut off: its disks are not a clean snapshot
        for name in nodes:
            src = node.files(testbed.state_dir, name).dir
            (work / "nodes" / name).mkdir(parents=True)
            for f in [*NODE_FILES, *(p.name for p in src.glob("data*.img"))]:
                _copy(src / f, work / "nodes" / name / f)
        _copy_tree(testbed.state_dir / "keys", work / "keys")
        _copy_tree(state.inventory_dir(inventory_path), work / "controller")
        (work / REPORT).write_text(json.dumps(report_to_json(report), indent=2) + "\n")
        for old in root.iterdir():
            if old != work:
                shutil.rmtree(old, ignore_errors=True)
        work.rename(root / digest)  # complete or absent: restore never sees half a snapshot
    finally:
        shutil.rmtree(work, ignore_errors=True)
        testbed.up(nodes=len(nodes))


def _power_off(testbed: Testbed, inventory_path: Path) -> bool:
    """Every node shuts down cleanly, all at once (Testbed.stop_node takes the testbed's
    lock, one command at a time): poweroff from inside, wait for the qemu processes to end.
    A node still running after POWEROFF_S is stopped hard, and the answer is False."""
    cluster = inventory.load(inventory_path)
    remote.on_all(cluster.nodes, lambda n: remote.run(n, "sync; systemctl poweroff", timeout=30))
    deadline = time.monotonic() + POWEROFF_S
    while any(r.running for r in testbed.status()) and time.monotonic() < deadline:
        time.sleep(1)
    clean = True
    for rec in testbed.status():
        if rec.running:
            testbed.stop_node(rec.name, hard=True)
            clean = False
    return clean


def _copy(src: Path, dest: Path) -> None:
    # Sparse: a 2 GiB data disk holds a few MB.
    subprocess.run(["cp", "--sparse=always", "-p", str(src), str(dest)], check=True, timeout=600)


def _copy_tree(src: Path, dest: Path) -> None:
    """Files and folders, all the way down: the inventory's secrets are per host, in
    folders (backup-passwords/<host>, backup-keys/<host>_ed25519)."""
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    for f in src.iterdir():
        if f.is_dir():
            _copy_tree(f, dest / f.name)
        elif f.is_file():
            _copy(f, dest / f.name)


def report_to_json(report: RunReport) -> dict[str, Any]:
    """Every field of every HostResult, failures as (step, why): restore gives back the same report."""
    return {
        name: {
            "reachable": h.reachable,
            "steps": h.steps,
            "changed": h.changed,
            "changed_by_step": h.changed_by_step,
            "failures": [[f.step, f.why] for f in h.failures],
            "notes": h.notes,
            "rebooted": h.rebooted,
        }
        for name, h in report.hosts.items()
    }


def report_from_json(doc: dict[str, Any]) -> RunReport:
    hosts = {}
    for name, h in doc.items():
        failures = [Failure(step, why) for step, why in h.pop("failures")]
        hosts[name] = HostResult(name=name, failures=failures, **h)
    return RunReport(hosts)
