"""Slurm's TaskProlog as provision writes it (rules/cluster_env), run by a real sh: the
cluster interface each task gets, and the user's own choice kept."""

from __future__ import annotations

import subprocess
from pathlib import Path

from provision.rules import cluster_env


def _prolog(tmp_path: Path, environment: str, env: dict[str, str]) -> str:
    script = cluster_env.task_prolog().replace(cluster_env.ENVIRONMENT_FILE, str(tmp_path / "environment"))
    (tmp_path / "environment").write_text(environment)
    done = subprocess.run(["sh", "-c", script], env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_task_prolog_sets_this_nodes_interface_where_the_task_has_none(tmp_path):
    out = _prolog(tmp_path, "LANG=C\nPROVISION_CLUSTER_IFNAME=eth1\n", {})
    assert out.splitlines() == [
        "export NCCL_SOCKET_IFNAME=eth1",
        "export GLOO_SOCKET_IFNAME=eth1",
        "export PROVISION_CLUSTER_IFNAME=eth1",
    ]


def test_task_prolog_replaces_the_submitting_nodes_interface_but_keeps_the_users_own(tmp_path):
    carried = {"PROVISION_CLUSTER_IFNAME": "ens5", "GLOO_SOCKET_IFNAME": "ens5", "NCCL_SOCKET_IFNAME": "ib0"}
    out = _prolog(tmp_path, "PROVISION_CLUSTER_IFNAME=eth1\n", carried)
    assert "export GLOO_SOCKET_IFNAME=eth1" in out
    assert "NCCL_SOCKET_IFNAME" not in out  # the user's ib0 stays


def test_task_prolog_says_nothing_on_a_node_provision_found_no_interface_for(tmp_path):
    assert _prolog(tmp_path, "LANG=C\n", {}) == ""
