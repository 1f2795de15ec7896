"""The real nvidia deploy against the TEST STAND-IN CUDA repository (tests/standins):
signed local apt repo served over HTTP, reached by the VMs at 10.0.2.2 (qemu user
networking). `nvidia: force` because the VMs have no GPU.

Checks the sources file, the keyring's SHA-256, the pinned versions (580, never the 590
also in the repo; NCCL built for the toolkit's CUDA 12.8, never the newer CUDA 13.0 build), the
holds, the nouveau blacklist, the persistenced override, exactly one reboot on the first
run and none on the second; on one host of the testbed (HOST). Afterwards the stand-ins are
purged, so the shared testbed is as before for the other tests.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from provision import inventory, remote, verify
from provision.facts.stamps import stamp_path
from provision.rules import monitoring
from provision.rules.nvidia import keyring_fingerprints
from provision.rules.slurm import REBOOT_PREFIX
from provision.up import host_lock, pipeline
from tests.e2e import clock
from tests.e2e.prometheus_helpers import query, wait_until
from tests.e2e.storage_helpers import FINGERPRINT, derived_inventory
from tests.standins import nvidia_repo

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
CLEANUP = (
    "apt-mark unhold $(apt-mark showhold) >/dev/null 2>&1; "
    # the stand-ins have no prerm: their services are stopped before their packages go
    "systemctl disable --now nvidia-dcgm-exporter.service nvidia-dcgm.service >/dev/null 2>&1; "
    "DEBIAN_FRONTEND=noninteractive apt-get purge -y 'nvidia-*' 'libnvidia-*' 'cuda-*' 'libnccl*' "
    "'datacenter-gpu-manager*' >/dev/null; "
    "rm -f /etc/apt/sources.list.d/cuda-*.sources /etc/apt/preferences.d/90-provision-nvidia "
    "/etc/apt/keyrings/cuda-archive-keyring.gpg /etc/modprobe.d/blacklist-nouveau.conf; "
    "rm -rf /etc/systemd/system/nvidia-persistenced.service.d /etc/systemd/system/nvidia-dcgm.service.d "
    "/etc/systemd/system/nvidia-dcgm-exporter.service.d /etc/dcgm-exporter; systemctl daemon-reload; "
    "apt-get update -qq"
)


# One host proves every point here (pins, holds, the blacklist, one reboot, the locks taken
# again), and under TCG a second VM installing and rebooting beside it only halves the CPU
# each gets: the smallest testbed that proves the point (issue 21). node2, so the NFS server
# keeps serving the shares while it reboots.
HOST = "node2"


@pytest.fixture(scope="module")
def standin_inventory(testbed, tmp_path_factory):
    """The testbed inventory cut to HOST, nvidia forced, the stand-in repository as source."""
    work = tmp_path_factory.mktemp("nvidia-standins")
    repo = nvidia_repo.build(work / "repo")
    served = nvidia_repo.serve(repo)
    inv = derived_inventory(Path(testbed.inventory_path), work / "inventory.py", [HOST], {})
    (work / "group_data").mkdir()
    source = Path(testbed.inventory_path).parent / "group_data" / "all.py"
    lines = source.read_text() if source.is_file() else ""
    url = served.url_for_vms()
    (work / "group_data" / "all.py").write_text(
        lines
        + "\n".join(
            [
                "",
                "nvidia = 'force'",
                f"nvidia_repo_url = '{url}'",
                f"nvidia_keyring_url = '{url}{nvidia_repo.KEYRING}'",
                "fabric_manager = 'force'",
                "install_nccl = True",
                f"nvidia_keyring_sha256 = '{hashlib.sha256((repo / nvidia_repo.KEYRING).read_bytes()).hexdigest()}'",
                # The stand-in's own key, in place of NVIDIA's published one (the default).
                f"nvidia_key_fingerprint = '{keyring_fingerprints((repo / nvidia_repo.KEYRING).read_bytes())[0]}'",
                "nvidia_kernel_headers = False  # TCG: unpacking headers costs minutes and proves nothing here",
                "min_root_free_gb = 1",
                "",
            ]
        )
    )
    yield inv
    cluster = inventory.load(inv)
    remote.on_all(cluster.nodes, lambda n: remote.run(n, CLEANUP, timeout=600))
    served.stop()


@pytest.fixture(scope="module")
def plan_before_first_run(standin_inventory):
    """`plan --only nvidia` on hosts without the stack: (plans, fingerprints before, after).
    Runs before the first `up` (first_and_second asks for it), so it costs one plan."""
    cluster = inventory.load(standin_inventory)
    before = {n.name: remote.run(n, FINGERPRINT).stdout for n in cluster.nodes}
    plans = pipeline.plan(cluster, pipeline.select(only="nvidia"))
    after = {n.name: remote.run(n, FINGERPRINT).stdout for n in cluster.nodes}
    return plans, before, after


@pytest.fixture(scope="module")
def first_and_second(standin_inventory, plan_before_first_run):
    cluster = inventory.load(standin_inventory)
    boots = {n.name: remote.run(n, BOOT_ID).stdout.strip() for n in cluster.nodes}
    reboots: dict[str, int] = {}  # host -> times the reboot operation started on it
    started: list[str] = []  # every operation of the first run, in the order it started

    def count(host: str, text: str) -> None:
        started.append(text)
        # Every event, timed: the first run is the e2e tier's costliest fixture, and its
        # breakdown (benchmarks/e2e_breakdown.py) says where to cut.
        clock.record("op", "nvidia first up", host=host, text=text)
        if text.startswith("reboot: ") and text.endswith("reboot and wait for SSH"):
            reboots[host] = reboots.get(host, 0) + 1

    # The first run holds the host locks as `provision up` does: the reboot ends their
    # sessions (and empties /run), and they are taken again before the next step.
    with host_lock.held(cluster) as locks:
        first = pipeline.up(cluster, pipeline.select(only="nvidia"), on_event=count, locks=locks)
        holders = {n.name: remote.run(n, f"cat {host_lock.HOLDER_FILE}").stdout for n in cluster.nodes}
        relocked = (locks.token, set(locks.held), dict(locks.refused), holders)
    boots_after = {n.name: remote.run(n, BOOT_ID).stdout.strip() for n in cluster.nodes}
    second = pipeline.up(
        cluster,
        pipeline.select(only="nvidia"),
        on_event=lambda host, text: clock.record("op", "nvidia second up", host=host, text=text),
    )
    boots_final = {n.name: remote.run(n, BOOT_ID).stdout.strip() for n in cluster.nodes}
    return cluster, first, second, (boots, boots_after, boots_final), reboots, relocked, started


def sh(node, command: str) -> str:
    result = remote.run(node, command, timeout=120)
    assert result.ok, result.stderr
    return result.stdout.strip()


def test_plan_before_first_run_shows_changes_and_changes_nothing(plan_before_first_run) -> None:
    plans, before, after = plan_before_first_run
    assert before == after  # no package, source, pin, modprobe.d or unit file touched
    for name, plan in plans.items():
        assert plan.refused == [], (name, plan.refused)
        assert plan.changes > 0, (name, plan.notes)  # the whole stack is still to install


@pytest.mark.takes_s(600)  # its fixture, the first and second runs: 424 s in CI's run of stop 46
def test_first_run_succeeds_and_reboots_every_host_once(first_and_second) -> None:
    _, first, _, (before, after, _), reboots, _, _ = first_and_second
    assert first.exit_code == 0, first.as_json()
    assert set(first.hosts) == {HOST}
    for name, host in first.hosts.items():
        assert host.rebooted is True
        assert before[name] != after[name]  # the kernel's boot id changed: it did reboot
    assert reboots == {name: 1 for name in first.hosts}  # exactly one reboot per host


def test_the_reboot_drained_the_slurm_node_first_and_resumed_it_after_the_driver_check(
    first_and_second, testbed
) -> None:
    """The shared `up` made the testbed a Slurm cluster; this run's reboot of HOST happened on
    it: drained (the reboot's own reason) before, resumed once its driver checked out."""
    _, first, *_, started = first_and_second
    assert first.hosts[HOST].rebooted
    # Drained before the driver packages changed, not only before the reboot: the new
    # libraries beside the old module would fail a running job's CUDA calls.
    drain = "Slurm: drain before the driver changes, wait for the node's jobs"
    drained = [i for i, t in enumerate(started) if t.endswith(drain)]
    installed = [i for i, t in enumerate(started) if "NVIDIA driver 580" in t]
    assert drained, started
    assert installed, started
    assert drained[0] < installed[0], started
    head = inventory.load(testbed.inventory_path).head_node()[0]
    log = sh(head, f"grep -F 'node {HOST} reason set to: {REBOOT_PREFIX}' /var/log/slurm/slurmctld.log")
    assert log.strip(), "slurmctld never saw the reboot's drain"
    state = sh(head, f"sinfo --noheader --Node --nodes={HOST} --format='%T|%E'").strip()
    assert "drain" not in state, state


def test_the_host_locks_are_taken_again_after_the_reboot(first_and_second) -> None:
    cluster, first, *_, (token, held, refused, holders), _ = first_and_second
    assert all(h.rebooted for h in first.hosts.values())
    assert refused == {}
    assert held == {n.name for n in cluster.nodes}
    for name, text in holders.items():  # written again after the reboot emptied /run
        assert f"[run {token}]" in text, (name, text)


def test_second_run_changes_nothing_and_reboots_nothing(first_and_second) -> None:
    _, _, second, (_, after, final), _, _, _ = first_and_second
    assert second.exit_code == 0, second.as_json()
    for name, host in second.hosts.items():
        assert host.changed == 0
        assert host.rebooted is False
        assert after[name] == final[name]


def test_repository_is_deb822_signed(first_and_second) -> None:
    cluster, *_ = first_and_second
    for node in cluster.nodes:
        text = sh(node, "cat /etc/apt/sources.list.d/cuda-debian12.sources")
        assert "Types: deb\n" in text
        assert "Suites: /\n" in text
        assert "Signed-By: /etc/apt/keyrings/cuda-archive-keyring.gpg" in text


def candidate(policy: str) -> str:
    """The version apt would install or upgrade to, from `apt-cache policy PACKAGE`."""
    (line,) = [line for line in policy.splitlines() if line.strip().startswith("Candidate:")]
    return line.split(":", 1)[1].strip()


def test_pinned_branch_not_the_newer_one(first_and_second) -> None:
    cluster, *_ = first_and_second
    # Each node's queries in one call, the nodes side by side: apt-cache under TCG takes
    # tens of seconds a call.
    found = remote.on_all(
        cluster.nodes,
        lambda node: (
            sh(
                node,
                "dpkg-query -W -f='${Package}=${Version}\\n' nvidia-open nvidia-open-580 "
                "nvidia-driver-cuda nvidia-fabricmanager cuda-toolkit-12-8",
            ),
            sh(node, "nvidia-smi --query-gpu=driver_version --format=csv,noheader"),
            sh(node, "apt-cache policy nvidia-open"),
        ),
    )
    for name, (versions, smi, policy) in found.items():
        assert versions.split() == [
            "cuda-toolkit-12-8=12.8.1-1",
            "nvidia-driver-cuda=580.95.05-1",
            "nvidia-fabricmanager=580.95.05-1",
            "nvidia-open=580.95.05-1",
            "nvidia-open-580=580.95.05-1",
        ], name
        assert smi == "580.95.05", name
        # The 590 release is in the repository, yet apt's candidate (what an install or an
        # upgrade would move to) stays on the pinned branch.
        assert "590" in policy, (name, policy)
        assert candidate(policy) == "580.95.05-1", (name, policy)


def test_nccl_is_the_build_for_the_toolkit_cuda_and_held(first_and_second) -> None:
    cluster, *_ = first_and_second
    found = remote.on_all(
        cluster.nodes,
        lambda node: (
            sh(node, "dpkg-query -W -f='${Package}=${Version}\\n' libnccl2 libnccl-dev"),
            sh(node, "apt-cache policy libnccl2"),
            sh(node, "apt-mark showhold"),
        ),
    )
    want = nvidia_repo.NCCL_FOR_TOOLKIT
    for name, (versions, policy, held) in found.items():
        assert versions.split() == [f"libnccl-dev={want}", f"libnccl2={want}"], name
        assert "+cuda13.0" in policy, (name, policy)  # newer, and kept out
        assert {"libnccl2", "libnccl-dev"} <= set(held.split()), name


def _login_evidence(cluster) -> str:
    """What each node's sshd and the training user's key files say, for a failed verify:
    CI once saw node1's training user refused by node2 (publickey) right after the reboot,
    and the suite's output alone could not say why."""
    command = (
        "journalctl -u ssh --no-pager -n 25 2>&1; ls -la /home/train /home/train/.ssh 2>&1; "
        "ssh-keygen -lf /home/train/.ssh/authorized_keys 2>&1; ssh-keygen -lf /home/train/.ssh/id_ed25519 2>&1"
    )
    try:
        found = remote.on_all(cluster.nodes, lambda n: remote.run(n, command, timeout=60))
    except Exception as e:  # the evidence must not hide the failure it is for
        return f"\n(login evidence not gathered: {e})"
    return "".join(f"\n--- {name} ---\n{r.stdout}{r.stderr}" for name, r in found.items())


def test_verify_suite_passes_on_the_nvidia_hosts(provisioned, first_and_second, tmp_path) -> None:
    # The whole suite runs, base and storage checks included: they need `up` (provisioned).
    cluster, *_ = first_and_second
    result = verify.run(cluster, str(tmp_path), extra=["-vv"])  # -q -vv: a line per test and host
    assert result.exit_code == 0, result.output + _login_evidence(cluster)
    # The nvidia checks ran and passed on every host (they skip where the step does not apply).
    for check in (
        "test_keyring_has_the_pinned_sha256",
        "test_nccl_is_built_for_the_toolkit_cuda_and_held",
        "test_cuda_toolkit_is_the_pinned_one",
        "test_fabric_manager_is_held_running_and_matches_the_driver",
        "test_driver_answers_with_the_pinned_version",
        "test_every_driver_package_of_the_branch_is_held",
        "test_apt_pin_keeps_driver_packages_on_the_branch",
        "test_nouveau_is_not_loaded",
        "test_persistence_daemon_runs_in_persistence_mode",
    ):
        lines = [line for line in result.output.splitlines() if f"::{check}[" in line]
        assert len(lines) == len(cluster.nodes), result.output
        assert all("PASSED" in line for line in lines), result.output


def test_driver_packages_are_held(first_and_second) -> None:
    cluster, *_ = first_and_second
    for node in cluster.nodes:
        held = set(sh(node, "apt-mark showhold").split())
        assert {
            "nvidia-open-580",
            "nvidia-open",
            "nvidia-driver-cuda",
            "nvidia-kernel-open-dkms",
            "nvidia-persistenced",
            "libnvidia-compute",
            "nvidia-fabricmanager",
        } <= held


def test_nouveau_blacklisted_and_persistenced_in_persistence_mode(first_and_second) -> None:
    cluster, *_ = first_and_second
    for node in cluster.nodes:
        assert "blacklist nouveau" in sh(node, "cat /etc/modprobe.d/blacklist-nouveau.conf")
        dropin = sh(node, "cat /etc/systemd/system/nvidia-persistenced.service.d/provision.conf")
        assert "ExecStart=/usr/bin/nvidia-persistenced --persistence-mode" in dropin
        assert sh(node, "systemctl is-enabled nvidia-persistenced") == "enabled"
        # started by the reboot, with the override applied
        assert "--persistence-mode" in sh(node, "systemctl show -p ExecStart nvidia-persistenced")
        assert sh(node, "systemctl is-active nvidia-persistenced") == "active"


# --- DCGM: the monitoring step on a declared GPU host ------------------------------------
# Last in the module: the verify suite above sees the hosts as the nvidia step left them.


@pytest.fixture(scope="module")
def dcgm_up(provisioned, testbed, first_and_second, tmp_path_factory):
    """`up --only monitoring` on the whole testbed with HOST a declared GPU host (nvidia
    force), its apt sources holding the stand-in repository since the first run: DCGM's
    stand-ins on HOST, and the head's Prometheus scraping HOST's exporter. Afterwards the
    head gets the testbed's own Prometheus configuration back (the module's cleanup purges
    DCGM): the files this `up` changes there, put back as they were, and Prometheus
    restarted on them. (An `up --only monitoring` of the head did the same in two minutes
    of TCG; the DCGM configuration's own `up` is what is under test.)"""
    work = tmp_path_factory.mktemp("dcgm")
    source = Path(testbed.inventory_path)
    names = [n.name for n in inventory.load(source).nodes]
    inv = derived_inventory(source, work / "inventory.py", names, {HOST: {"nvidia": "force"}})
    (work / "group_data").mkdir()
    data = source.parent / "group_data" / "all.py"
    (work / "group_data" / "all.py").write_text(data.read_text() if data.is_file() else "")
    cluster = inventory.load(inv)
    head = cluster.head_node()[0]
    kept = [monitoring.CONFIG, stamp_path(monitoring.PROMETHEUS_STAMP)]
    sh(head, " && ".join(f"cp -a {path} {path}.before-dcgm" for path in kept))
    # As a host the NVML collector reported before: its timer running, which must not stay.
    sh(cluster.node(HOST), NVML_COLLECTOR_BEFORE)
    result = pipeline.up(
        cluster,
        pipeline.select(only="monitoring"),
        on_event=lambda host, text: clock.record("op", "dcgm monitoring up", host=host, text=text),
    )
    yield cluster, result
    sh(head, " && ".join([*(f"mv -f {path}.before-dcgm {path}" for path in kept), RESTART_PROMETHEUS]))


# The head's Prometheus configuration and its follow-up stamp are put back together, so the
# next `up` finds both as its own; then the restart that follow-up would have run.
RESTART_PROMETHEUS = (
    f"promtool check config {monitoring.CONFIG} >/dev/null && systemctl restart {monitoring.PROMETHEUS_SERVICE}"
)


NVML_COLLECTOR_BEFORE = (
    f"printf '#!/bin/sh\\nexit 0\\n' > {monitoring.GPU_COLLECTOR}; chmod 755 {monitoring.GPU_COLLECTOR}; "
    f"printf '[Service]\\nType=oneshot\\nExecStart={monitoring.GPU_COLLECTOR}\\n' "
    f"> /etc/systemd/system/{monitoring.GPU_COLLECTOR_UNIT}.service; "
    f"printf '[Timer]\\nOnUnitActiveSec=30\\nOnBootSec=30\\n[Install]\\nWantedBy=timers.target\\n' "
    f"> /etc/systemd/system/{monitoring.GPU_COLLECTOR_UNIT}.timer; "
    f"systemctl daemon-reload && systemctl enable --now {monitoring.GPU_COLLECTOR_UNIT}.timer"
)


def test_dcgm_runs_on_the_declared_gpu_host_its_exporter_on_the_cluster_address_only(dcgm_up) -> None:
    cluster, result = dcgm_up
    assert result.exit_code == 0, result.as_json()
    node = cluster.node(HOST)
    active = sh(node, f"systemctl is-active {monitoring.DCGM_SERVICE} {monitoring.DCGM_EXPORTER_SERVICE}")
    assert active.split() == ["active", "active"]
    # DCGM, not the NVML collector: the one running before is stopped and gone
    for path in (monitoring.GPU_COLLECTOR, f"/etc/systemd/system/{monitoring.GPU_COLLECTOR_UNIT}.timer"):
        assert not remote.run(node, f"test -e {path}").ok, path
    timer = remote.run(node, f"systemctl is-active {monitoring.GPU_COLLECTOR_UNIT}.timer")
    assert timer.stdout.strip() in ("inactive", "unknown"), timer.stdout
    listening = sh(node, f"ss -Hltn 'sport = :{monitoring.DCGM_EXPORTER_PORT}'").split()
    local = [w for w in listening if w.endswith(f":{monitoring.DCGM_EXPORTER_PORT}")]
    assert local == [monitoring.host_port(node.cluster_address, monitoring.DCGM_EXPORTER_PORT)], listening
    engine = sh(node, f"ss -Hltn 'sport = :{monitoring.DCGM_PORT}'").split()
    assert [w for w in engine if w.endswith(f":{monitoring.DCGM_PORT}")] == [f"127.0.0.1:{monitoring.DCGM_PORT}"]
    # the other hosts are not GPU hosts: no DCGM there
    for other in cluster.nodes:
        if other.name != HOST:
            assert not remote.run(other, f"systemctl cat {monitoring.DCGM_EXPORTER_SERVICE}").ok, other.name


def test_prometheus_records_the_dcgm_fields_as_provisions_gpu_series(dcgm_up) -> None:
    cluster, result = dcgm_up
    assert result.exit_code == 0, result.as_json()
    head = cluster.head_node()[0]
    up = wait_until(head, f'up{{job="dcgm",node="{HOST}"}}', lambda r: [s["value"][1] for s in r] == ["1"])
    assert [s["value"][1] for s in up] == ["1"], up
    # The captured H200's idle figures (the stand-in's values), in provision's names and units.
    temperature = wait_until(head, f'provision_gpu_temperature_celsius{{node="{HOST}"}}', bool)
    assert [(s["metric"]["gpu"], s["value"][1]) for s in temperature] == [("0", "28")], temperature
    assert temperature[0]["metric"]["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    total = query(head, f'provision_gpu_memory_total_bytes{{node="{HOST}"}}')
    assert [float(s["value"][1]) for s in total] == [(143158 + 614) * 1024 * 1024], total
    assert [s["value"][1] for s in query(head, f'provision_gpu_nvml_up{{node="{HOST}"}}')] == ["1"]


def test_a_lost_host_engine_reads_as_nvml_down(dcgm_up) -> None:
    cluster, _ = dcgm_up
    head, node = cluster.head_node()[0], cluster.node(HOST)
    sh(node, f"systemctl stop {monitoring.DCGM_SERVICE}")
    try:
        down = wait_until(
            head, f'provision_gpu_nvml_up{{node="{HOST}"}}', lambda r: [s["value"][1] for s in r] == ["0"]
        )
        assert [s["value"][1] for s in down] == ["0"], down
    finally:
        sh(node, f"systemctl start {monitoring.DCGM_SERVICE}")
