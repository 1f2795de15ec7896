"""`provision status` on the provisioned testbed: no drift after `up`; a pinned package
(numpy, pinned by default) changed by hand on one VM is named with its host and both versions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from provision import inventory, remote
from provision.rules import monitoring
from provision.rules.frameworks import REMOTE_WHEELHOUSE
from provision.settings import Settings
from tests.e2e.prometheus_helpers import wait_until
from tests.e2e.storage_helpers import cli, sh

OTHER_NUMPY = "1.26.4"  # any release other than the pinned one; a real wheel from PyPI


def venv_numpy(node) -> str:
    python = f"{node.settings.venv_path}/bin/python"
    return sh(node, f"{python} -c 'import numpy; print(numpy.__version__)'").strip()


def test_status_after_up_is_clean_then_names_a_hand_changed_package(provisioned, testbed, tmp_path):
    cluster = inventory.load(testbed.inventory_path)
    victim = cluster.nodes[-1]
    installed = venv_numpy(victim)
    assert installed == Settings().numpy_version  # `up` installed the default pin
    inv = Path(testbed.inventory_path)

    clean = cli("status", str(inv), "--json", timeout_s=300)
    report = clean.json()
    assert clean.exit_code == 0, report
    assert all(h["reachable"] and h["drift"] == [] for h in report["hosts"])
    assert all(h["versions"]["torch"].startswith("2.13.0") for h in report["hosts"])
    # Slurm's view from the head: every node a Slurm node in a working state, and the queue read.
    assert report["slurm"]["error"] is None, report["slurm"]
    assert set(report["slurm"]["nodes"]) == {n.name for n in cluster.nodes}
    assert all(h["slurm"] in ("idle", "mixed", "allocated") for h in report["hosts"]), report["hosts"]
    assert isinstance(report["slurm"]["jobs"], list)

    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            f"numpy=={OTHER_NUMPY}",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_17_x86_64",
            "-d",
            str(wheels),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("numpy-*.whl")
    conn = remote.connection(victim)
    try:
        conn.put(str(wheel), f"/tmp/{wheel.name}")
    finally:
        conn.close()
    pip = f"{victim.settings.venv_path}/bin/pip"
    sh(victim, f"{pip} install -q --no-deps --no-index /tmp/{wheel.name}")
    try:
        drifted = cli("status", str(inv), "--json", timeout_s=300)
        hosts = {h["name"]: h for h in drifted.json()["hosts"]}
        assert drifted.exit_code == 1
        assert [(d["item"], d["expected"], d["actual"]) for d in hosts[victim.name]["drift"]] == [
            ("numpy", installed, OTHER_NUMPY)
        ]
        assert all(h["drift"] == [] for name, h in hosts.items() if name != victim.name)
        # each host's drift count reached Prometheus on the head (status wrote it there)
        head = monitoring.prometheus_node(cluster)
        expected = {n.name: 1.0 if n.name == victim.name else 0.0 for n in cluster.nodes}

        def counts(result: list[dict]) -> dict[str, float]:
            return {s["metric"]["node"]: float(s["value"][1]) for s in result}

        assert counts(wait_until(head, "provision_drift_items", lambda r: counts(r) == expected)) == expected
        # The table of the same drift is tested on loopback (test_facts_loopback): a third
        # status run here would cost a minute of TCG for the rendering alone.
    finally:
        sh(
            victim,
            f"{pip} install -q --no-deps --no-index --force-reinstall "
            f"--find-links {REMOTE_WHEELHOUSE} numpy=={installed}",
        )
    assert venv_numpy(victim) == installed
