"""The base deploy's shell run for real: the /etc/hosts rewrite on a file, the cloud-init
probe on a tree, the training key generated with ssh-keygen, chrony's pools parked and
brought back on a copy of Debian's chrony.conf."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provision.deploys import base
from provision.facts import chrony, probes
from provision.operations import hosts as hosts_ops
from provision.operations import time_sync
from tests.helpers.deploy_facts import FIXTURES, FakeHost, os_info, plan_with_facts
from tests.unit.test_deploy_base import (
    INSTALLER_HOSTS,
    by_name,
    cluster,
)

# The controller's state directory is the test's own (tests/integration/conftest.py).
pytestmark = pytest.mark.usefixtures("state_dir")


def test_a_shadowed_hosts_block_is_moved_first_keeping_every_other_line(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    old_block = ["# BEGIN provision cluster nodes", "10.77.0.99 node1", "# END provision cluster nodes"]
    hosts.write_text("\n".join([*INSTALLER_HOSTS, *old_block]) + "\n")
    hosts.chmod(0o644)
    inode = hosts.stat().st_ino
    block = "10.77.0.11 node1\n10.77.0.12 node2"
    command = hosts_ops.hosts_first_command(block).replace("/etc/hosts", str(hosts))
    subprocess.run(["bash", "-c", command], check=True, timeout=30)
    assert hosts.read_text().splitlines() == [
        "# BEGIN provision cluster nodes",
        "10.77.0.11 node1",
        "10.77.0.12 node2",
        "# END provision cluster nodes",
        *INSTALLER_HOSTS,
    ]
    assert hosts.stat().st_ino == inode
    assert list(tmp_path.iterdir()) == [hosts]
    # The first match of the rewritten file is the cluster address: what getent answers.
    first = next(line for line in hosts.read_text().splitlines() if line.split()[1:2] == ["node1"])
    assert first == "10.77.0.11 node1"


def test_training_user_key_is_generated_once_and_shared(state_dir: Path) -> None:
    first = base.training_key(cluster(), "train")
    mtime = first.stat().st_mtime_ns
    assert base.training_key(cluster(), "train") == first
    assert first.stat().st_mtime_ns == mtime
    assert first.stat().st_mode & 0o777 == 0o600
    assert first.with_suffix(".pub").is_file()
    ops, _ = plan_with_facts(base.step, cluster().nodes[1], FakeHost(Os=os_info("debian-12-bookworm")), cluster())
    assert f"upload {first} -> /home/train/.ssh/id_ed25519" in by_name(ops)["training user: private key"].commands
    # The plan shows that the key is uploaded, never the key itself.
    everything = "\n".join(c for o in ops for c in (*o.commands, *o.diffs))
    assert "PRIVATE KEY" not in everything
    assert first.read_text().splitlines()[1] not in everything
    # The pinned uid/gid (training_uid), group first: NFS files carry numeric ids.
    assert by_name(ops)["training group train"].commands == ["groupadd train --gid 2000"]
    assert by_name(ops)["training user train"].commands[0] == (
        "useradd -d /home/train -s /bin/bash -g train --uid 2000 -m train"
    )


def test_the_cloud_init_probe_finds_the_setting_in_user_and_vendor_data(tmp_path: Path) -> None:
    (tmp_path / "etc/cloud/cloud.cfg.d").mkdir(parents=True)
    instance = tmp_path / "var/lib/cloud/instance"
    instance.mkdir(parents=True)
    (instance / "user-data.txt").write_text("#cloud-config\nmanage_etc_hosts: false\n")
    (instance / "vendor-data.txt").write_text("#cloud-config\ndisable_root: false\nmanage_etc_hosts: true\n")
    (instance / "vendor-data2.txt").write_text("#cloud-config\n  manage_etc_hosts: 'template'\n")
    command = (
        probes.CloudInitFact()
        .command()
        .replace("/etc/cloud", f"{tmp_path}/etc/cloud")
        .replace("/var/lib/cloud", f"{tmp_path}/var/lib/cloud")
    )
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    found = probes.parse_cloud_init(out.splitlines())
    assert found.installed
    assert found.overriding == (f"{instance}/vendor-data.txt", f"{instance}/vendor-data2.txt")
    (tmp_path / "etc/cloud/cloud.cfg.d").rmdir()
    for f in instance.iterdir():
        f.unlink()
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert probes.parse_cloud_init(out.splitlines()) == probes.CloudInit(False, ())


# Debian 12's own chrony.conf (chrony 4.3-2+deb12u3, as the package installs it), and the
# shape of Ubuntu 24.04's sources.d pool file (hand-written: two of its pool lines).
DEBIAN_CHRONY_CONF = FIXTURES / "chrony-conf_debian12-chrony-4.3-2+deb12u3.conf"
UBUNTU_STYLE_POOLS = (
    "# Ubuntu-style pool file (hand-written)\n"
    "pool ntp.ubuntu.com iburst maxsources 4\n"
    "  pool 1.ubuntu.pool.ntp.org iburst maxsources 1\n"
)


def _chrony_tree(root: Path) -> tuple[Path, Path, Path]:
    etc = root / "etc" / "chrony"
    (etc / "sources.d").mkdir(parents=True)
    conf, pools = etc / "chrony.conf", etc / "sources.d" / "ubuntu-ntp-pools.sources"
    ours = etc / "sources.d" / "provision.sources"
    conf.write_bytes(DEBIAN_CHRONY_CONF.read_bytes())
    pools.write_text(UBUNTU_STYLE_POOLS)
    ours.write_text("server 10.0.0.1 iburst\n")
    (etc / "conf.d").mkdir()
    (etc / "conf.d" / "image.conf").write_text(
        "# an image's own source (hand-written)\nserver 169.254.169.123 prefer\n"
    )
    return conf, pools, ours


def _on_tree(command: str, root: Path) -> subprocess.CompletedProcess[str]:
    """A chrony command of the deploy, run by sh with /etc/chrony and provision's stamps
    moved under ``root``."""
    text = command.replace("/etc/chrony", str(root / "etc" / "chrony"))
    text = text.replace("/var/lib/provision", str(root / "var" / "lib" / "provision"))
    return subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=30, check=True)


def _fact_on_tree(root: Path) -> chrony.ChronySources:
    """The chrony fact read on the tree under ``root``, its paths told as on a host."""
    fact = chrony.ChronySourcesFact()
    return fact.process(_on_tree(fact.command(), root).stdout.replace(str(root), "").splitlines())


def test_ntp_servers_park_the_distributions_pools_and_bring_them_back_unchanged(tmp_path: Path) -> None:
    conf, pools, ours = _chrony_tree(tmp_path)
    image_conf = tmp_path / "etc" / "chrony" / "conf.d" / "image.conf"
    before = {p: p.read_bytes() for p in (conf, pools, ours, image_conf)}
    assert _fact_on_tree(tmp_path) == chrony.ChronySources(live=True, parked=False, no_conf=False)

    stamp = tmp_path / "var" / "lib" / "provision" / "stamps" / "chrony-sources"
    stamp.parent.mkdir(parents=True)
    stamp.write_text("the digest of the last restart\n")
    _on_tree(time_sync.park_command(), tmp_path)
    assert not stamp.exists()  # a run stopped after this edit restarts chrony next time
    assert "#provision-ntp_servers: pool 2.debian.pool.ntp.org iburst\n" in conf.read_text()
    assert "#provision-ntp_servers: server 169.254.169.123 prefer\n" in image_conf.read_text()
    assert pools.read_text().splitlines()[1:] == [
        "#provision-ntp_servers: pool ntp.ubuntu.com iburst maxsources 4",
        "#provision-ntp_servers:   pool 1.ubuntu.pool.ntp.org iburst maxsources 1",
    ]
    assert ours.read_bytes() == before[ours]  # our own server is never parked
    # Nothing else in chrony.conf moved: the same lines but the pool's.
    old_lines, new_lines = before[conf].decode().splitlines(), conf.read_text().splitlines()
    assert len(old_lines) == len(new_lines)
    changed = [a for a, b in zip(old_lines, new_lines, strict=True) if a != b]
    assert changed == ["pool 2.debian.pool.ntp.org iburst"]
    assert _fact_on_tree(tmp_path) == chrony.ChronySources(live=False, parked=True, no_conf=False)
    _on_tree(time_sync.park_command(), tmp_path)  # a second park is a no-op
    assert "#provision-ntp_servers: #provision" not in conf.read_text()

    _on_tree(time_sync.unpark_command(), tmp_path)
    assert {p: p.read_bytes() for p in (conf, pools, ours, image_conf)} == before


def test_the_chrony_fact_says_when_chrony_is_not_installed_yet(tmp_path: Path) -> None:
    (tmp_path / "etc" / "chrony").mkdir(parents=True)
    assert _fact_on_tree(tmp_path) == chrony.ChronySources(live=False, parked=False, no_conf=True)
    _on_tree(time_sync.park_command(), tmp_path)  # nothing to park, and no error
