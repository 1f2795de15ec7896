"""base's cloud-init drop-in against real cloud-init: Debian 12's package, downloaded from the
machine's own apt sources and unpacked (never installed), merges the configuration the way
it would at boot. Debian's cloud images set ``manage_etc_hosts: true`` in
``01_debian_cloud.cfg``; with provision's ``99-provision-etc-hosts.cfg`` beside it the merged
value must be false, or the boot after the driver reboot rewrites /etc/hosts without the
cluster nodes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provision.deploys import base

MERGED = "from cloudinit import util; print(util.read_conf_with_confd(sys.argv[1]).get('manage_etc_hosts'))"


@pytest.fixture(scope="module")
def cloud_init(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unpacked cloud-init package (its Python code and its shipped /etc/cloud)."""
    where = tmp_path_factory.mktemp("cloud-init")

    def download() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["apt-get", "download", "cloud-init"], cwd=where, capture_output=True, text=True, timeout=300
        )

    done = download()
    if done.returncode != 0:  # no package lists yet (scripts/bootstrap updates them only to install)
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
        done = download()
    debs = list(where.glob("cloud-init_*.deb"))
    assert done.returncode == 0, f"apt-get download cloud-init failed: {done.stderr.strip()}"
    assert debs, f"apt-get download cloud-init failed: {done.stderr.strip()}"
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(where / "root")], check=True, timeout=120)
    return where / "root"


def merged_manage_etc_hosts(root: Path, etc: Path) -> str:
    code = "import sys; " + MERGED
    env = {**os.environ, "PYTHONPATH": str(root / "usr/lib/python3/dist-packages")}
    done = subprocess.run(
        [sys.executable, "-c", code, str(etc / "cloud.cfg")], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_drop_in_outranks_debians_cloud_image_setting(cloud_init: Path, tmp_path: Path) -> None:
    etc = tmp_path / "etc-cloud"
    shutil.copytree(cloud_init / "etc/cloud", etc)
    (etc / "cloud.cfg.d" / "01_debian_cloud.cfg").write_text("manage_etc_hosts: true\n")
    # Control: as a Debian cloud image boots, cloud-init manages /etc/hosts.
    assert merged_manage_etc_hosts(cloud_init, etc) == "True"
    (etc / "cloud.cfg.d" / Path(base.CLOUD_INIT_HOSTS).name).write_text(base.CLOUD_INIT_TEXT)
    assert merged_manage_etc_hosts(cloud_init, etc) == "False"
