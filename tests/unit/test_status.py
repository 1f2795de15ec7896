"""Drift rules of `provision status`, on plain values."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from provision import inventory
from provision.facts.stack import InstalledStack, MountState, parse_stack, stack_command
from provision.status.judge import judge_host


def cluster(tmp_path: Path, **data):
    inv = tmp_path / "inv.py"
    inv.write_text(
        f"nodes = [('n1', {{'ssh_hostname': '192.0.2.1', **{data!r}}}), ('n2', {{'ssh_hostname': '192.0.2.2'}})]\n"
        "storage = ['n2']\n"
    )
    return inventory.load(inv)


def judge(c, stack):
    return judge_host(c.node("n1"), c, stack, "Debian 12", "6.1.0", now=1_000_000)


NFS_OK = tuple(MountState(f"/shared/{n}", True, True, "nfs4") for n in ("datasets", "checkpoints", "scratch"))
GOOD_VENV = {"torch": "2.13.0+cpu", "numpy": "2.2.6", "nvidia-ml-py": "13.580.126"}  # the default pins


def test_matching_host_has_no_drift(tmp_path):
    status = judge(cluster(tmp_path), InstalledStack(venv=GOOD_VENV, mounts=NFS_OK))
    assert status.drift == []
    assert not status.reboot_pending


def test_torch_version_drift_names_both_versions(tmp_path):
    status = judge(cluster(tmp_path), InstalledStack(venv={**GOOD_VENV, "torch": "2.12.1"}, mounts=NFS_OK))
    (d,) = status.drift
    assert (d.item, d.expected, d.actual) == ("torch", "2.13.0", "2.12.1")


def test_driver_of_another_branch_is_drift(tmp_path):
    c = cluster(tmp_path, nvidia="force", cuda_toolkit_version=None)
    stack = InstalledStack(
        packages={"nvidia-driver-570-open": "570.172.08-0ubuntu1"},
        loaded_driver="570.172.08",
        venv=GOOD_VENV,
        mounts=NFS_OK,
    )
    (d,) = judge(c, stack).drift
    assert d.item == "nvidia driver"
    assert d.expected == "580.*"
    assert d.actual == "570.172.08"


def test_loaded_module_older_than_installed_driver_means_reboot_pending(tmp_path):
    c = cluster(tmp_path, nvidia="force", cuda_toolkit_version=None)
    stack = InstalledStack(
        packages={"nvidia-driver-580-open": "580.95.05-1"}, loaded_driver="580.82.07", venv=GOOD_VENV, mounts=NFS_OK
    )
    status = judge(c, stack)
    assert status.reboot_pending
    assert [(d.item, d.actual) for d in status.drift] == [("loaded nvidia module", "580.82.07")]


def test_fabric_manager_must_match_the_driver_on_nvswitch_systems(tmp_path):
    c = cluster(tmp_path, nvidia="force", cuda_toolkit_version=None)
    stack = InstalledStack(
        packages={"nvidia-driver-580-open": "580.95.05-1", "nvidia-fabricmanager-580": "580.82.07-1"},
        loaded_driver="580.95.05",
        nvswitches=4,
        venv=GOOD_VENV,
        mounts=NFS_OK,
    )
    (d,) = judge(c, stack).drift
    assert (d.item, d.expected, d.actual) == ("fabric manager", "580.95.05", "580.82.07")


def test_nfs_share_not_answering_is_drift(tmp_path):
    mounts = (MountState("/shared/datasets", True, False, "nfs4"), *NFS_OK[1:])
    (d,) = judge(cluster(tmp_path), InstalledStack(venv=GOOD_VENV, mounts=mounts)).drift
    assert (d.item, d.actual) == ("mount /shared/datasets", "not answering")


def test_storage_node_checks_its_data_volume_not_nfs_clients(tmp_path):
    c = cluster(tmp_path, data_disks="auto")
    status = judge_host(c.node("n2"), c, InstalledStack(venv=GOOD_VENV, nfs_server="active"), "Debian 12", "6.1")
    assert status.mounts == {"nfs-server": "ok"}  # no data_disks; it serves NFS rather than mounting it
    assert status.drift == []
    status = judge(c, InstalledStack(venv=GOOD_VENV, mounts=NFS_OK))
    assert status.mounts["/data"] == "not mounted"


def test_backup_age_from_the_service_exit_time(tmp_path):
    status = judge(
        cluster(tmp_path),
        InstalledStack(venv=GOOD_VENV, mounts=NFS_OK, backup_result="success", backup_finished_epoch=1_000_000 - 7200),
    )
    assert status.last_backup == "2h ago (success)"


def test_last_backup_survives_a_reboot_and_a_later_failure_is_said(tmp_path):
    # After a reboot systemd has no Result or timestamp; the script's stamp still has the time.
    rebooted = judge(
        cluster(tmp_path), InstalledStack(venv=GOOD_VENV, mounts=NFS_OK, backup_success_epoch=1_000_000 - 3 * 3600)
    )
    assert rebooted.last_backup == "3h ago (success)"
    assert rebooted.last_backup_age_s == 3 * 3600
    failed = judge(
        cluster(tmp_path),
        InstalledStack(
            venv=GOOD_VENV,
            mounts=NFS_OK,
            backup_result="exit-code",
            backup_finished_epoch=1_000_000 - 60,
            backup_success_epoch=1_000_000 - 86400,
        ),
    )
    assert failed.last_backup == "1d ago (last run: failed)"
    never = judge(
        cluster(tmp_path),
        InstalledStack(venv=GOOD_VENV, mounts=NFS_OK, backup_result="exit-code", backup_finished_epoch=1_000_000 - 60),
    )
    assert never.last_backup == "never succeeded (last run: failed)"
    assert never.last_backup_age_s is None


def test_stack_parser_reads_packages_venv_mounts_and_backup():
    lines = [
        "loaded_driver=580.95.05",
        "nvidia_gpus=8",
        "nvswitches=4",
        "pkg nvidia-driver-580-open 580.95.05-0ubuntu1 ii ",
        "pkg cuda-toolkit-12-8 12.8.1-1 rc ",
        'venv={"torch": "2.13.0+cu128", "nccl": "2.27.3"}',
        "reboot_required=no",
        "mount /data yes yes xfs",
        "mount /shared/datasets no no -",
        "backup_result=success",
        "backup_finished=1700000000",
        "backup_success=1699999000",
    ]
    stack = parse_stack(lines)
    assert stack.packages == {"nvidia-driver-580-open": "580.95.05-0ubuntu1"}  # rc = removed
    assert stack.loaded_driver == "580.95.05"
    assert stack.nvswitches == 4
    assert stack.nvidia_gpus == 8
    assert stack.venv["nccl"] == "2.27.3"
    assert stack.mounts[0] == MountState("/data", True, True, "xfs")
    assert stack.mounts[1] == MountState("/shared/datasets", False, False, None)
    assert stack.backup_finished_epoch == 1700000000
    assert stack.backup_success_epoch == 1699999000


def test_stack_command_quotes_paths():
    command = stack_command("/opt/my venv", ["/data", "/shared/x y"])
    assert "'/opt/my venv/bin/python'" in command
    assert "'/shared/x y'" in command


def test_held_driver_package_is_still_installed():
    stack = parse_stack(["pkg nvidia-driver-580-open 580.95.05-0ubuntu1 hi "])
    assert stack.packages == {"nvidia-driver-580-open": "580.95.05-0ubuntu1"}


def test_last_validate_verdict_and_age_come_from_validates_history(tmp_path, monkeypatch):
    from provision.status.gather import last_validate
    from provision.validate import history
    from provision.validate.records import NodeResult

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert last_validate("node1", 0.0) is None  # never validated
    history.append([NodeResult("node1", "pass", [])], "2026-11-30T03:00:00+00:00", "quick")
    history.append([NodeResult("node1", "warn", [])], "2026-11-30T03:51:06+00:00", "quick")
    now = datetime.fromisoformat("2026-11-30T04:01:06+00:00").timestamp()
    assert last_validate("node1", now) == "warn, 10m ago"
    assert last_validate("node2", now) is None
    assert last_validate("odd name", now) is None  # a name validate never records under


def test_a_stopped_nfs_server_on_the_storage_node_is_drift(tmp_path):
    c = cluster(tmp_path)
    status = judge_host(c.node("n2"), c, InstalledStack(venv=GOOD_VENV, nfs_server="inactive"), "Debian 12", "6.1")
    assert status.mounts == {"nfs-server": "inactive"}
    assert [(d.item, d.expected, d.actual) for d in status.drift] == [("nfs-server", "active", "inactive")]
    assert parse_stack(["nfs_server=failed"]).nfs_server == "failed"


def test_a_pinned_nvidia_ml_py_that_differs_is_drift(tmp_path):
    c = cluster(tmp_path, nvml_version="13.580.82")
    venv = {**GOOD_VENV, "nvidia-ml-py": "13.615.71"}
    (d,) = judge(c, InstalledStack(venv=venv, mounts=NFS_OK)).drift
    assert (d.item, d.expected, d.actual) == ("nvidia-ml-py", "13.580.82", "13.615.71")
    assert judge(c, InstalledStack(venv={**venv, "nvidia-ml-py": "13.580.82"}, mounts=NFS_OK)).drift == []
