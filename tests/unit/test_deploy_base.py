"""The base deploy on captured facts: exact commands, and nothing on a converged host."""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import replace
from pathlib import Path

import pytest

from provision import engine
from provision.deploys import base
from provision.facts import probes
from provision.facts.chrony import NO_CONF, ChronySources, parse_chrony_sources
from provision.facts.nics import Nic
from provision.inventory import Cluster, Node, SshTarget
from provision.operations import hosts as hosts_ops
from provision.operations import stamps, time_sync
from provision.resources import render_template
from provision.rules.packages import BASE_PACKAGES
from provision.settings import Settings
from provision.state import inventory_dir
from tests.helpers.deploy_facts import FIXTURES, FakeHost, node, os_info, plan_with_facts

APT_INSTALL = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
    '-o Dpkg::Options::="--force-confold" install --no-install-recommends'
)


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROVISION_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture(autouse=True)
def seeded_training_key(state_dir: Path) -> None:
    """The controller's training key as a second run finds it (already generated), so these
    unit tests run no ssh-keygen; its generation is tested in tests/integration."""
    key = inventory_dir(Path("inv.py")) / "train_ed25519"
    for suffix in ("", ".pub"):
        source = FIXTURES / f"ssh-ed25519_test-stand-in_not-a-secret{suffix}"
        target = key.with_name(key.name + suffix)
        target.write_bytes(source.read_bytes())
        target.chmod(0o600 if not suffix else 0o644)


def cluster() -> Cluster:
    return Cluster(
        Path("inv.py"), (node("node1", cluster_address="10.77.0.11"), node("node2", cluster_address="10.77.0.12"))
    )


def by_name(ops: list[engine.PlannedOp]) -> dict[str, engine.PlannedOp]:
    return {o.name.removeprefix("Base | "): o for o in ops}


def test_fresh_debian_host_gets_packages_with_cache_window() -> None:
    ops, _ = plan_with_facts(base.step, cluster().nodes[0], FakeHost(Os=os_info("debian-12-bookworm")), cluster())
    assert by_name(ops)["Install base packages"].commands == [
        "apt-get update",
        "touch /var/lib/apt/periodic/update-success-stamp",
        f"{APT_INSTALL} {' '.join(BASE_PACKAGES)}",
    ]
    assert BASE_PACKAGES == [
        "build-essential",
        "python3-venv",
        "python3-dev",
        "numactl",
        "pciutils",
        "nvme-cli",
        "mdadm",
        "fio",
        "iperf3",
        "chrony",
        "rsync",
    ]


def test_hosts_block_lists_every_node_of_the_inventory() -> None:
    ops, _ = plan_with_facts(base.step, cluster().nodes[0], FakeHost(Os=os_info("debian-12-bookworm")), cluster())
    command = by_name(ops)["/etc/hosts: cluster nodes"].commands[0]
    assert (
        "# BEGIN provision cluster nodes\n10.77.0.11 node1\n10.77.0.12 node2\n# END provision cluster nodes" in command
    )


def test_hosts_block_leaves_a_node_reached_by_dns_name_to_dns() -> None:
    # No cluster_address and SSH by name: the cluster address is that name, and a line of
    # two names ("gpu9.example.net gpu9") would mean nothing to the resolver.
    nodes = list(cluster().nodes)
    by_name_only = Node("gpu9", SshTarget("gpu9.example.net", 22, None, None, None, "yes"), (), Settings())
    assert base.hosts_block([*nodes, by_name_only]) == "10.77.0.11 node1\n10.77.0.12 node2"


# /etc/hosts as the Debian installer (and cloud-init's default template) leave it.
INSTALLER_HOSTS = [
    "127.0.0.1\tlocalhost",
    "127.0.1.1\tnode1.example.com\tnode1",
    "",
    "# The following lines are desirable for IPv6 capable hosts",
    "::1     localhost ip6-localhost",
]


def test_the_installers_loopback_line_for_the_nodes_own_name_is_found() -> None:
    addresses = {"node1": "10.77.0.11", "node2": "10.77.0.12"}
    assert hosts_ops.shadowing_lines(INSTALLER_HOSTS, addresses) == ["127.0.1.1\tnode1.example.com\tnode1"]
    # Below our block it resolves second, and the cluster address itself is no shadow.
    ours = ["# BEGIN provision cluster nodes", "10.77.0.11 node1", "# END provision cluster nodes"]
    assert hosts_ops.shadowing_lines([*ours, *INSTALLER_HOSTS], addresses) == []
    assert hosts_ops.shadowing_lines(["10.77.0.11 node1 # same address", "#127.0.1.1 node1"], addresses) == []
    assert hosts_ops.shadowing_lines(None, addresses) == []


def test_base_moves_the_block_only_while_a_line_shadows_it() -> None:
    fake = FakeHost(Os=os_info("debian-12-bookworm"), FileContents=INSTALLER_HOSTS)
    ops = by_name(plan_with_facts(base.step, cluster().nodes[0], fake, cluster())[0])
    (moved,) = [o for n, o in ops.items() if n.startswith("/etc/hosts: cluster nodes first")]
    assert "127.0.1.1\tnode1.example.com\tnode1" in next(o for o in ops if o.startswith("/etc/hosts"))
    assert moved.commands[0].startswith("{ printf '%s\\n' '# BEGIN provision cluster nodes'")
    assert "/etc/hosts: cluster nodes" not in ops


def test_known_hosts_name_each_node_by_name_and_cluster_address() -> None:
    text = base.known_hosts_lines(
        {
            "node2": ("10.77.0.12", ["ssh-ed25519 BBB"]),
            "node1": ("10.77.0.11", ["ssh-ed25519 AAA", "ecdsa-sha2-nistp256 CCC"]),
        }
    )
    assert text == (
        "node1,10.77.0.11 ssh-ed25519 AAA\nnode1,10.77.0.11 ecdsa-sha2-nistp256 CCC\nnode2,10.77.0.12 ssh-ed25519 BBB\n"
    )


def test_unattended_upgrades_blacklist_names_nvidia_and_cuda() -> None:
    ops, _ = plan_with_facts(base.step, cluster().nodes[0], FakeHost(Os=os_info("debian-12-bookworm")), cluster())
    diff = by_name(ops)["unattended-upgrades: never NVIDIA/CUDA"].diffs[0]
    assert "+/etc/apt/apt.conf.d/51provision-unattended-upgrades (planned)" in diff.replace("+++ ", "+")
    for prefix in ('"nvidia-";', '"libnvidia-";', '"cuda-";'):
        assert f"+    {prefix}" in diff


def test_sysctls_are_each_commented_and_applied_only_when_changed() -> None:
    text = (base.templates_dir() / "base" / "sysctl-network.conf.j2").read_text()
    settings = [line for line in text.splitlines() if "=" in line and not line.startswith("#")]
    lines = text.splitlines()
    for setting in settings:
        above = lines[lines.index(setting) - 1]
        assert above.startswith("#") or "=" in above, f"{setting} has no comment"
    ops, _ = plan_with_facts(base.step, cluster().nodes[0], FakeHost(Os=os_info("debian-12-bookworm")), cluster())
    assert by_name(ops)["apply networking sysctls"].commands == [
        "sysctl -q -p /etc/sysctl.d/90-provision-network.conf",
        stamps.stamp_command("sysctl-network", stamps.digest([text])),
    ]


def _chrony_plan(sources: ChronySources, stamp: str | None = None, **settings: object) -> dict[str, engine.PlannedOp]:
    n = node("node1", **settings)
    fake = FakeHost(Os=os_info("debian-12-bookworm"), ChronySourcesFact=sources, Stamp=stamp)
    ops, _ = plan_with_facts(base.step, n, fake, Cluster(Path("inv.py"), (n,)))
    return {k: v for k, v in by_name(ops).items() if "chrony" in k}


SERVERS = ["time1.example.org", "time2.example.org"]
FILE_IN_PLACE = {"mtime": datetime.datetime(2026, 1, 1), "mode": 644, "user": "root", "group": "root", "size": 1}
SOURCES_TEXT = render_template("base/chrony-sources.j2", servers=SERVERS)


def test_ntp_servers_setting_writes_chrony_sources_and_parks_the_distributions_pool() -> None:
    ops = _chrony_plan(ChronySources(live=True, parked=False, no_conf=False), ntp_servers=SERVERS)
    diff = ops["chrony servers (ntp_servers)"].diffs[0]
    assert "+server time1.example.org iburst" in diff
    assert "+server time2.example.org iburst" in diff
    assert ops["chrony: distribution pool parked (ntp_servers)"].commands == [time_sync.park_command()]
    (restart, stamp) = ops["chrony: reload servers"].commands
    assert restart == "systemctl restart chrony"
    assert stamp.startswith("mkdir -p /var/lib/provision/stamps && ")


def test_on_a_host_without_chrony_yet_the_pool_is_parked_once_the_package_put_it_there() -> None:
    # Facts are read before the package install: chrony.conf is not there yet.
    ops = _chrony_plan(ChronySources(live=False, parked=False, no_conf=True), ntp_servers=SERVERS)
    assert ops["chrony: distribution pool parked (ntp_servers)"].commands == [time_sync.park_command()]
    assert _chrony_plan(ChronySources(no_conf=True)).keys() == {"chrony running", "chrony: reload servers"}


def test_ntp_servers_emptied_brings_the_parked_pool_back() -> None:
    ops = _chrony_plan(ChronySources(live=False, parked=True, no_conf=False))
    assert ops["chrony: distribution pool in force"].commands == [time_sync.unpark_command()]
    assert "chrony: reload servers" in ops


def test_chrony_converged_with_ntp_servers_changes_nothing() -> None:
    done = stamps.digest([SOURCES_TEXT])
    fake = FakeHost(
        Os=os_info("debian-12-bookworm"),
        ChronySourcesFact=ChronySources(live=False, parked=True, no_conf=False),
        Stamp=done,
        File=FILE_IN_PLACE,
        Directory={"mode": 755, "user": "root", "group": "root"},
        Sha1File=hashlib.sha1(SOURCES_TEXT.encode()).hexdigest(),
        SystemdStatus={"chrony.service": True},
        SystemdEnabled={"chrony.service": True},
    )
    n = node("node1", ntp_servers=SERVERS)
    ops, _ = plan_with_facts(base.step, n, fake, Cluster(Path("inv.py"), (n,)))
    # (Its restart is guarded by _if, so a plan lists it after any other change.)
    assert [k for k in by_name(ops) if "chrony" in k and k != "chrony: reload servers"] == []


def test_chrony_is_restarted_after_a_run_stopped_before_its_restart() -> None:
    # The sources file is right and the pool parked, but the stamp is an older one's: the
    # run that changed them was killed before chrony was restarted.
    ops = _chrony_plan(ChronySources(live=False, parked=True, no_conf=False), "an older digest", ntp_servers=SERVERS)
    assert ops["chrony: reload servers"].commands[0] == "systemctl restart chrony"


def test_chrony_fact_reads_only_the_kinds_of_lines_never_ours() -> None:
    lines = [
        "/etc/chrony/chrony.conf:pool 2.debian.pool.ntp.org iburst",
        "/etc/chrony/sources.d/provision.sources:server 10.0.0.1 iburst",
    ]
    assert parse_chrony_sources(lines) == ChronySources(live=True, parked=False, no_conf=False)
    assert parse_chrony_sources(lines[1:]) == ChronySources(live=False, parked=False, no_conf=False)
    parked = ["/etc/chrony/sources.d/ubuntu-ntp-pools.sources:#provision-ntp_servers: pool ntp.ubuntu.com iburst"]
    assert parse_chrony_sources(parked) == ChronySources(live=False, parked=True, no_conf=False)
    assert parse_chrony_sources([NO_CONF]) == ChronySources(live=False, parked=False, no_conf=True)


def test_packages_and_cache_already_current_change_nothing() -> None:
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    installed = {name: ["1.0"] for name in BASE_PACKAGES}
    fake = FakeHost(
        Os=os_info("debian-12-bookworm"),
        DebPackages=installed,
        File={"mtime": now, "mode": 644, "user": "root", "group": "root", "size": 1},
        Date=datetime.datetime.now(),
    )
    ops, _ = plan_with_facts(base.step, cluster().nodes[0], fake, cluster())
    assert "Install base packages" not in by_name(ops)


def test_an_interrupted_dpkg_run_is_finished_before_installing(state_dir: Path) -> None:
    from provision.facts.probes import parse_dpkg_interrupted

    assert parse_dpkg_interrupted(["3", "0"])
    assert parse_dpkg_interrupted(["0", "12"])
    assert not parse_dpkg_interrupted(["0", "0"])
    fake = FakeHost(Os=os_info("debian-12-bookworm"), DpkgInterrupted=True)
    ops, _ = plan_with_facts(base.step, cluster().nodes[0], fake, cluster())
    names = [o.name for o in ops]
    finish = "Base | Finish an interrupted dpkg run"
    assert by_name(ops)["Finish an interrupted dpkg run"].commands == [
        "DEBIAN_FRONTEND=noninteractive dpkg --force-confdef --force-confold --configure -a"
    ]
    assert names.index(finish) < names.index("Base | Install base packages")
    clean = FakeHost(Os=os_info("debian-12-bookworm"))
    assert "Finish an interrupted dpkg run" not in by_name(
        plan_with_facts(base.step, cluster().nodes[0], clean, cluster())[0]
    )


def test_an_account_already_as_wanted_skips_pyinfras_user_and_group_ops() -> None:
    # Re-runs pay only for one getent, not for pyinfra's Users fact over every account.
    from provision.facts.probes import Account, parse_account

    lines = ["train:x:2000:2000::/home/train:/bin/bash", "--", "train:x:2000:", "--", "train:x:2000:"]
    assert parse_account(lines) == Account(2000, 2000, "/home/train", "/bin/bash", "train", 2000)
    assert parse_account(["--", "--"]) is None  # no such user
    ready = FakeHost(Os=os_info("debian-12-bookworm"), AccountFact=parse_account(lines))
    names = by_name(plan_with_facts(base.step, cluster().nodes[0], ready, cluster())[0])
    assert "training user train" not in names
    assert "training group train" not in names
    other_shell = Account(2000, 2000, "/home/train", "/bin/sh", "train", 2000)
    fix = FakeHost(Os=os_info("debian-12-bookworm"), AccountFact=other_shell)
    names = by_name(plan_with_facts(base.step, cluster().nodes[0], fix, cluster())[0])
    assert "training user train" in names


LOCK_STEP = "apt: wait for the dpkg lock (apt_lock_wait_s)"


def test_every_later_apt_run_waits_for_the_dpkg_lock_by_a_config_written_before_the_first_install() -> None:
    # After provision's own reboot apt-daily/unattended-upgrades often hold the lock while the
    # nvidia and storage steps run apt; the apt.conf.d file makes all of them wait, not only base.
    ops, _ = plan_with_facts(
        base.step, node("node1", apt_lock_wait_s=120), FakeHost(Os=os_info("debian-12-bookworm")), cluster()
    )
    assert base.apt_lock_conf(120).splitlines()[-1] == 'DPkg::Lock::Timeout "120";'
    assert all(line.startswith("//") for line in base.apt_lock_conf(120).splitlines()[:-1])
    lock = by_name(ops)[LOCK_STEP]
    assert lock.commands[-1] == "upload (generated) -> /etc/apt/apt.conf.d/90provision-dpkg-lock-timeout"
    assert '+DPkg::Lock::Timeout "120";' in lock.diffs[0]
    names = [o.name.removeprefix("Base | ") for o in ops]
    assert names.index(LOCK_STEP) < names.index("Install base packages")


def test_the_lock_timeout_config_already_in_place_changes_nothing() -> None:
    import hashlib

    written = hashlib.sha1(base.apt_lock_conf(300).encode()).hexdigest()
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    present = {"mtime": now, "mode": 644, "user": "root", "group": "root", "size": 1}
    same = FakeHost(
        Os=os_info("debian-12-bookworm"),
        File=present,
        Directory=present,
        Sha1File=written,
        Date=datetime.datetime.now(),
    )
    assert LOCK_STEP not in by_name(plan_with_facts(base.step, cluster().nodes[0], same, cluster())[0])
    other = FakeHost(
        Os=os_info("debian-12-bookworm"),
        File=present,
        Directory=present,
        Sha1File="0" * 40,
        Date=datetime.datetime.now(),
    )
    assert LOCK_STEP in by_name(plan_with_facts(base.step, cluster().nodes[0], other, cluster())[0])


def test_cloud_init_is_told_to_leave_etc_hosts_alone_where_it_is_installed(monkeypatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(base, "note", said.append)
    fake = FakeHost(Os=os_info("debian-12-bookworm"), CloudInitFact=probes.CloudInit(True, ()), Nics=_CLUSTER_NIC)
    ops = by_name(plan_with_facts(base.step, cluster().nodes[0], fake, cluster())[0])
    diff = ops["cloud-init: leave /etc/hosts to provision"].diffs[0]
    assert "+manage_etc_hosts: false" in diff
    assert base.CLOUD_INIT_HOSTS == "/etc/cloud/cloud.cfg.d/99-provision-etc-hosts.cfg"
    assert said == []
    # No cloud-init: nothing written there.
    bare = FakeHost(Os=os_info("debian-12-bookworm"), CloudInitFact=probes.CloudInit(False, ()))
    assert "cloud-init: leave /etc/hosts to provision" not in by_name(
        plan_with_facts(base.step, cluster().nodes[0], bare, cluster())[0]
    )


def test_user_data_that_sets_manage_etc_hosts_is_named_in_a_note(monkeypatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(base, "note", said.append)
    data = ("/var/lib/cloud/instance/vendor-data.txt",)
    fake = FakeHost(Os=os_info("debian-12-bookworm"), CloudInitFact=probes.CloudInit(True, data), Nics=_CLUSTER_NIC)
    plan_with_facts(base.step, cluster().nodes[0], fake, cluster())
    (text,) = said
    assert text.startswith("base: /var/lib/cloud/instance/vendor-data.txt sets cloud-init's manage_etc_hosts")


def test_a_limited_run_still_lists_every_node_in_etc_hosts() -> None:
    whole = cluster()
    part = replace(whole, nodes=whole.nodes[:1], whole=whole.nodes)  # --limit node1
    ops, _ = plan_with_facts(base.step, part.nodes[0], FakeHost(Os=os_info("debian-12-bookworm")), part)
    command = by_name(ops)["/etc/hosts: cluster nodes"].commands[0]
    assert "10.77.0.11 node1\n10.77.0.12 node2\n" in command


def test_known_hosts_keeps_the_lines_of_nodes_this_run_did_not_read() -> None:
    # node2 is not in the pass (--limit node1): its key line on the host is kept, not dropped.
    # (A planned pass reads no host keys, so node1's line is carried here too.)
    whole = cluster()
    part = replace(whole, nodes=whole.nodes[:1], whole=whole.nodes)
    on_host = ["node1,10.77.0.11 ssh-ed25519 OLD1", "node2,10.77.0.12 ssh-ed25519 KEY2", "# comment", "junk"]
    fake = FakeHost(Os=os_info("debian-12-bookworm"))

    def facts(cls: type, kwargs: dict) -> object:
        if cls.__name__ == "FileContents" and str(kwargs.get("path", "")).endswith("/.ssh/known_hosts"):
            return on_host
        return fake(cls, kwargs)

    ops, _ = plan_with_facts(base.step, part.nodes[0], facts, part)
    (put,) = [o for name, o in by_name(ops).items() if name.startswith("training user: known_hosts")]
    diff = "\n".join(put.diffs).splitlines()
    assert " node2,10.77.0.12 ssh-ed25519 KEY2" in diff  # kept, unchanged
    assert "-junk" in diff  # only well-formed key lines of cluster nodes are carried


def test_carried_keys_take_only_the_named_nodes_well_formed_lines() -> None:
    lines = ["node2,10.0.0.2 ssh-ed25519 K2", "node2 ecdsa-sha2-nistp256 K3", "node3 ssh-ed25519 K4", "# x y z", "bad"]
    assert base.carried_keys(["node2"], lines) == {"node2": ["ssh-ed25519 K2", "ecdsa-sha2-nistp256 K3"]}
    assert base.carried_keys(["node2"], None) == {}


def _cluster_nic(address: str) -> list[Nic]:
    return [Nic("eth1", None, "UP", 1500, (f"{address}/24",), None, "ether")]


_CLUSTER_NIC = _cluster_nic("10.77.0.11")


def test_jobs_get_the_interface_holding_the_cluster_address_in_etc_environment(monkeypatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(base, "note", said.append)
    first = cluster().nodes[0]
    fake = FakeHost(Os=os_info("debian-12-bookworm"), Nics=_cluster_nic(first.cluster_address))
    ops = by_name(plan_with_facts(base.step, first, fake, cluster())[0])
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "PROVISION_CLUSTER_IFNAME"):
        assert ops[f"/etc/environment: {key}=eth1"].commands  # the line added
    assert not [s for s in said if "interface" in s]


def test_no_interface_for_the_cluster_address_is_said_and_nothing_is_written(monkeypatch) -> None:
    said: list[str] = []
    monkeypatch.setattr(base, "note", said.append)
    fake = FakeHost(Os=os_info("debian-12-bookworm"), Nics=_cluster_nic("10.99.0.1"))
    ops = by_name(plan_with_facts(base.step, cluster().nodes[0], fake, cluster())[0])
    assert not [name for name in ops if name.startswith("/etc/environment")]
    assert [s for s in said if "no interface holds cluster address" in s]
