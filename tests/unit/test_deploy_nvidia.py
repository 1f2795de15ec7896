"""The nvidia deploy on captured Ubuntu and Debian facts: exact commands per OS and GPU."""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pyinfra.api.util import get_template

from provision import engine
from provision.deploys import nvidia
from provision.facts.apt import parse_source_files
from provision.facts.gpus import Gpus
from provision.facts.probes import SecureBoot, parse_probe, parse_reboot_state
from provision.operations import nvidia as nvidia_ops
from provision.operations import stamps
from provision.resources import templates_dir
from provision.rules import nvidia as nvidia_rules
from provision.rules import packages as pkgs
from provision.rules import slurm as slurm_rules
from tests.helpers.deploy_facts import FIXTURES, H100, NVSWITCH, P100, FakeHost, node, os_info, plan_with_facts, probe

INSTALL = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
    '-o Dpkg::Options::="--force-confold" install'
)


def plan(
    fixture: str, gpus: Gpus, groups: tuple[str, ...] = (), facts: dict[str, Any] | None = None, **settings: object
) -> dict[str, engine.PlannedOp]:
    fake = FakeHost(
        **{"Os": os_info(fixture), "NvidiaDevices": gpus, "Probe": settings.pop("probe", probe()), **(facts or {})}
    )
    ops, _ = plan_with_facts(nvidia.step, node(groups=groups, **settings), fake)  # type: ignore[arg-type]
    return {o.name.removeprefix("NVIDIA stack | "): o for o in ops}


@pytest.fixture
def notes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The notes the nvidia step leaves for the host's summary row."""
    said: list[str] = []
    monkeypatch.setattr(nvidia, "note", said.append)
    return said


def test_ubuntu_2204_hgx_host_gets_repo_open_driver_fabricmanager_toolkit() -> None:
    ops = plan("ubuntu-22.04-jammy", Gpus((H100, NVSWITCH), ()))
    assert list(ops) == [
        "download tools (curl, CA certificates)",
        "/etc/apt/keyrings",
        "CUDA repository keyring",
        "CUDA repository (deb822, Signed-By)",
        "apt pin: NVIDIA driver branch 580",
        "wait for apt locks",
        "apt update (CUDA repository not read yet)",
        "blacklist nouveau",
        "update initramfs (nouveau blacklisted)",
        "kernel headers for 5.15.0-185-generic",
        "Slurm: drain before the driver changes, wait for the node's jobs",
        "NVIDIA driver 580 (open modules, cuda-repo)",
        "fabric manager nvidia-fabricmanager=580.*",
        "CUDA toolkit and extras",
        "nvidia-persistenced: persistence mode on",
        "systemd daemon-reload (persistenced drop-in)",
        "nvidia-persistenced enabled",
        "nvidia-fabricmanager enabled",
    ]
    assert (
        "upload (generated) -> /etc/apt/sources.list.d/cuda-ubuntu2204.sources"
        in ops["CUDA repository (deb822, Signed-By)"].commands
    )
    assert ops["CUDA repository keyring"].commands[0] == (
        "curl -sSLf --retry 3 -o /etc/apt/keyrings/cuda-archive-keyring.gpg.provision-new "
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/cuda-archive-keyring.gpg"
    )
    assert ops["NVIDIA driver 580 (open modules, cuda-repo)"].commands == [
        f"{INSTALL} --allow-change-held-packages nvidia-open-580"
    ]
    assert ops["kernel headers for 5.15.0-185-generic"].commands == [
        f"{INSTALL} --no-install-recommends linux-headers-5.15.0-185-generic"
    ]
    assert ops["CUDA toolkit and extras"].commands == [f"{INSTALL} --no-install-recommends cuda-toolkit-12-8"]
    assert ops["update initramfs (nouveau blacklisted)"].commands == ["update-initramfs -u", NOUVEAU_STAMP]
    # The driver changes: on a Slurm node, drained (the reboot's reason) and its jobs waited
    # for first, within half the step's deadline.
    settings = node().settings
    wait_s = min(settings.slurm_drain_wait_s, settings.step_timeout_s // 2)
    assert ops["Slurm: drain before the driver changes, wait for the node's jobs"].commands == [
        slurm_rules.drain_for_reboot(node().name, wait_s, held_back="driver not changed").strip()
    ]
    assert ops["nvidia-persistenced enabled"].commands == ["systemctl enable nvidia-persistenced.service"]


def test_sources_file_is_deb822_with_signed_by() -> None:
    assert nvidia.sources_text("http://repo.test/debian12/") == (
        "# Written by provision: NVIDIA CUDA repository (nvidia_repo_url).\n"
        "Types: deb\nURIs: http://repo.test/debian12/\nSuites: /\n"
        "Signed-By: /etc/apt/keyrings/cuda-archive-keyring.gpg\n"
    )
    ops = plan("ubuntu-24.04.3-noble", Gpus((H100,), ()))
    assert (
        "+URIs: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
        in ops["CUDA repository (deb822, Signed-By)"].diffs[0]
    )


def test_ubuntu_2404_secure_boot_uses_canonical_signed_server_packages() -> None:
    sb = probe(
        secure_boot=SecureBoot(True, "SecureBoot enabled"),
        candidates={"linux-modules-nvidia-580-server-open-6.8.0-45-generic": "580.95.05-1"},
    )
    ops = plan("ubuntu-24.04.3-noble", Gpus((H100, NVSWITCH), ()), probe=sb)
    assert ops["NVIDIA driver 580 (open modules, ubuntu-server)"].commands == [
        f"{INSTALL} --allow-change-held-packages nvidia-driver-580-server-open "
        "linux-modules-nvidia-580-server-open-6.8.0-45-generic"
    ]
    # Fabric manager from the same archive as the signed driver (Canonical keeps the branch
    # suffix), matched at run time to the installed driver's version.
    assert "fabric manager nvidia-fabricmanager-580=580.*" in ops
    # The toolkit exists only in NVIDIA's repository, so it is configured for it.
    assert "CUDA repository (deb822, Signed-By)" in ops
    assert ops["CUDA toolkit and extras"].commands == [f"{INSTALL} --no-install-recommends cuda-toolkit-12-8"]


def test_ubuntu_2204_pascal_host_gets_the_proprietary_branch_metapackage() -> None:
    ops = plan("ubuntu-22.04-jammy", Gpus((P100,), ()))
    assert ops["NVIDIA driver 580 (proprietary modules, cuda-repo)"].commands == [
        f"{INSTALL} --allow-change-held-packages cuda-drivers-580"
    ]
    assert (
        "upload (generated) -> /etc/apt/sources.list.d/cuda-ubuntu2204.sources"
        in ops["CUDA repository (deb822, Signed-By)"].commands
    )


def test_ubuntu_2204_secure_boot_pascal_host_gets_canonicals_signed_proprietary_modules() -> None:
    kernel = os_info("ubuntu-22.04-jammy").kernel
    sb = probe(
        secure_boot=SecureBoot(True, "SecureBoot enabled"),
        candidates={
            f"linux-modules-nvidia-580-server-{kernel}": "5.15.0-185.195+1",
            "nvidia-driver-580-server": "580.95.05-0ubuntu0.22.04.1",
        },
    )
    ops = plan("ubuntu-22.04-jammy", Gpus((P100, NVSWITCH), ()), probe=sb, nvidia_driver_version="580.95.05")
    # A bare version names no Canonical package (their revisions are not NVIDIA's "-1"): it
    # is apt's candidate when that is the same upstream version; fabric manager follows it.
    assert ops["NVIDIA driver 580 (proprietary modules, ubuntu-server)"].commands == [
        f"{INSTALL} --allow-change-held-packages nvidia-driver-580-server=580.95.05-0ubuntu0.22.04.1 "
        f"linux-modules-nvidia-580-server-{kernel}"
    ]
    assert "fabric manager nvidia-fabricmanager-580=580.95.05-*" in ops
    unpinned = plan("ubuntu-22.04-jammy", Gpus((P100,), ()), probe=sb)
    assert unpinned["NVIDIA driver 580 (proprietary modules, ubuntu-server)"].commands == [
        f"{INSTALL} --allow-change-held-packages nvidia-driver-580-server linux-modules-nvidia-580-server-{kernel}"
    ]
    exact = plan("ubuntu-22.04-jammy", Gpus((P100,), ()), probe=sb, nvidia_driver_version="580.95.05-0ubuntu0.22.04.1")
    assert exact["NVIDIA driver 580 (proprietary modules, ubuntu-server)"].commands == [
        f"{INSTALL} --allow-change-held-packages nvidia-driver-580-server=580.95.05-0ubuntu0.22.04.1 "
        f"linux-modules-nvidia-580-server-{kernel}"
    ]


def test_a_bare_version_canonical_does_not_offer_stops_the_host_before_any_change() -> None:
    # Installing the branch's newest instead would put this host on another driver than the
    # fleet, and its post-reboot check would fail it only after the reboot.
    kernel = os_info("ubuntu-22.04-jammy").kernel
    sb = probe(
        secure_boot=SecureBoot(True, "SecureBoot enabled"),
        candidates={
            f"linux-modules-nvidia-580-server-{kernel}": "5.15.0-185.195+1",
            "nvidia-driver-580-server": "580.105.08-0ubuntu0.22.04.1",
        },
    )
    fake = FakeHost(Os=os_info("ubuntu-22.04-jammy"), NvidiaDevices=Gpus((P100,), ()), Probe=sb)
    ops, refused = plan_with_facts(nvidia.step, node(nvidia_driver_version="580.95.05"), fake)
    (reason,) = refused
    assert reason.startswith("nvidia_driver_version 580.95.05: this host takes Canonical's signed driver")
    assert "apt offers nvidia-driver-580-server 580.105.08-0ubuntu0.22.04.1" in reason
    assert [o.name for o in ops] == ["NVIDIA stack | nvidia checks"]


def test_secure_boot_without_signed_modules_stops_the_host_with_the_advice() -> None:
    # Preflight leaves this to the nvidia step when apt had no lists yet.
    sb = probe(secure_boot=SecureBoot(True, "SecureBoot enabled"), candidates={})
    fake = FakeHost(Os=os_info("ubuntu-24.04.3-noble"), NvidiaDevices=Gpus((H100,), ()), Probe=sb)
    ops, _ = plan_with_facts(nvidia.step, node(), fake)
    (stop,) = ops
    assert stop.name == "NVIDIA stack | nvidia checks"
    assert "no signed NVIDIA modules exist for kernel 6.8.0-45-generic" in stop.commands[0]
    assert stop.commands[0].endswith("exit 1")


def test_ubuntu_secure_boot_without_toolkit_or_extras_needs_no_nvidia_repository() -> None:
    sb = probe(
        secure_boot=SecureBoot(True, "SecureBoot enabled"),
        candidates={"linux-modules-nvidia-580-server-open-6.8.0-45-generic": "580.95.05-1"},
    )
    ops = plan("ubuntu-24.04.3-noble", Gpus((H100,), ()), probe=sb, cuda_toolkit_version=None)
    assert "CUDA repository keyring" not in ops
    assert "CUDA toolkit and extras" not in ops


def test_debian_pascal_host_gets_proprietary_cuda_drivers_pinned_exactly() -> None:
    ops = plan("debian-12-bookworm", Gpus((P100,), ()), nvidia_driver_version="580.95.05", cuda_toolkit_version=None)
    assert ops["NVIDIA driver 580 (proprietary modules, cuda-repo)"].commands == [
        f"{INSTALL} --allow-change-held-packages cuda-drivers-580=580.95.05-1"
    ]
    assert "CUDA toolkit and extras" not in ops
    assert "nvidia-fabricmanager enabled" not in ops
    assert (
        "upload (generated) -> /etc/apt/sources.list.d/cuda-debian12.sources"
        in ops["CUDA repository (deb822, Signed-By)"].commands
    )


def test_host_without_gpu_in_auto_mode_is_skipped_with_a_note() -> None:
    assert plan("debian-12-bookworm", Gpus((), ())) == {}


def test_gpu_nodes_group_and_force_run_without_a_gpu() -> None:
    assert "NVIDIA driver 580 (open modules, cuda-repo)" in plan(
        "debian-12-bookworm", Gpus((), ()), groups=("gpu_nodes",)
    )
    assert plan("debian-12-bookworm", Gpus((), ()), nvidia="force") != {}
    assert nvidia_rules.applies(node(nvidia="skip")) == "nvidia: skip"


def test_holds_cover_the_branch_dependencies_not_yet_held() -> None:
    installed = {
        "nvidia-open-580": "580.95.05-1",
        "nvidia-open": "580.95.05-1",
        "libnvidia-compute-580": "580.95.05-1",
        "nvidia-fabricmanager": "580.95.05-1",
        "nvidia-container-toolkit": "1.17.8-1",
        "bash": "5.2",
    }
    names = nvidia_rules.hold_names(installed, {"nvidia-open"}, ["nvidia-open-580", "nvidia-fabricmanager"], "580")
    assert names == ["libnvidia-compute-580", "nvidia-fabricmanager", "nvidia-open-580"]


def test_fabricmanager_installs_the_driver_version_once_the_driver_is_there() -> None:
    holds = ({"nvidia-open-580": "580.95.05-1"}, set())
    fake = FakeHost(Os=os_info("ubuntu-22.04-jammy"), NvidiaDevices=Gpus((H100, NVSWITCH), ()), AptHolds=holds)
    ops = {o.name: o for o in plan_with_facts(nvidia.step, node(), fake)[0]}
    # apt resolves the glob to the newest 580.95.05 build (checked against real apt-get -s).
    assert ops["NVIDIA stack | fabric manager nvidia-fabricmanager=580.*"].commands == [
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --allow-change-held-packages "
        "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold 'nvidia-fabricmanager=580.95.05-*'"
    ]
    assert ops["NVIDIA stack | hold NVIDIA driver packages"].commands == ["apt-mark hold nvidia-open-580"]


def test_canonicals_fabricmanager_matches_the_driver_upstream_not_its_revision() -> None:
    # Canonical builds the -server driver and fabric manager from separate sources: their
    # revisions differ while the driver version (what fabric manager checks) is the same.
    signed = pkgs.signed_modules_package("580", True, os_info("ubuntu-22.04-jammy").kernel)
    sb = probe(secure_boot=SecureBoot(True, "SecureBoot enabled"), candidates={signed: "580.95.05-0ubuntu0.22.04.1"})
    driver = {"nvidia-driver-580-server-open": "580.95.05-0ubuntu0.22.04.3"}
    fresh = plan("ubuntu-22.04-jammy", Gpus((H100, NVSWITCH), ()), probe=sb, facts={"AptHolds": (driver, set())})
    assert (
        fresh["fabric manager nvidia-fabricmanager-580=580.*"]
        .commands[0]
        .endswith("'nvidia-fabricmanager-580=580.95.05-*'")
    )
    matched = {**driver, "nvidia-fabricmanager-580": "580.95.05-0ubuntu0.22.04.1"}
    done = plan("ubuntu-22.04-jammy", Gpus((H100, NVSWITCH), ()), probe=sb, facts={"AptHolds": (matched, set())})
    assert "fabric manager nvidia-fabricmanager-580=580.*" not in done
    # An exact driver version names the driver's revision, never fabric manager's.
    exact = plan(
        "ubuntu-22.04-jammy", Gpus((H100, NVSWITCH), ()), probe=sb, nvidia_driver_version="580.95.05-0ubuntu0.22.04.3"
    )
    assert (
        exact["fabric manager nvidia-fabricmanager-580=580.95.05-*"]
        .commands[0]
        .endswith("'nvidia-fabricmanager-580=580.95.05-*'")
    )
    stale = {**driver, "nvidia-fabricmanager-580": "580.82.07-0ubuntu0.22.04.1"}
    moved = plan("ubuntu-22.04-jammy", Gpus((H100, NVSWITCH), ()), probe=sb, facts={"AptHolds": (stale, set())})
    assert (
        moved["fabric manager nvidia-fabricmanager-580=580.*"]
        .commands[0]
        .endswith("'nvidia-fabricmanager-580=580.95.05-*'")
    )


def test_branch_570_uses_suffixed_fabricmanager() -> None:
    ops = plan("ubuntu-22.04-jammy", Gpus((H100, NVSWITCH), ()), nvidia_driver_branch="570")
    assert "fabric manager nvidia-fabricmanager-570=570.*" in ops


def test_nccl_is_pinned_to_the_toolkit_cuda_version_and_held() -> None:
    ops = plan("ubuntu-24.04.3-noble", Gpus((H100,), ()), install_nccl=True)
    assert ops["NCCL *+cuda12.8"].commands == [
        "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends --allow-change-held-packages "
        "-o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "
        "'libnccl2=*+cuda12.8' 'libnccl-dev=*+cuda12.8'"
    ]
    assert ops["CUDA toolkit and extras"].commands == [f"{INSTALL} --no-install-recommends cuda-toolkit-12-8"]
    exact = plan(
        "debian-12-bookworm", Gpus((H100,), ()), install_nccl=True, nccl_version="2.27.7-1", cuda_toolkit_version="12.9"
    )
    assert "NCCL 2.27.7-1+cuda12.9" in exact
    # Without the toolkit, NCCL alone still needs NVIDIA's repository.
    alone = plan(
        "ubuntu-24.04.3-noble",
        Gpus((H100,), ()),
        install_nccl=True,
        cuda_toolkit_version=None,
        nccl_version="2.27.7-1+cuda12.8",
        probe=probe(
            secure_boot=SecureBoot(True, "SecureBoot enabled"),
            candidates={"linux-modules-nvidia-580-server-open-6.8.0-45-generic": "580.95.05-1"},
        ),
    )
    assert "CUDA repository (deb822, Signed-By)" in alone
    assert "NCCL 2.27.7-1+cuda12.8" in alone


def test_installed_nccl_for_the_right_cuda_changes_nothing_and_is_held() -> None:
    installed = {"nvidia-open-580": "580.95.05-1", "libnccl2": "2.27.7-1+cuda12.8", "libnccl-dev": "2.27.7-1+cuda12.8"}
    fake = FakeHost(
        Os=os_info("ubuntu-22.04-jammy"), NvidiaDevices=Gpus((H100,), ()), Probe=probe(), AptHolds=(installed, set())
    )
    ops = {
        o.name.removeprefix("NVIDIA stack | "): o
        for o in plan_with_facts(nvidia.step, node(install_nccl=True), fake)[0]
    }
    assert "NCCL *+cuda12.8" not in ops
    assert ops["hold NVIDIA driver packages"].commands == ["apt-mark hold libnccl-dev libnccl2 nvidia-open-580"]
    # NCCL built for another CUDA is replaced, held or not.
    other = {**installed, "libnccl2": "2.28.3-1+cuda13.0"}
    fake = FakeHost(
        Os=os_info("ubuntu-22.04-jammy"), NvidiaDevices=Gpus((H100,), ()), Probe=probe(), AptHolds=(other, {"libnccl2"})
    )
    ops = {o.name: o for o in plan_with_facts(nvidia.step, node(install_nccl=True), fake)[0]}
    assert ops["NVIDIA stack | NCCL *+cuda12.8"].commands[0].endswith("--force-confold 'libnccl2=*+cuda12.8'")
    assert "--allow-change-held-packages" in ops["NVIDIA stack | NCCL *+cuda12.8"].commands[0]


def run_download(
    tmp_path: Path, sha256: str | None, fingerprint: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The keyring download's own commands, run by bash on a file:// URL."""
    src, dest = tmp_path / "served.gpg", tmp_path / "keyrings" / "cuda-archive-keyring.gpg"
    dest.parent.mkdir(exist_ok=True)
    commands = nvidia_ops.download_commands(src.as_uri(), str(dest), sha256, fingerprint)
    script = " && ".join(f"( {c} )" for c in commands)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_keyring_is_fetched_again_only_when_missing_or_its_sha256_differs() -> None:
    digest = "a" * 64
    ops = plan("debian-12-bookworm", Gpus((H100,), ()), nvidia_keyring_sha256=digest)
    assert any(digest in c for c in ops["CUDA repository keyring"].commands)
    assert not any(
        "sha256" in c for c in plan("debian-12-bookworm", Gpus((H100,), ()))["CUDA repository keyring"].commands
    )
    for facts, sha in (({"Sha256File": digest}, digest), ({"File": {"mode": 644}}, None)):
        fake = FakeHost(Os=os_info("debian-12-bookworm"), NvidiaDevices=Gpus((H100,), ()), Probe=probe(), **facts)
        names = [o.name for o in plan_with_facts(nvidia.step, node(nvidia_keyring_sha256=sha), fake)[0]]
        assert "NVIDIA stack | CUDA repository keyring" not in names


# The Probe's headers and kernel lines on an Ubuntu 22.04 GA image that has the HWE kernel
# installed and pending, and an older GA kernel whose headers left the archive (composed
# with Ubuntu's names and versions; no Ubuntu apt was at hand to capture them).
UBUNTU_KERNELS = [
    "headers=5.15.0-185.195",
    "kernel:5.15.0-91-generic=",
    "kernel:5.15.0-185-generic=5.15.0-185.195",
    "kernel:6.8.0-60-generic=6.8.0-60.63~22.04.1",
]
# The same lines on Debian 12, each candidate as apt-cache policy answered on a Debian 12
# machine with bookworm, -updates and -security lists (2026-11-30): 6.1.0-18's headers are
# gone from the archive, 6.1.0-47 runs, 6.1.0-50 is installed and pending.
DEBIAN_KERNELS = [
    "headers=6.1.170-3",
    "kernel:6.1.0-18-amd64=",
    "kernel:6.1.0-47-amd64=6.1.170-3",
    "kernel:6.1.0-50-amd64=6.1.176-1",
]


def test_ubuntu_2204_gets_headers_for_the_pending_hwe_kernel_too(notes: list[str]) -> None:
    ops = plan("ubuntu-22.04-jammy", Gpus((H100,), ()), probe=parse_probe(UBUNTU_KERNELS))
    assert ops["kernel headers for 5.15.0-185-generic, 6.8.0-60-generic"].commands == [
        f"{INSTALL} --no-install-recommends linux-headers-5.15.0-185-generic linux-headers-6.8.0-60-generic"
    ]
    # Asking for it would make apt refuse the whole install.
    assert notes == [
        "nvidia: no linux-headers-5.15.0-91-generic in the apt sources: no driver module for "
        "kernel 5.15.0-91-generic (neither running nor newest)"
    ]


def test_debian_12_gets_headers_for_the_pending_kernel_too(notes: list[str]) -> None:
    running = replace(os_info("debian-12-bookworm"), kernel="6.1.0-47-amd64")
    ops = plan("debian-12-bookworm", Gpus((H100,), ()), probe=parse_probe(DEBIAN_KERNELS), facts={"Os": running})
    assert ops["kernel headers for 6.1.0-47-amd64, 6.1.0-50-amd64"].commands == [
        f"{INSTALL} --no-install-recommends linux-headers-6.1.0-47-amd64 linux-headers-6.1.0-50-amd64"
    ]
    assert notes == [
        "nvidia: no linux-headers-6.1.0-18-amd64 in the apt sources: no driver module for "
        "kernel 6.1.0-18-amd64 (neither running nor newest)"
    ]
    off = plan(
        "debian-12-bookworm",
        Gpus((H100,), ()),
        probe=parse_probe(DEBIAN_KERNELS),
        facts={"Os": running},
        nvidia_kernel_headers=False,
    )
    assert not any(name.startswith("kernel headers") for name in off)


def test_headers_of_the_running_and_newest_kernel_are_asked_for_even_without_a_candidate() -> None:
    choice = pkgs.kernel_headers(
        "6.1.0-47-amd64", None, {"6.1.0-47-amd64": None, "6.1.0-50-amd64": None, "6.1.0-18-amd64": None}
    )
    # apt then fails the install, and the host, naming the package (preflight says it first).
    assert choice.install == ["linux-headers-6.1.0-47-amd64", "linux-headers-6.1.0-50-amd64"]
    assert choice.missing == ["6.1.0-47-amd64", "6.1.0-50-amd64"]
    assert choice.skipped == ["6.1.0-18-amd64"]


def rendered(template: str) -> str:
    return get_template(str(templates_dir() / "nvidia" / template)).render()


class SetUpHost(FakeHost):
    """A host an earlier run of the nvidia step finished on: its files hold what the step
    writes, its packages are installed and held, its daemons run on the loaded driver."""

    def __init__(self, **facts: Any):
        os = os_info("ubuntu-22.04-jammy")
        url = nvidia.sources_text("https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/")
        texts = {
            nvidia.sources_file(os): url,
            nvidia.PIN_FILE: pkgs.apt_pin_preferences("580"),
            nvidia.NOUVEAU_FILE: rendered("blacklist-nouveau.conf.j2"),
            nvidia.PERSISTENCED_DROPIN: rendered("persistenced-override.conf.j2"),
        }
        self.sha1s = {path: hashlib.sha1(text.encode()).hexdigest() for path, text in texts.items()}
        driver = {"nvidia-open-580": "580.95.05-1", "nvidia-fabricmanager": "580.95.05-1"}
        units = {"nvidia-persistenced.service": True, "nvidia-fabricmanager.service": True}
        super().__init__(
            **{
                "Os": os,
                "NvidiaDevices": Gpus((H100, NVSWITCH), ()),
                "Probe": probe(candidates={"nvidia-open-580": "580.95.05-1"}),
                "DebPackages": {
                    n: ["1"]
                    for n in (
                        "curl",
                        "ca-certificates",
                        "linux-headers-5.15.0-185-generic",
                        "nvidia-open-580",
                        "cuda-toolkit-12-8",
                    )
                },
                "Directory": {"mode": 755},
                "File": {"mode": 644},
                "AptHolds": (driver, set(driver)),
                "RebootProbe": parse_reboot_state(["loaded=580.95.05", "installed=580.95.05"]),
                "SystemdStatus": units,
                "SystemdEnabled": units,
                **facts,
            }
        )

        # Its follow-ups ran for these files (update-initramfs after the blacklist).
        self.stamps = {
            "initramfs-nouveau": stamps.digest([BLACKLIST.read_text()]),
            "nvidia-persistenced-dropin": stamps.digest([PERSISTENCED_DROPIN.read_text()]),
        }

    def __call__(self, cls: type, kwargs: dict[str, Any]) -> Any:
        if cls.__name__ == "Sha1File":
            return self.sha1s.get(kwargs["path"])
        if cls.__name__ == "Stamp":
            return self.stamps.get(kwargs["stamp"])
        return super().__call__(cls, kwargs)


BLACKLIST = templates_dir() / "nvidia" / "blacklist-nouveau.conf.j2"
PERSISTENCED_DROPIN = templates_dir() / "nvidia" / "persistenced-override.conf.j2"
NOUVEAU_STAMP = stamps.stamp_command("initramfs-nouveau", stamps.digest([BLACKLIST.read_text()]))


@pytest.mark.parametrize("stamp", [None, "an older blacklist's digest"], ids=["missing", "stale"])
def test_initramfs_is_updated_when_the_blacklist_is_in_place_but_its_stamp_is_not_current(stamp) -> None:
    # An `up` killed after writing the blacklist and before update-initramfs: the file is
    # right, so only the stamp says the initramfs still has nouveau in it.
    host = SetUpHost()
    host.stamps["initramfs-nouveau"] = stamp
    ops = {o.name: o for o in plan_with_facts(nvidia.step, node(), host)[0]}
    # (A plan also lists the daemon-reload guarded by _if once anything before it changes.)
    assert "NVIDIA stack | blacklist nouveau" not in ops, "the file itself is right"
    assert ops["NVIDIA stack | update initramfs (nouveau blacklisted)"].commands == [
        "update-initramfs -u",
        NOUVEAU_STAMP,
    ]


def test_rerun_changes_nothing_but_updates_apt_when_the_driver_has_no_candidate() -> None:
    assert plan_with_facts(nvidia.step, node(), SetUpHost())[0] == []
    # A first run that died after writing the repository files but before apt update read
    # them: nothing differs on disk, and only the missing candidate tells.
    stale = {o.name: o for o in plan_with_facts(nvidia.step, node(), SetUpHost(Probe=probe()))[0]}
    assert stale["NVIDIA stack | apt update (CUDA repository not read yet)"].commands == ["apt-get update"]
    # The driver is installed at its pin: no drain, whatever else runs.
    assert not [name for name in stale if "drain" in name], list(stale)


# NVIDIA's cuda-keyring package's list file (its documented content).
CUDA_KEYRING_LIST = [
    "##PYINFRA_FILE /etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list",
    "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
    "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/ /",
    "",
]


def source_files(*extra: str) -> dict[str, Any]:
    captured = (FIXTURES / "apt-sources_dev-vm-debian12.txt").read_text().splitlines()
    return {"AptSourceFiles": parse_source_files(captured + list(extra)), "File": {"mode": 644}}


def test_nvidias_own_list_for_the_repository_is_removed_before_ours_is_written(notes: list[str]) -> None:
    ours = [
        "##PYINFRA_FILE /etc/apt/sources.list.d/cuda-ubuntu2204.sources",
        *nvidia.sources_text(
            "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/"
        ).splitlines(),
    ]
    ops = plan("ubuntu-22.04-jammy", Gpus((H100,), ()), facts=source_files(*CUDA_KEYRING_LIST, *ours))
    remove = "remove /etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list (same CUDA repository, other Signed-By)"
    assert ops[remove].commands == ["rm -f /etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"]
    assert list(ops).index(remove) < list(ops).index("CUDA repository (deb822, Signed-By)")
    assert notes == [
        "nvidia: removes /etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list: it names NVIDIA's "
        "CUDA repository, which the nvidia step now configures in "
        "/etc/apt/sources.list.d/cuda-ubuntu2204.sources"
    ]
    # The URI without its trailing slash is the same repository to apt.
    bare = [line.replace("x86_64/ /", "x86_64 /") for line in CUDA_KEYRING_LIST]
    assert remove in plan("ubuntu-22.04-jammy", Gpus((H100,), ()), facts=source_files(*bare))


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/etc/apt/sources.list", []),
        ("/etc/apt/sources.list.d/mixed.list", ["deb http://archive.ubuntu.com/ubuntu jammy main"]),
    ],
)
def test_a_file_that_also_names_other_sources_stops_the_host_unedited(path: str, extra: list[str]) -> None:
    lines = [f"##PYINFRA_FILE {path}", CUDA_KEYRING_LIST[1], *extra]
    fake = FakeHost(Os=os_info("ubuntu-22.04-jammy"), NvidiaDevices=Gpus((H100,), ()), **source_files(*lines))
    ops, refusals = plan_with_facts(nvidia.step, node(), fake)
    assert refusals == [
        f"{path} names NVIDIA's CUDA repository (deb https://developer.download.nvidia.com/compute/cuda/repos/"
        "ubuntu2204/x86_64/ /), which the nvidia step configures in /etc/apt/sources.list.d/cuda-ubuntu2204.sources "
        f"with another Signed-By key, and apt refuses both: remove that entry from {path} and re-run"
    ]
    assert [o.name for o in ops] == ["NVIDIA stack | nvidia checks"]


def test_daemons_start_only_when_the_kernel_runs_the_installed_driver() -> None:
    start = parse_reboot_state(["loaded=580.95.05", "installed=580.95.05"])
    ops = plan("ubuntu-22.04-jammy", Gpus((H100, NVSWITCH), ()), facts={"RebootProbe": start})
    for unit in ("nvidia-fabricmanager", "nvidia-persistenced"):
        assert ops[f"{unit} enabled"].commands == [
            f"systemctl start {unit}.service",
            f"systemctl enable {unit}.service",
        ]
    # Not loaded yet, or an older module loaded: the reboot that follows starts them.
    for lines in (["installed=580.95.05"], ["loaded=580.82.07", "installed=580.95.05"]):
        ops = plan("ubuntu-22.04-jammy", Gpus((H100, NVSWITCH), ()), facts={"RebootProbe": parse_reboot_state(lines)})
        assert ops["nvidia-fabricmanager enabled"].commands == ["systemctl enable nvidia-fabricmanager.service"]


def test_persistenced_is_restarted_if_running_when_its_drop_in_changed_in_this_run_or_a_stopped_one() -> None:
    """The drop-in's persistence mode takes effect now, not at the next reboot; after a run
    killed between the drop-in and its restart too (the stamp is not this drop-in's)."""
    host = SetUpHost()
    host.stamps["nvidia-persistenced-dropin"] = None
    ops = {o.name: o for o in plan_with_facts(nvidia.step, node(), host)[0]}
    assert "NVIDIA stack | nvidia-persistenced: persistence mode on" not in ops, "the file itself is right"
    assert ops["NVIDIA stack | systemd daemon-reload (persistenced drop-in)"].commands == [
        "systemctl daemon-reload",
        nvidia.PERSISTENCED_RESTART,
        stamps.stamp_command("nvidia-persistenced-dropin", stamps.digest([PERSISTENCED_DROPIN.read_text()])),
    ]


def test_the_keyring_is_checked_against_nvidias_published_fingerprint_by_default_before_it_is_moved() -> None:
    ops = plan("debian-12-bookworm", Gpus((H100,), ()))
    commands = ops["CUDA repository keyring"].commands
    (check,) = [i for i, c in enumerate(commands) if c.startswith("python3 -c ")]
    assert " EB693B3035CD5710E231E123A4B469963BF863CC || { rm -f " in commands[check]
    assert commands[check + 1].startswith("chmod 644 /etc/apt/keyrings/cuda-archive-keyring.gpg.provision-new && mv")
    unchecked = plan("debian-12-bookworm", Gpus((H100,), ()), nvidia_key_fingerprint=None)
    assert not any(c.startswith("python3") for c in unchecked["CUDA repository keyring"].commands)


def test_keyring_fingerprints_refuse_what_is_not_a_binary_keyring() -> None:
    from provision.rules.nvidia import keyring_fingerprints

    for bad in (b"-----BEGIN PGP PUBLIC KEY BLOCK-----", b"\x99\x01\x0d\x04", b"\x01"):
        with pytest.raises(ValueError, match="packet"):
            keyring_fingerprints(bad)
    assert keyring_fingerprints(b"") == []
