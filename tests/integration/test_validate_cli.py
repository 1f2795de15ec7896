"""`provision validate` input handling: bad input exits 2 with one line, before any host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provision.validate import history, judge
from provision.validate.records import Measurement

PROVISION = Path(sys.executable).with_name("provision")


def run(*args: str, state: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_STATE_HOME": str(state or "/nonexistent")}
    return subprocess.run([str(PROVISION), "validate", *args], capture_output=True, text=True, timeout=120, env=env)


@pytest.fixture
def inventory(tmp_path):
    # Port 9 (discard) on loopback: if validate ever contacted it, the run would fail with a
    # connection error and exit 1, not 2.
    inv = tmp_path / "inv.py"
    inv.write_text("nodes = [('n1', {'ssh_hostname': '127.0.0.1', 'ssh_port': 9})]\n")
    return inv


def assert_one_error_line(p: subprocess.CompletedProcess, text: str) -> None:
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error:"), p.stderr
    assert text in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_bad_expect_file_exits_2_with_one_line(inventory, tmp_path):
    expect = tmp_path / "expect.json"
    expect.write_text("{not json")
    assert_one_error_line(run(str(inventory), "--expect", str(expect)), "not valid JSON")


def test_expect_file_with_unknown_metric_exits_2(inventory, tmp_path):
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"gpu_bf16_tflop": 500}))
    assert_one_error_line(run(str(inventory), "--expect", str(expect)), "did you mean 'gpu_bf16_tflops'")


def test_unknown_only_group_exits_2(inventory):
    assert_one_error_line(run(str(inventory), "--only", "cpu,nic"), "unknown group nic")


def test_missing_inventory_exits_2(tmp_path):
    assert_one_error_line(run(str(tmp_path / "nope.py")), "inventory file does not exist")


def test_bad_validate_expect_setting_exits_2(tmp_path):
    inv = tmp_path / "inv.py"
    inv.write_text(
        "nodes = [('n1', {'ssh_hostname': '127.0.0.1', 'ssh_port': 9, 'validate_expect': {'disk_seq_read': 10.0}})]\n"
    )
    p = run(str(inv))
    assert p.returncode == 2
    assert "validate_expect" in p.stderr
    assert "unknown metric" in p.stderr


def test_history_without_runs_exits_2(tmp_path):
    assert_one_error_line(run("--history", "n1", state=tmp_path), "no validate history for n1")


def test_history_shows_the_trend(tmp_path):
    for triad in (20.0, 15.0):
        results = judge.judge([judge.NodeInput("n1", [Measurement("n1", "ram_triad_gbs", triad)])])
        history.append(results, "2026-01-01T00:00:00+00:00", "quick", tmp_path / "provision" / "validate")
    p = run("--history", "n1", state=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "ram_triad_gbs" in p.stdout
    assert "-25.0%" in p.stdout
    doc = json.loads(run("--history", "n1", "--json", "-", state=tmp_path).stdout)
    assert [r["values"]["ram_triad_gbs"] for r in doc["runs"]] == [20.0, 15.0]


@pytest.mark.parametrize("flag", ["--json", "--html", "--junit"])
def test_report_into_a_missing_directory_exits_2_before_any_host(inventory, tmp_path, flag):
    target = tmp_path / "no-such-dir" / "report.out"
    assert_one_error_line(run(str(inventory), flag, str(target)), f"directory {target.parent} does not exist")


def test_report_path_that_is_a_directory_exits_2(inventory, tmp_path):
    assert_one_error_line(run(str(inventory), "--junit", str(tmp_path)), "is a directory")
