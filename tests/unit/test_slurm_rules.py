"""The slurm step's pure rules: slurm.conf, gres.conf and cgroup.conf from a node's facts, for
an 8x H100 node, a 4x A100 node, a CPU-only node and a captured Debian 12 VM.

GPU names are NVML's own, from captured nvidia-smi output (tests/fixtures); CPU topology and
memory of the GPU servers are their vendors' published figures (no lscpu of them was
captured), the VM's are parsed by the real facts from a capture (fleet_profiles/debian12-cpu)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provision.engine import fact_batch
from provision.facts.gpus import Gpus, NvmlGpu, PciDevice
from provision.facts.host import HOST_FACTS
from provision.facts.system import CpuInfo
from provision.rules import slurm
from tests.standins.fleet_standin import profile

FIXTURES = Path(__file__).parents[1] / "fixtures"
GIB = 2**30


def _nvml(names: list[str], minors: list[int | None] | None = None) -> Gpus:
    minors = list(range(len(names))) if minors is None else minors
    return Gpus(
        pci=(),
        nvml=tuple(
            NvmlGpu(i, n, f"00000000:{i:02x}:00.0", 81559, "590.48.01", minor)
            for i, (n, minor) in enumerate(zip(names, minors, strict=True))
        ),
    )


def _captured_names(fixture: str, pattern: str) -> list[str]:
    return re.findall(pattern, (FIXTURES / fixture).read_text())


# DGX H100: 2x Xeon Platinum 8480C (56 cores each, 2 threads a core), 2 TiB.
DGX_H100 = CpuInfo("Intel(R) Xeon(R) Platinum 8480C", 2, 112, 224, (), 2)
# A 4x A100 SXM4 server (e.g. Dell XE8545): 2x EPYC 7763 (64 cores each, SMT on), 1 TiB.
XE8545 = CpuInfo("AMD EPYC 7763 64-Core Processor", 2, 128, 256, (), 8)
# A CPU node: 1x EPYC 9654 (96 cores, SMT off), 384 GiB.
CPU_NODE = CpuInfo("AMD EPYC 9654 96-Core Processor", 1, 96, 96, (), 1)


def _vm() -> tuple[CpuInfo, int, Gpus]:
    (command,) = [c for c in profile("debian12-cpu") if c.startswith("echo '@@provision-fact begin os'")][:1]
    answers = fact_batch.answers(HOST_FACTS, profile("debian12-cpu")[command]["stdout"])
    return answers["cpu"].value, answers["memory"].value, answers["gpus"].value


def test_an_8x_h100_node_declares_its_topology_memory_and_eight_h100s():
    names = _captured_names("nvidia-smi-a_8x-h100-sxm5-80gb.txt", r"Product Name\s+: (.+)")
    assert len(names) == 8
    node = slurm.node_from_facts("gpu01", "10.0.0.11", DGX_H100, 2048 * GIB, _nvml(names))
    line = slurm.node_line(node)
    assert line.startswith("NodeName=gpu01 NodeAddr=10.0.0.11 CPUs=224 Sockets=2 CoresPerSocket=56 ThreadsPerCore=2 ")
    assert "Gres=gpu:h100:8" in line
    assert node.real_memory_mib == 2048 * 1024 - 16 * 1024  # the margin's 16 GiB ceiling
    assert slurm.gres_conf(node).splitlines()[1:] == [
        f"NodeName=gpu01 Name=gpu Type=h100 File=/dev/nvidia{i}" for i in range(8)
    ]


def test_a_4x_a100_node_names_its_gpus_a100():
    (name,) = _captured_names("nvidia-smi-q-x_a100-sxm4-40gb-mig_510.47.03.xml", r"<product_name>(.+)</product_name>")
    node = slurm.node_from_facts("a100-1", "10.0.0.12", XE8545, 1024 * GIB, _nvml([name] * 4))
    assert (node.sockets, node.cores_per_socket, node.threads_per_core) == (2, 64, 2)
    assert "Gres=gpu:a100:4" in slurm.node_line(node)
    assert len(slurm.gres_conf(node).splitlines()) == 5


def test_each_gpu_is_declared_with_its_own_device_file_when_minor_numbers_are_not_the_index():
    # The 2x RTX A5000 capture: NVML index 0 is minor 1 and index 1 is minor 0. gres.conf keeps
    # NVML's (CUDA's) order and names each GPU's own file.
    xml = (FIXTURES / "nvidia-smi-q-x_2x-rtx-a5000_590.44.01.xml").read_text()
    minors = [int(m) for m in re.findall(r"<minor_number>(\d+)</minor_number>", xml)]
    names = _captured_names("nvidia-smi-q-x_2x-rtx-a5000_590.44.01.xml", r"<product_name>(.+)</product_name>")
    node = slurm.node_from_facts("ws", "10.0.0.20", CPU_NODE, 256 * GIB, _nvml(names, minors))
    assert minors == [1, 0]
    assert slurm.gres_conf(node).splitlines()[1:] == [
        "NodeName=ws Name=gpu Type=rtx_a5000 File=/dev/nvidia1",
        "NodeName=ws Name=gpu Type=rtx_a5000 File=/dev/nvidia0",
    ]


def test_a_gpu_without_a_known_device_file_is_not_declared_and_is_counted_apart():
    node = slurm.node_from_facts("n", "10.0.0.1", DGX_H100, 2048 * GIB, _nvml(["NVIDIA H100 80GB HBM3"] * 2, [0, None]))
    assert (node.gpu_count, node.gpus_without_driver, node.gpu_files) == (1, 1, ("/dev/nvidia0",))
    assert "Gres=gpu:h100:1" in slurm.node_line(node)


def test_a_cpu_node_has_no_gres_and_an_empty_gres_conf():
    node = slurm.node_from_facts("cpu1", "10.0.0.13", CPU_NODE, 384 * GIB, Gpus(pci=(), nvml=()))
    assert "Gres=" not in slurm.node_line(node)
    assert (node.threads_per_core, node.cores_per_socket) == (1, 96)
    assert node.real_memory_mib == 384 * 1024 - int(384 * 1024 * 0.03)
    assert slurm.gres_conf(node) == slurm.GRES_HEAD


def test_the_captured_vm_is_described_from_its_own_lscpu_and_meminfo():
    cpu, memory, gpus = _vm()
    node = slurm.node_from_facts("node1", "10.77.0.11", cpu, memory, gpus)
    assert node.cpus == cpu.threads >= 1
    assert node.sockets * node.cores_per_socket * node.threads_per_core == node.cpus
    assert 0 < node.real_memory_mib < memory // 2**20
    assert node.gpu_count == 0


def test_gpus_seen_only_on_the_pci_bus_are_not_declared_until_the_driver_answers():
    # gres.conf would name /dev/nvidia0..3, which only the driver creates: slurmd would not start.
    pci = tuple(
        PciDevice(f"0000:{i:02x}:00.0", "0302", "2330", "NVIDIA Corporation GH100 [H100 SXM5 80GB]") for i in range(4)
    )
    node = slurm.node_from_facts("n", "10.0.0.1", DGX_H100, 2048 * GIB, Gpus(pci=pci, nvml=()))
    assert (node.gpu_type, node.gpu_count, node.gpus_without_driver) == (None, 0, 4)
    assert "Gres=" not in slurm.node_line(node)
    assert slurm.gres_type(pci[0].description) == "h100"


def test_ubuntu_2204_is_the_one_release_whose_slurm_cannot_run_on_cgroup_v2():
    assert "21.08" in (slurm.unsupported("ubuntu", "22.04") or "")
    assert slurm.unsupported("ubuntu", "24.04") is None
    assert slurm.unsupported("debian", "12") is None


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-40GB", "a100"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla T4", "t4"),
        ("NVIDIA RTX A5000", "rtx_a5000"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA Corporation GH100 [H100 SXM5 80GB]", "h100"),
        ("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtx_pro_6000_blackwell_max_q_workstation_edition"),
        ("", "gpu"),
    ],
)
def test_gres_types_are_short_model_names(name, wanted):
    assert slurm.gres_type(name) == wanted


@pytest.mark.parametrize(("mib", "margin"), [(1024, 256), (16 * 1024, 491), (2048 * 1024, 16 * 1024)])
def test_real_memory_sits_a_bounded_margin_below_memtotal(mib, margin):
    assert slurm.real_memory_mib(mib * 2**20) == mib - margin


def test_slurm_conf_is_one_text_for_the_cluster_with_every_node_and_one_partition():
    nodes = [
        slurm.node_from_facts("gpu01", "10.0.0.11", DGX_H100, 2048 * GIB, _nvml(["NVIDIA H100 80GB HBM3"] * 8)),
        slurm.node_from_facts("cpu1", "10.0.0.13", CPU_NODE, 384 * GIB, Gpus(pci=(), nvml=())),
    ]
    conf = slurm.ClusterConf("lab", "gpu01", "10.0.0.11", "main", "01:00:00", "/usr/local/sbin/health", 60)
    text = slurm.slurm_conf(conf, nodes)
    lines = text.splitlines()
    assert "SlurmctldHost=gpu01(10.0.0.11)" in lines
    for wanted in (
        "SelectType=select/cons_tres",
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
    ):
        assert wanted in lines
    assert [line.split()[0] for line in lines if line.startswith("NodeName=")] == ["NodeName=gpu01", "NodeName=cpu1"]
    assert lines[-1] == "PartitionName=main Nodes=gpu01,cpu1 Default=YES DefaultTime=01:00:00 State=UP"
    assert slurm.slurm_conf(conf, nodes) == text  # the same input, the same bytes: one checksum on every node
    assert "ConstrainDevices=yes" in slurm.cgroup_conf()


# --- the node health check -------------------------------------------------------------------


def test_health_mounts_are_the_data_volume_and_every_share_where_those_steps_make_them():
    from provision.settings import Settings

    s = Settings()
    assert slurm.health_mounts(s, data_volume=True, nfs=True) == [
        "/data",
        "/shared/datasets",
        "/shared/checkpoints",
        "/shared/scratch",
    ]
    assert slurm.health_mounts(s, data_volume=False, nfs=False) == []


def test_the_health_script_quotes_every_rendered_value_and_knows_its_gpus_and_driver():
    text = slurm.health_script("gpu01", 8, "580.*", ["/data", "/shared/it's"])
    assert text.startswith("#!/bin/bash\n")
    assert "\nNODE=gpu01\nGPUS=8\nDRIVER='580.*'  # " in text
    assert "\nMOUNTS=(/data '/shared/it'\"'\"'s')\n" in text
    assert f"\nPATH={slurm.HEALTH_PATH}\n" in text
    assert f"\nSTATE={slurm.HEALTH_STATE}\n" in text
    assert f"\nFULL_AT={slurm.FULL_AT_PERCENT}\nPROBE_S={slurm.PROBE_S}\nSLURM_S={slurm.SLURM_S}\n" in text
    # Slurm kills the program at 60 s: the probes, then sinfo, then one scontrol, each bounded.
    assert slurm.PROBE_S + 2 * slurm.SLURM_S <= 30
    assert "{{" not in text
    assert "{%" not in text


def test_the_driver_is_held_to_the_pin_not_to_what_happened_to_be_loaded():
    from provision.settings import Settings

    assert slurm.driver_pattern(Settings()) == "580.*"
    assert slurm.driver_pattern(Settings(nvidia_driver_version="580.95.05-0ubuntu0.24.04.1")) == "580.95.05"
    assert slurm.driver_pattern(Settings(nvidia="skip")) == "*"  # not provision's driver: any


def test_slurm_conf_runs_the_health_check_on_nodes_in_any_state_so_it_can_resume_them():
    conf = slurm.ClusterConf("c", "head", "10.0.0.1", "main", "01:00:00", slurm.HEALTH_PROGRAM, 60)
    text = slurm.slurm_conf(conf, [])
    assert f"HealthCheckProgram={slurm.HEALTH_PROGRAM}\nHealthCheckInterval=60\nHealthCheckNodeState=ANY\n" in text


# --- reboots on a running cluster --------------------------------------------------------------


def test_a_reboot_drains_with_its_own_reason_takes_over_only_the_health_checks_and_fails_closed():
    text = slurm.drain_for_reboot("node-7", 900)
    assert text.startswith("systemctl is-enabled --quiet slurmd.service")  # not a Slurm node: nothing
    assert f"State=DRAIN Reason='{slurm.REBOOT_REASON}'" in text
    # Its own or no reason: drained; the health check's: taken over; anyone else's: left.
    assert f"  none|'{slurm.HEALTH_PREFIX}'*) timeout 30 scontrol update" in text
    assert '  *) echo "left as it was (someone else\'s): $now" ;;' in text
    # Fails closed: no state read, or squeue not answering, is no reboot.
    assert "cannot read $n's state in Slurm: not rebooted" in text
    assert 'jobs="(squeue did not answer)"' in text
    assert "end=$(( $(date +%s) + 900 ))" in text
    assert "jobs still running on $n after 900 s" in text
    assert slurm.REBOOT_REASON.startswith("provision: reboot:")


def test_after_a_reboot_only_the_reboots_own_drain_is_resumed_and_a_silent_controller_fails():
    text = slurm.resume_after_reboot("node-7")
    assert "n=node-7\n" in text
    assert "'provision: reboot:'*) timeout 30 scontrol update NodeName=\"$n\" State=RESUME && exit 0 ;;" in text
    assert text.count("State=RESUME") == 1
    assert text.rstrip().endswith("exit 1")


def test_a_node_name_enters_the_reboot_shell_once_quoted_and_is_used_only_as_a_variable():
    text = slurm.drain_for_reboot("n$(reboot)", 60) + slurm.resume_after_reboot("n$(reboot)")
    assert text.count("n$(reboot)") == 2
    assert text.count("n='n$(reboot)'\n") == 2
