"""The monitoring step, prepared by the real engine against captured facts: what each
host gets (exporter everywhere, Prometheus on the head only, the GPU collector on GPU
hosts), the order that keeps the exporter off every address, and the files' contents."""

from __future__ import annotations

import json
from pathlib import Path

from provision.deploys import monitoring
from provision.facts.gpus import Gpus
from provision.inventory import Cluster
from provision.rules import monitoring as layout
from tests.helpers.deploy_facts import H100, FakeHost, node, plan_with_facts

PREFIX = "Monitoring | "


def _names(ops: list) -> list[str]:
    return [o.name.removeprefix(PREFIX) for o in ops]


def _cluster(tmp_path: Path, *nodes) -> Cluster:
    return Cluster(tmp_path / "inv.py", tuple(nodes))


def test_a_plain_host_gets_the_exporter_on_its_cluster_address_before_the_package(tmp_path: Path) -> None:
    head = node("head", ("head",), cluster_address="10.9.0.1")
    n2 = node("n2", cluster_address="10.9.0.2")
    ops, refused = plan_with_facts(monitoring.step, n2, FakeHost(), _cluster(tmp_path, head, n2))
    names = _names(ops)
    assert refused == []
    drop_in = names.index("node exporter: listen on the cluster address")
    reload = names.index("node exporter: reload systemd")
    package = names.index("Install the node exporter")
    restart = names.index("node exporter: restart on its drop-in")
    assert drop_in < reload < package < restart  # the package's own start already uses the drop-in
    # nothing restarts a unit before its package is installed (systemctl fails on a unit
    # that does not exist: seen as the whole step failing on a fresh testbed)
    by_name = {o.name.removeprefix(PREFIX): o for o in ops}
    before = [c for n in names[:package] for c in by_name[n].commands]
    assert not [c for c in before if "restart" in c], before
    put = {o.name.removeprefix(PREFIX): o for o in ops}["node exporter: listen on the cluster address"]
    assert any("--web.listen-address=10.9.0.2:9100" in d for d in put.diffs)
    assert not any("0.0.0.0" in d or ":9100 " in d.replace("10.9.0.2:9100", "") for d in put.diffs)
    assert "Install Prometheus" not in names  # only the head runs Prometheus
    assert layout.GPU_COLLECTOR not in names  # no GPU here
    assert f"{layout.NODE_COLLECTOR_UNIT}.timer enabled" in names
    install = {o.name.removeprefix(PREFIX): o for o in ops}["Install the node exporter"]
    assert any("--no-install-recommends" in c and "prometheus-node-exporter" in c for c in install.commands)


def test_the_head_runs_prometheus_checked_by_promtool_before_a_restart(tmp_path: Path) -> None:
    head = node("head", ("head",), cluster_address="10.9.0.1", prometheus_retention="12w")
    ops, _ = plan_with_facts(monitoring.step, head, FakeHost(), _cluster(tmp_path, head, node("n2")))
    by_name = {o.name.removeprefix(PREFIX): o for o in ops}
    names = list(by_name)
    assert names.index("prometheus: listen on the cluster address") < names.index("Install Prometheus")
    follow = by_name["prometheus: check the configuration, restart"].commands
    check = next(i for i, c in enumerate(follow) if c.startswith("promtool check config /etc/prometheus/provision.yml"))
    restart = follow.index("systemctl restart prometheus.service")
    assert check < restart
    service = "".join(by_name["prometheus: listen on the cluster address"].diffs)
    assert "--web.listen-address=10.9.0.1:9090" in service
    assert "--storage.tsdb.retention.time=12w" in service
    assert "Restart=always" in service


def test_a_gpu_host_gets_the_nvml_collector_run_by_the_venv_python_isolated(tmp_path: Path) -> None:
    gpu = node("g1")  # its GPU found, not declared: DCGM is for declared GPU hosts
    facts = FakeHost(NvidiaDevices=Gpus((H100,), ()))
    ops, _ = plan_with_facts(monitoring.step, gpu, facts, _cluster(tmp_path, gpu))
    by_name = {o.name.removeprefix(PREFIX): o for o in ops}
    assert layout.GPU_COLLECTOR in by_name
    service = "".join(by_name[f"/etc/systemd/system/{layout.GPU_COLLECTOR_UNIT}.service"].diffs)
    assert f"ExecStart=/opt/provision/venv/bin/python -I {layout.GPU_COLLECTOR} --out" in service
    assert f"{layout.GPU_COLLECTOR_UNIT}.timer enabled" in by_name


DCGM_OFFERED = {"datacenter-gpu-manager-4-core": "1:4.4.1-1", "datacenter-gpu-manager-exporter": "4.4.1-4.5.2-1"}


def test_a_declared_gpu_host_gets_dcgm_on_localhost_and_its_exporter_on_the_cluster_address(tmp_path: Path) -> None:
    gpu = node("g1", ("gpu_nodes",), cluster_address="10.9.0.7")
    facts = FakeHost(NvidiaDevices=Gpus((H100,), ()), AptCandidates=DCGM_OFFERED)
    ops, refused = plan_with_facts(monitoring.step, gpu, facts, _cluster(tmp_path, gpu))
    assert refused == []
    by_name = {o.name.removeprefix(PREFIX): o for o in ops}
    names = list(by_name)
    assert layout.GPU_COLLECTOR not in by_name  # DCGM reports this host's GPUs, not NVML
    install = names.index("Install DCGM and its exporter")
    for drop_in in ("DCGM host engine: localhost only", "dcgm-exporter: listen on the cluster address"):
        assert names.index(drop_in) < names.index("DCGM: reload systemd") < install
    assert install < names.index("DCGM: restart on its drop-ins")
    commands = by_name[names[install]].commands
    assert any("--no-install-recommends" in c and "datacenter-gpu-manager-exporter" in c for c in commands)
    engine = "".join(by_name["DCGM host engine: localhost only"].diffs)
    assert "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm --bind-interface 127.0.0.1" in engine
    exporter = "".join(by_name["dcgm-exporter: listen on the cluster address"].diffs)
    assert f"-f {layout.DCGM_COUNTERS} -a 10.9.0.7:9400 -r 127.0.0.1:5555" in exporter
    assert "Restart=always" in exporter
    counters = "".join(by_name[f"dcgm-exporter: {layout.DCGM_COUNTERS}"].diffs)
    assert "DCGM_FI_DEV_GPU_TEMP, gauge" in counters
    assert {"DCGM host engine running", "dcgm-exporter running"} <= set(names)


def test_a_declared_gpu_host_without_dcgm_on_offer_is_refused_with_the_way_out(tmp_path: Path) -> None:
    gpu = node("g1", ("gpu_nodes",))
    offered = {"datacenter-gpu-manager-4-core": None, "datacenter-gpu-manager-exporter": None}
    ops, refused = plan_with_facts(
        monitoring.step, gpu, FakeHost(NvidiaDevices=Gpus((H100,), ()), AptCandidates=offered), _cluster(tmp_path, gpu)
    )
    (reason,) = refused
    assert "datacenter-gpu-manager-4-core, datacenter-gpu-manager-exporter" in reason
    assert "gpu_telemetry = 'nvml'" in reason
    assert "Install DCGM and its exporter" not in _names(ops)


def test_gpu_telemetry_nvml_keeps_a_declared_gpu_host_on_the_nvml_collector(tmp_path: Path) -> None:
    gpu = node("g1", ("gpu_nodes",), gpu_telemetry="nvml")
    facts = FakeHost(NvidiaDevices=Gpus((H100,), ()), AptCandidates=DCGM_OFFERED)
    ops, _ = plan_with_facts(monitoring.step, gpu, facts, _cluster(tmp_path, gpu))
    names = _names(ops)
    assert layout.GPU_COLLECTOR in names
    assert "Install DCGM and its exporter" not in names


def test_which_hosts_use_dcgm_is_decided_from_the_inventory() -> None:
    assert layout.uses_dcgm(node("a", ("gpu_nodes",)))
    assert layout.uses_dcgm(node("b", nvidia="force"))
    assert not layout.uses_dcgm(node("c"))  # GPUs only found: the NVML collector
    assert not layout.uses_dcgm(node("d", ("gpu_nodes",), nvidia="skip"))
    assert not layout.uses_dcgm(node("e", ("gpu_nodes",), gpu_telemetry="nvml"))
    assert not layout.uses_dcgm(node("f", ("gpu_nodes",), monitoring=False))


def test_prometheus_scrapes_the_dcgm_exporters_of_dcgm_hosts_only(tmp_path: Path) -> None:
    head = node("head", ("head",), cluster_address="10.9.0.1")
    gpu = node("g1", ("gpu_nodes",), cluster_address="fd00::7")
    config = json.loads(layout.scrape_config(_cluster(tmp_path, head, gpu)).split("\n", 1)[1])
    assert config["rule_files"] == [layout.RULES, layout.DCGM_RULES]
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "dcgm"]
    assert job["static_configs"] == [{"targets": ["[fd00::7]:9400"], "labels": {"node": "g1"}}]


def test_the_head_loads_the_rules_that_put_dcgm_fields_in_provision_names(tmp_path: Path) -> None:
    head = node("head", ("head",))
    ops, _ = plan_with_facts(monitoring.step, head, FakeHost(), _cluster(tmp_path, head))
    by_name = {o.name.removeprefix(PREFIX): o for o in ops}
    assert "provision_gpu_temperature_celsius" in "".join(by_name[f"prometheus: {layout.DCGM_RULES}"].diffs)


def test_a_host_without_gpus_removes_a_gpu_collector_left_from_before(tmp_path: Path) -> None:
    plain = node("n1")
    ops, _ = plan_with_facts(monitoring.step, plain, FakeHost(), _cluster(tmp_path, plain))
    # files.file(present=False) changes nothing where the fact says the file is absent;
    # the units to write are the node collector's only
    written = [n for n in _names(ops) if n.startswith("/etc/systemd/system/provision-")]
    assert all(layout.NODE_COLLECTOR_UNIT in n for n in written)


def test_monitoring_false_skips_the_host() -> None:
    assert monitoring.applies(node("n1", monitoring=False)) == "monitoring = false"
    assert monitoring.applies(node("n1")) is None


def test_the_node_collector_quotes_every_inventory_value(tmp_path: Path) -> None:
    n1 = node(
        "n1",
        ("storage",),
        nfs_exports=["datasets"],
        nfs_mount_root="/shared/it's",
        venv_path="/opt/v env",
        backup_schedule="*-*-* 02:00:00",
    )
    text = monitoring.node_collector(n1, _cluster(tmp_path, n1))
    assert "  report '/shared/it'\"'\"'s/datasets' '/shared/it'\"'\"'s/datasets'\n" in text
    assert "for dist in '/opt/v env'/lib/python3*/site-packages/torch-*.dist-info; do" in text
    assert "  schedule='*-*-* 02:00:00'\n" in text
    assert 'systemd-analyze calendar --iterations=2 -- "$schedule"' in text
    assert "scontrol show node -o n1" in text


def test_the_scrape_configuration_is_json_whatever_the_names(tmp_path: Path) -> None:
    n1 = node("n1", ("head",), cluster_address="10.9.0.1")
    config = json.loads(layout.scrape_config(_cluster(tmp_path, n1)).split("\n", 1)[1])
    assert config["rule_files"] == [layout.RULES, layout.DCGM_RULES]
    assert [j["job_name"] for j in config["scrape_configs"]] == ["prometheus", "node"]  # no DCGM host
    assert config["scrape_configs"][1]["static_configs"] == [{"targets": ["10.9.0.1:9100"], "labels": {"node": "n1"}}]


def test_label_values_cannot_end_a_label_or_a_line() -> None:
    assert layout.label_value('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_write_command_refuses_a_path_outside_the_textfile_directory() -> None:
    import pytest

    for bad in ["/etc/passwd", f"{layout.TEXTFILE_DIR}/../x.prom", f"{layout.TEXTFILE_DIR}/a/b.prom"]:
        with pytest.raises(ValueError, match="is not a file directly in"):
            layout.write_command(bad, "x 1\n")
    command = layout.write_command(f"{layout.TEXTFILE_DIR}/provision_validate.prom", "a 1\n'; rm -rf /\n")
    assert "'a 1\n'\"'\"'; rm -rf /\n'" in command


def test_the_storage_host_checks_its_shares_on_its_volume_the_others_over_nfs(tmp_path: Path) -> None:
    """Seen on the testbed: the storage host's shares are a bind of its volume, never NFS
    mounts; checked as NFS they read as missing and NfsMountMissing fired there."""
    storage, client = node("n1", ("storage",)), node("n2")
    cluster = _cluster(tmp_path, storage, client)
    server_script = monitoring.node_collector(storage, cluster)
    client_script = monitoring.node_collector(client, cluster)
    # the server: the mount holding the share's directory; the clients: an NFS mount there,
    # after one stat of every share (it mounts the automounted ones) within one deadline
    assert "stat -f" not in server_script
    assert "nfs | nfs4" not in server_script
    assert "timeout -k 2 10 stat -f -c %n -- /shared/datasets /shared/checkpoints" in client_script
    assert '[ -n "${answered[$1]+set}" ] || return 1' in client_script  # a hung share: no answer, missing
    assert "nfs | nfs4) return 0" in client_script
    assert "  report /shared/datasets /shared/datasets\n" in client_script


def test_the_exporter_runs_only_the_collectors_asked_for_and_always_the_textfile_one() -> None:
    args = layout.exporter_args(node("n1", cluster_address="10.9.0.2", exporter_collectors=["meminfo", "cpu"]))
    assert args == [
        "--web.listen-address=10.9.0.2:9100",
        "--collector.disable-defaults",
        "--collector.cpu",
        "--collector.meminfo",
        "--collector.textfile",
        f"--collector.textfile.directory={layout.TEXTFILE_DIR}",
    ]


def test_a_host_leaving_the_nvml_collector_stops_its_timer_and_removes_its_units(tmp_path: Path) -> None:
    gpu = node("g1", ("gpu_nodes",))  # DCGM's now; the NVML collector's timer is still there
    from datetime import datetime

    when = datetime(2026, 12, 1)
    there = {"user": "root", "group": "root", "mode": 644, "size": 300, "atime": when, "mtime": when, "ctime": when}
    facts = FakeHost(NvidiaDevices=Gpus((H100,), ()), AptCandidates=DCGM_OFFERED, File=there)
    ops, _ = plan_with_facts(monitoring.step, gpu, facts, _cluster(tmp_path, gpu))
    by_name = {o.name.removeprefix(PREFIX): o for o in ops}
    names = list(by_name)
    stop = names.index("NVML collector: timer stopped and disabled")
    assert by_name[names[stop]].commands[0] == f"systemctl disable --now {layout.GPU_COLLECTOR_UNIT}.timer"
    timer = f"no /etc/systemd/system/{layout.GPU_COLLECTOR_UNIT}.timer"
    assert stop < names.index(timer)  # disabled while its unit file is still there
    assert names.index(timer) < names.index("NVML collector: reload systemd")
    assert f"no {layout.GPU_COLLECTOR}" in names


def test_a_plan_before_the_nvidia_step_adds_the_repository_notes_dcgm_instead_of_refusing(tmp_path: Path) -> None:
    from provision.deploys import nvidia

    gpu = node("g1", ("gpu_nodes",))
    nothing = {"datacenter-gpu-manager-4-core": None, "datacenter-gpu-manager-exporter": None}
    facts = FakeHost(NvidiaDevices=Gpus((H100,), ()), AptCandidates=nothing)
    ops, refused = plan_with_facts(
        monitoring.step, gpu, facts, _cluster(tmp_path, gpu), steps=[nvidia.step, monitoring.step], planning=True
    )
    assert refused == []
    assert "Install DCGM and its exporter" not in _names(ops)
    # the same host in `up` (not a plan), the repository still without DCGM: refused
    _, refused = plan_with_facts(
        monitoring.step, gpu, facts, _cluster(tmp_path, gpu), steps=[nvidia.step, monitoring.step]
    )
    assert len(refused) == 1
