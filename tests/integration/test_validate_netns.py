"""`provision validate` against hosts in network namespaces with their own sshd: real SSH,
real iperf3 link rounds, real torchrun (gloo) all-reduce across hosts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from provision.validate import remeasure
from tests.helpers.cpu_quota import cpu_quota

VENV = Path(__file__).resolve().parents[2] / ".venv"
PROVISION = VENV / "bin" / "provision"

if shutil.which("iperf3") is None:
    pytest.skip("iperf3 is not installed", allow_module_level=True)


def validate(inventory: Path, tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp / "report.json"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state")}
    p = subprocess.run(
        [str(PROVISION), "validate", str(inventory), "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return p, json.loads(out.read_text()) if out.exists() else {}


def records(doc: dict, node: str, metric: str) -> list[dict]:
    return [r for r in doc["records"] if r["node"] == node and r["metric"] == metric]


def test_three_hosts_measured_judged_and_reported(netns_hosts, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    cluster = netns_hosts(3, venv_path=str(VENV), data_mount=str(data))
    html, junit = tmp_path / "r.html", tmp_path / "r.xml"
    p, doc = validate(
        cluster.inventory,
        tmp_path,
        "--only",
        "cpu,ram,disk,net,gpu,allreduce",
        "--html",
        str(html),
        "--junit",
        str(junit),
    )
    assert p.returncode in (0, 1), p.stderr
    assert p.returncode == (0 if all(n["verdict"] == "pass" for n in doc["nodes"]) else 1)
    for host in ("ns0", "ns1", "ns2"):
        for metric in (
            "cpu_gemm_gflops",
            "ram_triad_gbs",
            "disk_seq_read_mibs",
            "disk_rand_read_iops",
            "net_gbits",
            "allreduce_nodes_busbw_gbs",
        ):
            (rec,) = records(doc, host, metric)
            assert rec["value"] is not None, (host, metric, rec)
            assert rec["value"] > 0, (host, metric, rec)
        assert all(r["reason"] == "not run: no GPU" for r in records(doc, host, "gpu_bf16_tflops"))
    assert doc["network"]["links"]["rounds"] == 3  # ring of 3: each node in one pair per round
    assert doc["network"]["allreduce"]["world"] == 3
    assert list(data.iterdir()) == []  # fio files removed
    assert ET.parse(junit).getroot().get("tests")
    assert html.read_text().count("<svg") >= 6
    assert (tmp_path / "state" / "provision" / "validate" / "ns1.jsonl").is_file()


def shape(cluster, index: int, rate: str = "50mbit") -> None:
    """Throttle host ``index``'s link both ways: its own NIC and the bridge side of its veth.
    50 Mbit/s is far below what a veth pair carries even on a loaded 2-core machine, so the
    slow node stands out against the fleet median however busy the machine is."""
    host = cluster.hosts[index]
    tbf = ["tc", "qdisc", "add", "dev"]
    limits = ["root", "tbf", "rate", rate, "burst", "64kbit", "latency", "50ms"]
    assert cluster.exec(host, *tbf, "cl0", *limits).returncode == 0
    subprocess.run([*tbf, cluster.veths[index], *limits], check=True, timeout=30)


def test_degraded_link_is_bisected_to_its_node(netns_hosts, tmp_path):
    cluster = netns_hosts(4, venv_path=str(VENV), data_mount=str(tmp_path))
    shape(cluster, 2)
    p, doc = validate(cluster.inventory, tmp_path, "--only", "net")
    assert p.returncode == 1, (p.stderr[-2000:], doc.get("network"))
    assert set(doc["network"]["links"]["blamed"]) == {"ns2"}
    (slow,) = records(doc, "ns2", "net_gbits")
    assert slow["verdict"] == "fail"
    assert "bisected against" in slow["reason"]
    verdicts = {n["node"]: n["verdict"] for n in doc["nodes"]}
    assert verdicts["ns2"] == "fail"
    assert all(verdicts[h] != "fail" for h in ("ns0", "ns1", "ns3"))


def test_unreachable_host_fails_and_the_others_are_still_judged(netns_hosts, tmp_path):
    cluster = netns_hosts(2, venv_path=str(VENV), data_mount=str(tmp_path))
    extra = {"venv_path": str(VENV), "data_mount": str(tmp_path)}
    hosts = [(h.name, {**cluster.host_data(h), **extra}) for h in cluster.hosts]
    ghost = {**hosts[0][1], "ssh_hostname": "127.0.0.1", "ssh_port": 1, "cluster_address": "127.0.0.1"}
    inventory = tmp_path / "inv.py"
    inventory.write_text(f"nodes = {[*hosts, ('ghost', ghost)]!r}\n")
    p, doc = validate(inventory, tmp_path, "--only", "cpu,net")
    assert p.returncode == 1
    verdicts = {n["node"]: n for n in doc["nodes"]}
    assert verdicts["ghost"]["verdict"] == "fail"
    assert verdicts["ghost"]["errors"]
    (ns0_cpu,) = records(doc, "ns0", "cpu_gemm_gflops")
    assert ns0_cpu["value"] > 0
    (ns0_net,) = records(doc, "ns0", "net_gbits")
    assert ns0_net["value"] > 0  # measured against ns1; the ghost is left out of the rounds


def agents_of(host: str) -> list[int]:
    """The validate agent's python processes for ``host``: argv[1] is the agent file the
    controller uploaded as /tmp/provision-validate-<host>-<token>.py (its `timeout` wrapper
    and the shell around it have other argv[1]s)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or it exited meanwhile
            continue
        if len(argv) > 1 and f"/provision-validate-{host}-".encode() in argv[1]:
            pids.append(int(d.name))
    return pids


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a cgroup needs root")
def test_a_node_slowed_by_its_neighbour_is_measured_again_alone_and_passes(netns_hosts, tmp_path):
    """ns1's first agent runs under a 5 % CPU quota (a neighbour taking the machine, as
    the testbed's VMs do to each other); the agent run again for the outlier is not capped.
    The report judges the second figure and keeps the first. The quota's period is 20 ms (its quota the 1 ms minimum):
    a GEMM repetition of a few milliseconds could fit whole in one period of a longer one
    and be timed at full speed (the agent keeps the best repetition)."""
    cluster = netns_hosts(2, venv_path=str(VENV), data_mount=str(tmp_path), validate_budgets_s={"cpu": 4})
    # Both hosts' sshd, so every agent they start, on one and the same core: each agent's
    # GEMM then runs one thread. Two threads on a busy machine wait on each other whenever
    # one is descheduled, and a figure then swings 5x from run to run (seen beside busy loops).
    core = min(os.sched_getaffinity(0))
    for host in cluster.hosts:
        os.sched_setaffinity(host.sshd.pid, {core})
    with cpu_quota(1_000, 20_000) as procs:
        capped: list[int] = []
        stop = threading.Event()

        def cap_the_first_agent() -> None:
            while not capped and not stop.wait(0.02):
                for pid in agents_of("ns1"):
                    with contextlib.suppress(OSError):  # it exited meanwhile
                        procs.write_text(str(pid))
                        capped.append(pid)

        watcher = threading.Thread(target=cap_the_first_agent, daemon=True)
        watcher.start()
        try:
            p, doc = validate(cluster.inventory, tmp_path, "--only", "cpu", "--warn-ok")
        finally:
            stop.set()
            watcher.join(timeout=10)
    assert capped, "ns1's agent was never seen"
    (first,) = records(doc, "ns0", "cpu_gemm_gflops")
    (again,) = records(doc, "ns1", "cpu_gemm_gflops")
    assert remeasure.AGAIN in again["reason"], again
    assert first["verdict"] != "fail", first
    assert again["verdict"] != "fail", again  # measured alone, uncapped, it is as fast as ns0
    assert p.returncode == 0, (p.stdout[-2000:], [r for r in doc["records"] if r["verdict"] != "pass"])
    assert remeasure.AGAIN not in first["reason"]  # only the outlier ran again
