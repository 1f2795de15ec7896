"""Preflight: parsers of the probe, the pure verdict, and the deploy on captured facts."""

from __future__ import annotations

from dataclasses import replace

from provision.deploys import preflight
from provision.facts.blockdevices import BlockDevice
from provision.facts.gpus import Gpus
from provision.facts.probes import parse_apt_candidate, parse_probe, parse_sb_state
from provision.settings import Settings
from tests.helpers.deploy_facts import FIXTURES, H100, P100, FakeHost, node, os_info, plan_with_facts, probe

NO_GPU = Gpus((), ())


def disk(name: str, serial: str, mountpoints: tuple[str, ...] = ()) -> BlockDevice:
    return BlockDevice(
        name,
        f"/dev/{name}",
        "disk",
        10 << 30,
        serial,
        None,
        None,
        None,
        None,
        None,
        mountpoints,
        (),
        (f"/dev/disk/by-id/virtio-{serial}",),
    )


def test_secure_boot_state_from_captured_mokutil_output() -> None:
    on = parse_sb_state((FIXTURES / "mokutil-sb-state_enabled_arch-qemu-vm.txt").read_text(), efi=True)
    off = parse_sb_state((FIXTURES / "mokutil-sb-state_disabled-setup-mode_laptop.txt").read_text(), efi=True)
    assert on.enabled is True
    assert off.enabled is False
    assert parse_sb_state("sh: 1: mokutil: not found", efi=False).enabled is False
    assert parse_sb_state("sh: 1: mokutil: not found", efi=True, efivar=" 0").enabled is False
    assert parse_sb_state("sh: 1: mokutil: not found", efi=True).enabled is True  # unknown: assume on


def test_probe_lines_parse_into_a_typed_record() -> None:
    lines = [
        "root_free_kb=52428800",
        "efi=0",
        "sb=EFI variables are not supported on this system",
        "sbvar=",
        "locks= /var/lib/dpkg/lock-frontend",
        "holders=unattended-upgr ",
        "reboot_pending=1",
        "machine_id=0123abcd",
        "headers=6.1.76-1",
        "pkg:linux-modules-nvidia-580-server-open-6.8.0-45-generic=(none)",
        "kernel:6.1.0-18-amd64=",
        "kernel:6.1.0-47-amd64=6.1.170-3",
        "apt_lists=4",
    ]
    p = parse_probe(lines)
    assert p.apt_lists == 4
    assert parse_probe([]).apt_lists is None
    assert p.root_free_gb == 50.0
    assert p.secure_boot.enabled is False
    assert p.apt_locks_held == ("/var/lib/dpkg/lock-frontend",)
    assert p.lock_holders == "unattended-upgr"
    assert p.reboot_pending
    assert p.machine_id == "0123abcd"
    assert p.headers_candidate == "6.1.76-1"
    assert p.candidates == {"linux-modules-nvidia-580-server-open-6.8.0-45-generic": None}
    assert p.kernels == {"6.1.0-18-amd64": None, "6.1.0-47-amd64": "6.1.170-3"}


def test_apt_candidate_none_when_apt_has_no_version() -> None:
    assert parse_apt_candidate("foo:\n  Installed: (none)\n  Candidate: (none)\n") is None
    assert parse_apt_candidate("foo:\n  Installed: (none)\n  Candidate: 1.2-3\n") == "1.2-3"


def test_unsupported_os_is_refused() -> None:
    focal = replace(os_info("ubuntu-22.04-jammy"), version_id="20.04", pretty_name="Ubuntu 20.04.6 LTS")
    verdict = preflight.judge(focal, probe(), NO_GPU, [], Settings(), nvidia_runs=False)
    assert verdict.problems == [
        "Ubuntu 20.04.6 LTS is not supported (supported: debian 12, ubuntu 22.04, ubuntu 24.04)"
    ]


def test_low_root_space_is_refused_with_the_numbers() -> None:
    verdict = preflight.judge(
        os_info("debian-12-bookworm"),
        probe(root_free_gb=3.5),
        NO_GPU,
        [],
        Settings(min_root_free_gb=20),
        nvidia_runs=False,
    )
    assert verdict.problems == ["only 3.5 GB free on /, 20 GB needed (free space, or lower min_root_free_gb)"]


def test_missing_data_disk_is_an_error_before_anything_changes() -> None:
    disks = [disk("vda", "ROOT", ("/",)), disk("vdb", "NVME-DATA-0001")]
    settings = Settings(data_disks=["NVME-DATA-0001", "/dev/disk/by-id/virtio-NVME-DATA-0009"])
    verdict = preflight.judge(
        os_info("debian-12-bookworm"), probe(), NO_GPU, disks, settings, False, volumes_runs=True, hostname="gpu1"
    )
    assert len(verdict.problems) == 1
    assert verdict.problems[0].startswith("data disk /dev/disk/by-id/virtio-NVME-DATA-0009 does not exist")


def test_system_disk_as_data_disk_is_refused() -> None:
    disks = [disk("vda", "ROOT", ("/",))]
    verdict = preflight.judge(
        os_info("debian-12-bookworm"),
        probe(),
        NO_GPU,
        disks,
        Settings(data_disks=["ROOT"]),
        False,
        volumes_runs=True,
        hostname="gpu1",
    )
    assert verdict.problems == ["data disk ROOT (vda) holds the running system (/); remove it from data_disks"]


def test_foreign_data_on_a_data_disk_stops_the_host_in_preflight_only_when_volumes_runs() -> None:
    ext4 = replace(disk("vdb", "NVME-DATA-0001"), fstype="ext4")
    disks = [disk("vda", "ROOT", ("/",)), ext4]
    settings = Settings(data_disks=["NVME-DATA-0001"])
    bookworm = os_info("debian-12-bookworm")
    with_volumes = preflight.judge(
        bookworm, probe(), NO_GPU, disks, settings, False, volumes_runs=True, hostname="gpu1"
    )
    assert len(with_volumes.problems) == 1
    assert with_volumes.problems[0].startswith("refusing to format /dev/disk/by-id/virtio-NVME-DATA-0001 (vdb)")
    assert "provision up --force-format gpu1:" in with_volumes.problems[0]
    # `up --only base`: the disks are not this run's business.
    assert preflight.judge(bookworm, probe(), NO_GPU, disks, settings, False).problems == []


def test_secure_boot_on_debian_gpu_host_stops_with_advice() -> None:
    sb = probe(secure_boot=parse_sb_state("SecureBoot enabled", efi=True))
    verdict = preflight.judge(os_info("debian-12-bookworm"), sb, Gpus((H100,), ()), [], Settings(), True)
    assert len(verdict.problems) == 1
    assert "enroll a MOK" in verdict.problems[0]
    assert "disable Secure Boot" in verdict.problems[0]


def test_secure_boot_ignored_where_the_nvidia_step_does_not_run() -> None:
    sb = probe(secure_boot=parse_sb_state("SecureBoot enabled", efi=True))
    assert preflight.judge(os_info("debian-12-bookworm"), sb, NO_GPU, [], Settings(), False).problems == []


def test_missing_kernel_headers_stop_a_gpu_host() -> None:
    verdict = preflight.judge(
        os_info("ubuntu-24.04.3-noble"), probe(headers_candidate=None), Gpus((H100,), ()), [], Settings(), True
    )
    assert verdict.problems[0].startswith("no linux-headers-6.8.0-45-generic in the apt sources")


def test_an_image_without_apt_lists_is_not_refused_for_what_apt_cannot_know_yet() -> None:
    """Before any apt update every candidate reads "none": headers and Canonical's signed
    modules are then the nvidia step's to check, after base has read the lists."""
    unread = probe(apt_lists=0, headers_candidate=None, secure_boot=parse_sb_state("SecureBoot enabled", efi=True))
    noble = os_info("ubuntu-24.04.3-noble")
    verdict = preflight.judge(noble, unread, Gpus((H100,), ()), [], Settings(), True)
    assert verdict.problems == []
    assert any("signed modules exist is checked by the nvidia step" in n for n in verdict.notes)
    assert any("kernel headers are checked by the nvidia step" in n for n in verdict.notes)
    # With lists read, the same answers are real refusals; Debian under Secure Boot never has
    # signed modules, lists or not.
    assert (
        len(preflight.judge(noble, replace(unread, apt_lists=3), Gpus((H100,), ()), [], Settings(), True).problems) == 2
    )
    debian = preflight.judge(os_info("debian-12-bookworm"), unread, Gpus((H100,), ()), [], Settings(), True)
    assert len(debian.problems) == 1
    assert "enroll a MOK" in debian.problems[0]


def test_newest_installed_kernel_without_headers_stops_a_gpu_host() -> None:
    """The reboot after the driver install boots it, and DKMS could not build for it."""
    pending = probe(
        headers_candidate="5.15.0-185.195",
        kernels={"5.15.0-185-generic": "5.15.0-185.195", "6.8.0-60-generic": None, "5.15.0-91-generic": None},
    )
    verdict = preflight.judge(os_info("ubuntu-22.04-jammy"), pending, Gpus((H100,), ()), [], Settings(), True)
    assert verdict.problems == [
        "no linux-headers-6.8.0-60-generic in the apt sources: the driver cannot be built for kernel "
        "6.8.0-60-generic, the newest installed, which the next boot runs; remove that kernel's package or "
        "add the repository that has its headers"
    ]
    assert (
        preflight.judge(
            os_info("ubuntu-22.04-jammy"), pending, Gpus((H100,), ()), [], Settings(nvidia_kernel_headers=False), True
        ).problems
        == []
    )


def test_gpu_generation_chooses_modules_and_is_noted() -> None:
    hopper = preflight.judge(os_info("ubuntu-22.04-jammy"), probe(), Gpus((H100,), ()), [], Settings(), True)
    pascal = preflight.judge(os_info("ubuntu-22.04-jammy"), probe(), Gpus((P100,), ()), [], Settings(), True)
    assert any("-> open modules" in n for n in hopper.notes)
    assert any("-> proprietary modules" in n for n in pascal.notes)
    forced = preflight.judge(
        os_info("ubuntu-22.04-jammy"), probe(), Gpus((P100,), ()), [], Settings(nvidia_kernel_modules="open"), True
    )
    assert "older than Turing" in forced.problems[0]


def test_pending_reboot_is_a_note_not_a_refusal() -> None:
    verdict = preflight.judge(os_info("debian-12-bookworm"), probe(reboot_pending=True), NO_GPU, [], Settings(), False)
    assert verdict.problems == []
    assert "reboot was already pending" in verdict.notes[0]


def test_deploy_refuses_host_with_reason_and_adds_nothing_else() -> None:
    fake = FakeHost(Os=os_info("debian-12-bookworm"), Probe=probe(root_free_gb=1.0))
    ops, refusals = plan_with_facts(preflight.step, node(), fake)
    assert refusals == ["only 1.0 GB free on /, 20 GB needed (free space, or lower min_root_free_gb)"]
    assert [o.name for o in ops] == ["Preflight | preflight checks"]
    assert ops[0].commands == [
        "echo 'only 1.0 GB free on /, 20 GB needed (free space, or lower min_root_free_gb)' >&2; exit 1"
    ]


def test_deploy_checks_data_disks_when_the_volumes_step_is_in_the_run() -> None:
    from provision.deploys import volumes

    fake = FakeHost(Os=os_info("debian-12-bookworm"), BlockDevices=[disk("vda", "ROOT", ("/",))])
    gpu1 = node("gpu1", data_disks=["NVME-DATA-0009"])
    _, refusals = plan_with_facts(preflight.step, gpu1, fake, steps=[preflight.step, volumes.step])
    assert len(refusals) == 1
    assert refusals[0].startswith("data disk NVME-DATA-0009 does not exist")
    assert plan_with_facts(preflight.step, gpu1, fake) == ([], [])  # volumes not in this run


def test_deploy_on_a_healthy_host_changes_nothing() -> None:
    fake = FakeHost(Os=os_info("debian-12-bookworm"))
    assert plan_with_facts(preflight.step, node(), fake) == ([], [])


def test_deploy_waits_bounded_for_a_held_apt_lock() -> None:
    fake = FakeHost(
        Os=os_info("debian-12-bookworm"),
        Probe=probe(apt_locks_held=("/var/lib/dpkg/lock-frontend",), lock_holders="unattended-upgr"),
    )
    ops, refusals = plan_with_facts(preflight.step, node(apt_lock_wait_s=120), fake)
    assert refusals == []
    assert [o.name for o in ops] == ["Preflight | Wait for apt/dpkg lock (unattended-upgr)"]
    assert ops[0].commands == [preflight.lock_wait_command(120)]
    assert "end=$(( $(date +%s) + 120 ))" in ops[0].commands[0]


def test_deploy_asks_ubuntu_for_signed_module_candidates() -> None:
    fake = FakeHost(Os=os_info("ubuntu-24.04.3-noble"), NvidiaDevices=Gpus((H100,), ()))
    plan_with_facts(preflight.step, node(), fake)
    asked = dict(fake.asked)["Probe"]
    assert asked == {
        "packages": (
            "linux-modules-nvidia-580-server-open-6.8.0-45-generic",
            "linux-modules-nvidia-580-server-6.8.0-45-generic",
        ),
        "user": "train",
        "uid": 2000,
    }


def test_held_packages_count_as_installed():
    # After the first run the driver is held: dpkg reports "hi", and the fabric manager step
    # must still find the driver's version to match (a second run failed on exactly this).
    from provision.facts.probes import parse_holds

    installed, held = parse_holds(
        ["pkg nvidia-open-580 580.95.05-1 hi ", "pkg fio 3.33-3 ii ", "pkg old 1.0 rc ", "hold nvidia-open-580"]
    )
    assert installed == {"nvidia-open-580": "580.95.05-1", "fio": "3.33-3"}
    assert held == {"nvidia-open-580"}


def test_training_account_with_another_uid_is_refused_and_a_taken_uid_named() -> None:
    bookworm = os_info("debian-12-bookworm")
    other = preflight.judge(bookworm, probe(user_uid=1000, group_gid=1000), NO_GPU, [], Settings(), False)
    assert other.problems == [
        "user train exists with uid 1000, training_uid is 2000 (set training_uid: 1000 for every node, "
        "or renumber train by hand)",
        "group train exists with gid 1000, training_uid is 2000 (set training_uid to match on every node, "
        "or renumber the group by hand)",
    ]
    taken = preflight.judge(bookworm, probe(uid_owner="alice", gid_owner="alice"), NO_GPU, [], Settings(), False)
    assert taken.problems == [
        "uid 2000 (training_uid) belongs to user alice; choose a free training_uid",
        "gid 2000 (training_uid) belongs to group alice; choose a free training_uid",
    ]
    ours = probe(user_uid=2000, uid_owner="train", group_gid=2000, gid_owner="train")
    assert preflight.judge(bookworm, ours, NO_GPU, [], Settings(), False).problems == []


def test_probe_reads_the_training_account_lines() -> None:
    p = parse_probe(["user_uid=2000", "uid_owner=train", "group_gid=", "gid_owner="])
    assert (p.user_uid, p.uid_owner, p.group_gid, p.gid_owner) == (2000, "train", None, "")


def test_nvidia_checks_apply_only_when_the_nvidia_step_is_in_the_run() -> None:
    # `up --skip nvidia` on a Secure Boot Debian GPU host: nothing of this run needs the driver.
    from provision.deploys import base, nvidia

    secure = probe(secure_boot=parse_sb_state("SecureBoot enabled", efi=True))
    fake = FakeHost(Os=os_info("debian-12-bookworm"), NvidiaDevices=Gpus((H100,), ()), Probe=secure)
    skip_nvidia = [preflight.step, base.step]
    assert plan_with_facts(preflight.step, node(), fake, steps=skip_nvidia) == ([], [])
    _, refusals = plan_with_facts(preflight.step, node(), fake, steps=[*skip_nvidia, nvidia.step])
    assert len(refusals) == 1
    assert "enroll a MOK" in refusals[0]


def test_a_gpu_host_that_is_not_x86_64_is_refused_when_the_nvidia_step_would_run() -> None:
    gh200 = replace(os_info("ubuntu-24.04.3-noble"), arch="aarch64")
    refused = preflight.judge(gh200, probe(), Gpus((H100,), ()), [], Settings(), nvidia_runs=True)
    assert refused.problems == [
        "architecture aarch64 (uname -m): the nvidia step supports x86_64 only, aarch64 is not supported "
        "yet; set nvidia: skip for this host or run with --skip nvidia"
    ]
    # Without the nvidia step an aarch64 host gets base, storage and frameworks as usual.
    assert preflight.judge(gh200, probe(), Gpus((H100,), ()), [], Settings(), nvidia_runs=False).problems == []


def test_an_aarch64_gpu_host_stops_in_preflight_before_base_changes_it() -> None:
    from provision.deploys import base, nvidia

    fake = FakeHost(Os=replace(os_info("ubuntu-22.04-jammy"), arch="aarch64"), NvidiaDevices=Gpus((H100,), ()))
    _, refusals = plan_with_facts(preflight.step, node(), fake, steps=[preflight.step, base.step, nvidia.step])
    assert len(refusals) == 1
    assert refusals[0].startswith("architecture aarch64 (uname -m)")
