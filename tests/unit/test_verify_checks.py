"""The verify suite's checks against a test double of a testinfra host: they pass on the
state the nvidia stand-ins leave (tests/standins/nvidia_repo) and fail on a broken host.

The double answers only the commands it was given, so a check that starts running some
other command fails here instead of passing by accident.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest

from provision.deploys import nvidia
from provision.facts.gpus import NvidiaDevices
from provision.facts.probes import AptHolds
from provision.rules.packages import apt_pin_preferences
from provision.settings import Settings
from provision.verify import test_base as base_checks
from provision.verify import test_nvidia as nvidia_checks

# NvidiaDevices' output on a host with an NVSwitch: sysfs, then lspci's name, then no NVML.
HGX_NVSWITCH = (
    "0000:05:00.0 0x10de 0x22a3 0x068000\n--- lspci ---\n"
    "0000:05:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)\n"
    "--- nvml ---\n"
)
NO_NVIDIA_DEVICE = "--- lspci ---\n--- nvml ---\n"
STANDIN_DRIVER = [
    "nvidia-open-580",
    "nvidia-open",
    "nvidia-driver-cuda",
    "libnvidia-compute",
    "nvidia-kernel-open-dkms",
    "nvidia-persistenced",
    "nvidia-fabricmanager",
]


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str = ""


@dataclass
class StandInHost:
    """A testinfra host double: command -> (rc, stdout); files by path; installed packages."""

    commands: dict[str, tuple[int, str]]
    files: dict[str, str] = field(default_factory=dict)
    name: str = "node1"

    def run(self, command: str) -> Result:
        rc, out = self.commands[command]
        return Result(rc, out)

    def check_output(self, command: str) -> str:
        result = self.run(command)
        assert result.rc == 0, command
        return result.stdout.rstrip("\n")

    def file(self, path: str) -> File:
        content = self.files.get(path)
        return File("", exists=False) if content is None else File(content)

    @property
    def backend(self) -> Any:
        return type("Backend", (), {"get_hostname": lambda _: self.name})()


@dataclass
class File:
    content_string: str
    exists: bool = True

    def contains(self, pattern: str) -> bool:
        return pattern.lstrip("^") in self.content_string


def dpkg(held: list[str], unheld: list[str], version: str = "580.95.05-1") -> str:
    lines = [f"pkg {n} {version} hi " for n in held] + [f"pkg {n} {version} ii " for n in unheld]
    lines += ["pkg curl 7.88.1-10 ii "] + [f"hold {n}" for n in held]
    return "\n".join(lines) + "\n"


def standin_host(
    held: list[str] | None = None,
    unheld: tuple[str, ...] = (),
    fm_active: str = "active",
    fm_version: str = "580.95.05-1",
    pci: str = NO_NVIDIA_DEVICE,
) -> StandInHost:
    """The state the stand-in e2e leaves after `up --only nvidia` and its reboot."""
    held = STANDIN_DRIVER if held is None else held
    packages = dpkg([n for n in held if n != "nvidia-fabricmanager"], list(unheld))
    if "nvidia-fabricmanager" in held:
        packages += f"pkg nvidia-fabricmanager {fm_version} hi \nhold nvidia-fabricmanager\n"
    return StandInHost(
        {
            AptHolds().command(): (0, packages),
            "uname -r": (0, "6.1.0-41-amd64\n"),
            NvidiaDevices().command(): (0, pci),
            "nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1": (0, "580.95.05\n"),
            "systemctl is-enabled nvidia-fabricmanager": (0, "enabled\n"),
            "systemctl is-active nvidia-fabricmanager": (0 if fm_active == "active" else 3, fm_active + "\n"),
            "systemctl is-enabled nvidia-persistenced": (0, "enabled\n"),
            "systemctl is-active nvidia-persistenced": (0, "active\n"),
            "cat /proc/modules": (0, "nvidia 12345 0 - Live 0x0\nvirtio_net 61440 0 - Live 0x0\n"),
            "ls /etc/apt/sources.list.d/cuda-*.sources": (0, "/etc/apt/sources.list.d/cuda-debian12.sources\n"),
        },
        {
            nvidia.PIN_FILE: apt_pin_preferences("580"),
            nvidia.PERSISTENCED_DROPIN: "[Service]\nExecStart=\nExecStart=/usr/bin/nvidia-persistenced "
            "--persistence-mode\n",
        },
    )


def settings(**changes: Any) -> dict[str, Any]:
    return dataclasses.asdict(Settings(nvidia="force", **changes))


def test_standin_state_passes_the_nvidia_checks() -> None:
    host = standin_host()
    nvidia_checks.test_every_driver_package_of_the_branch_is_held(host, settings())
    nvidia_checks.test_apt_pin_keeps_driver_packages_on_the_branch(host, settings())
    nvidia_checks.test_nouveau_is_not_loaded(host)
    nvidia_checks.test_persistence_daemon_runs_in_persistence_mode(host)
    nvidia_checks.test_fabric_manager_is_held_running_and_matches_the_driver(host, settings(fabric_manager="force"))


def test_one_unheld_library_of_the_branch_fails_the_hold_check() -> None:
    host = standin_host(held=[n for n in STANDIN_DRIVER if n != "libnvidia-compute"], unheld=("libnvidia-compute",))
    with pytest.raises(AssertionError, match="libnvidia-compute"):
        nvidia_checks.test_every_driver_package_of_the_branch_is_held(host, settings())


def test_no_driver_installed_fails_the_hold_check() -> None:
    with pytest.raises(AssertionError, match="no driver package"):
        nvidia_checks.test_every_driver_package_of_the_branch_is_held(standin_host(held=[]), settings())


def test_an_edited_pin_fails() -> None:
    host = standin_host()
    host.files[nvidia.PIN_FILE] = apt_pin_preferences("590")
    with pytest.raises(AssertionError):
        nvidia_checks.test_apt_pin_keeps_driver_packages_on_the_branch(host, settings())


def test_loaded_nouveau_fails() -> None:
    host = standin_host()
    host.commands["cat /proc/modules"] = (0, "nouveau 2220032 0 - Live 0x0\n")
    with pytest.raises(AssertionError):
        nvidia_checks.test_nouveau_is_not_loaded(host)


def test_enabled_but_stopped_persistence_daemon_fails() -> None:
    host = standin_host()
    host.commands["systemctl is-active nvidia-persistenced"] = (3, "inactive\n")
    with pytest.raises(AssertionError):
        nvidia_checks.test_persistence_daemon_runs_in_persistence_mode(host)


@pytest.mark.parametrize(
    "broken",
    [
        {"held": [n for n in STANDIN_DRIVER if n != "nvidia-fabricmanager"]},  # NVSwitch host, none installed
        {"fm_active": "failed"},
        {"fm_version": "580.82.07-1"},
    ],
)
def test_nvswitch_host_without_a_working_matching_fabric_manager_fails(broken: dict[str, Any]) -> None:
    host = standin_host(pci=HGX_NVSWITCH, **broken)
    with pytest.raises(AssertionError):
        nvidia_checks.test_fabric_manager_is_held_running_and_matches_the_driver(host, settings())


def test_unheld_fabric_manager_fails() -> None:
    host = standin_host()
    host.commands[AptHolds().command()] = (
        0,
        host.commands[AptHolds().command()][1].replace("hold nvidia-fabricmanager\n", ""),
    )
    with pytest.raises(AssertionError, match="not held"):
        nvidia_checks.test_fabric_manager_is_held_running_and_matches_the_driver(host, settings(fabric_manager="force"))


def test_fabric_manager_check_skips_without_nvswitch_on_auto() -> None:
    with pytest.raises(pytest.skip.Exception):
        nvidia_checks.test_fabric_manager_is_held_running_and_matches_the_driver(standin_host(), settings())


NODES = {"node1": "10.77.0.11", "node2": "10.77.0.12"}


def resolver_host(answers: dict[str, str]) -> StandInHost:
    return StandInHost({f"getent hosts {n}": (0, f"{a}       {n}\n") for n, a in answers.items()})


def test_every_node_resolving_to_its_cluster_address_passes() -> None:
    base_checks.test_every_node_resolves_to_its_cluster_address(resolver_host(NODES), {"all_nodes": NODES})


def test_own_name_resolving_to_loopback_fails() -> None:
    # The Debian installer's "127.0.1.1 node1" line comes before the block base appends.
    host = resolver_host(NODES | {"node1": "127.0.1.1"})
    with pytest.raises(AssertionError, match="node1 resolves to"):
        base_checks.test_every_node_resolves_to_its_cluster_address(host, {"all_nodes": NODES})


SSH = "timeout 60 runuser -u train -- ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=10 {} true"


def test_training_user_ssh_is_tried_to_every_other_node_only() -> None:
    host = StandInHost({SSH.format("10.77.0.12"): (0, "")})  # no entry for node1 itself
    base_checks.test_training_user_reaches_every_other_node_by_ssh(host, settings(), {"all_nodes": NODES})
    host.commands[SSH.format("10.77.0.12")] = (255, "")
    host.commands["ssh-keygen -lf /home/train/.ssh/id_ed25519"] = (0, "256 SHA256:abc train@provision (ED25519)\n")
    with pytest.raises(AssertionError, match=r"cannot reach node2 .*offered: 256 SHA256:abc"):
        base_checks.test_training_user_reaches_every_other_node_by_ssh(host, settings(), {"all_nodes": NODES})


def test_training_user_ssh_check_skips_on_one_node() -> None:
    with pytest.raises(pytest.skip.Exception):
        base_checks.test_training_user_reaches_every_other_node_by_ssh(
            StandInHost({}), settings(), {"all_nodes": {"node1": "10.77.0.11"}}
        )


def test_the_spec_gives_clients_the_export_root_of_the_server_they_mount(tmp_path) -> None:
    # A client whose data volume is elsewhere mounts the server's tree (deploys/nfs), so
    # verify compares its fstab with the server's nfs_export_root, not its own.
    from provision import inventory, verify

    inv = tmp_path / "inv.py"
    inv.write_text(
        "storage = [('s1', {'ssh_hostname': '192.0.2.1', 'cluster_address': '10.0.0.1',\n"
        "                   'cluster_cidr': '10.0.0.0/24'})]\n"
        "nodes = [('c1', {'ssh_hostname': '192.0.2.2', 'cluster_address': '10.0.0.2', 'data_mount': '/scratch'})]\n"
    )
    spec = verify.spec(inventory.load(inv))
    assert spec["c1"]["settings"]["nfs_export_root"] == "/scratch/shared"  # its own, unused
    assert spec["c1"]["storage_export_root"] == "/data/shared"
