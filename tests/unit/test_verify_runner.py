"""`provision verify` on the controller: its dependencies are the package's own."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from provision import verify
from provision.errors import ProvisionError
from provision.inventory import Cluster

ROOT = Path(__file__).resolve().parents[2]


def test_pytest_and_testinfra_are_runtime_dependencies() -> None:
    # verify is a shipped command, so a plain `pip install provision` must be able to run it.
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip() for d in deps}
    assert {"pytest", "pytest-testinfra"} <= names


def test_a_controller_without_testinfra_gets_one_clear_error(monkeypatch, tmp_path) -> None:
    real = importlib.util.find_spec

    def test_stand_in_find_spec(name: str, *args: object) -> object:
        return None if name == "testinfra" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", test_stand_in_find_spec)
    with pytest.raises(ProvisionError, match="needs pytest-testinfra"):
        verify.run(Cluster(tmp_path / "inv.py", ()), workdir=str(tmp_path / "work"))


def test_exportfs_output_is_read_per_share_with_exact_clients_and_options() -> None:
    # The layout `exportfs -v` (nfs-utils 2.6, Debian 12) prints: a long path alone on its
    # line, its client on the next; options in parentheses.
    from provision.verify.test_storage import parse_exportfs

    text = (
        "/data/shared/datasets\n\t\t10.77.0.0/24(sync,wdelay,hide,no_subtree_check,sec=sys,rw,secure,"
        "root_squash,no_all_squash)\n/srv\t<world>(async,rw,no_root_squash)\n"
    )
    exports = parse_exportfs(text)
    assert [c for c, _ in exports["/data/shared/datasets"]] == ["10.77.0.0/24"]
    assert {"sync", "rw", "root_squash"} <= exports["/data/shared/datasets"][0][1]
    assert exports["/srv"] == [("<world>", {"async", "rw", "no_root_squash"})]
    assert "sync" not in exports["/srv"][0][1]  # the old substring check took "async" for "sync"


def test_one_host_not_checked_is_never_hidden_by_another_hosts_failures() -> None:
    assert verify.combined_exit_code([0, 0]) == 0
    assert verify.combined_exit_code([0, 1]) == 1
    assert verify.combined_exit_code([1, verify.INTERRUPTED, 0]) == verify.INTERRUPTED
    assert verify.combined_exit_code([4, 1]) == 4  # pytest could not run on one host


def test_the_hosts_junit_reports_become_one(tmp_path) -> None:
    (tmp_path / "a.xml").write_text(
        '<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="2">'
        '<testcase name="t1[ssh://a]"/><testcase name="t2[ssh://a]"/></testsuite></testsuites>'
    )
    (tmp_path / "b.xml").write_text('<testsuite name="pytest" tests="1"><testcase name="t1[ssh://b]"/></testsuite>')
    (tmp_path / "c.xml").write_text("<testsuites><testsu")  # killed while writing it
    verify.merge_junit([tmp_path / n for n in ("a.xml", "b.xml", "c.xml", "missing.xml")], tmp_path / "all.xml")
    import xml.etree.ElementTree as ET

    root = ET.parse(tmp_path / "all.xml").getroot()
    assert root.tag == "testsuites"
    assert [c.get("name") for c in root.iter("testcase")] == ["t1[ssh://a]", "t2[ssh://a]", "t1[ssh://b]"]


def test_a_workdir_holding_someone_elses_files_is_refused_before_any_host(cli, tmp_path) -> None:
    # --workdir /etc/ssh would have had its ssh_config replaced by verify's.
    etc_ssh = tmp_path / "ssh"
    etc_ssh.mkdir()
    (etc_ssh / "ssh_config").write_text("ORIGINAL\n")
    inv = tmp_path / "inv.py"
    inv.write_text("nodes = [('n1', {'ssh_hostname': '127.0.0.1', 'ssh_port': 1, 'cluster_address': '10.0.0.1'})]\n")
    result = cli("verify", str(inv), "--workdir", str(etc_ssh))
    assert result.code == 2, result.err
    assert "holds files verify did not write" in result.err
    assert (etc_ssh / "ssh_config").read_text() == "ORIGINAL\n"
    # New, empty, or an earlier verify's (its spec.json there): written into.
    assert verify.workdir_problem(tmp_path / "new") is None
    (tmp_path / "empty").mkdir()
    assert verify.workdir_problem(tmp_path / "empty") is None
    (etc_ssh / "spec.json").write_text("{}")
    assert verify.workdir_problem(etc_ssh) is None
