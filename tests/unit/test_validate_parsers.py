"""Parsers on real captured outputs (tests/fixtures, provenance in SOURCES.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provision.validate import agent_stream, parsers

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_fio_json_gives_bandwidth_and_iops_per_job():
    jobs = parsers.fio_jobs(read("fio-json_randrw_nvme0n1_fio-3.16.json"))
    job = jobs["rand_read_write"]
    assert job.read_bytes_per_s == 348743777
    assert job.read_iops == pytest.approx(85138.89, rel=1e-6)
    assert job.write_iops == pytest.approx(85066.13, rel=1e-6)
    assert job.error == 0


def test_fio_json_after_warning_lines_still_parses():
    text = "fio: file hash not empty on exit\n" + read("fio-json_randrw_nvme0n1_fio-3.16.json")
    assert "rand_read_write" in parsers.fio_jobs(text)


def test_fio_without_json_is_a_parse_error():
    with pytest.raises(parsers.ParseError, match="no JSON"):
        parsers.fio_jobs("fio: failed to open /data/x: Permission denied\n")


def test_iperf3_json_reports_received_bits_per_second():
    r = parsers.iperf3(read("iperf3-J_tcp-1stream-10s_gcp-gke-pod_iperf-3.9.json"))
    assert r.bits_per_second == pytest.approx(511824309.05)
    assert r.streams == 1
    assert r.seconds == pytest.approx(10.077332)


def test_iperf3_error_document_is_a_parse_error():
    with pytest.raises(parsers.ParseError, match="unable to connect"):
        parsers.iperf3(
            json.dumps(
                {"start": {}, "intervals": [], "end": {}, "error": "unable to connect to server: Connection refused"}
            )
        )


def test_nvidia_smi_xml_a100_sxm4_80gb():
    (gpu,) = parsers.nvidia_smi_xml(read("nvidia-smi-q-x_a100-sxm4-80gb-mig_535.54.03.xml"))
    assert gpu.name == "NVIDIA A100-SXM4-80GB"
    assert gpu.pci_device_id == 0x20B2
    assert (gpu.pcie_gen_max, gpu.pcie_width_max) == (4, 16)
    assert gpu.ecc_uncorrected == 0
    assert gpu.ecc_corrected == 0
    assert gpu.driver_version == "535.54.03"
    assert gpu.cuda_version == "12.2"
    assert gpu.memory_mib == 81920
    assert gpu.persistence_mode is False


def test_nvidia_smi_xml_a100_40gb_older_schema():
    (gpu,) = parsers.nvidia_smi_xml(read("nvidia-smi-q-x_a100-sxm4-40gb-mig_510.47.03.xml"))
    assert gpu.pci_device_id == 0x20B0
    assert gpu.pcie_gen_device_max is None  # DTD v11 has no device max
    assert gpu.pcie_gen_current == 4


def test_nvidia_smi_xml_sees_gen5_gpu_in_gen4_slot():
    (gpu,) = parsers.nvidia_smi_xml(read("nvidia-smi-q-x_rtx-pro-6000-blackwell-maxq_590.44.01.xml"))
    assert gpu.pcie_gen_device_max == 5
    assert gpu.pcie_gen_max == 4
    assert gpu.pcie_gen_current == 1  # idle link
    assert gpu.ecc_uncorrected is None  # ECC off: N/A everywhere
    assert gpu.retired_pages is None  # Ampere and newer remap rows instead of retiring pages
    assert (gpu.remapped_rows_uncorrectable, gpu.remap_pending, gpu.remap_failure) == (0, False, False)
    assert gpu.remap_failure is False


def test_nvidia_smi_xml_two_gpus_keep_their_minor_numbers():
    gpus = parsers.nvidia_smi_xml(read("nvidia-smi-q-x_2x-rtx-a5000_590.44.01.xml"))
    assert sorted(g.index for g in gpus) == [0, 1]
    assert {g.bus_id for g in gpus} == {"00000000:81:00.0", "00000000:C1:00.0"}


def test_nvidia_smi_text_8x_h100_sxm():
    gpus = parsers.nvidia_smi_text(read("nvidia-smi-a_8x-h100-sxm5-80gb.txt"))
    assert len(gpus) == 8
    assert {g.pci_device_id for g in gpus} == {0x2330}
    assert {(g.pcie_gen_max, g.pcie_width_max) for g in gpus} == {(5, 16)}
    assert all(g.throttle_active == () for g in gpus)  # "Idle: Active" is not a throttle
    assert gpus[0].driver_version == "565.57.01"
    assert gpus[0].retired_pages is None
    assert gpus[0].remapped_rows_uncorrectable == 0
    assert gpus[0].remap_pending is False


def test_nvidia_smi_text_h200_and_h100_nvl():
    (h200,) = parsers.nvidia_smi_text(read("nvidia-smi-a_1x-h200.txt"))
    assert h200.name == "NVIDIA H200"
    assert h200.pci_device_id == 0x2335
    nvl = parsers.nvidia_smi_text(read("nvidia-smi-a_2x-h100-nvl.txt"))
    assert [g.pci_device_id for g in nvl] == [0x2321, 0x2321]


def test_nvidia_smi_text_without_gpu_sections_is_a_parse_error():
    with pytest.raises(parsers.ParseError):
        parsers.nvidia_smi_text("NVIDIA-SMI has failed because it couldn't communicate with the driver")


def test_nvml_device_id_drops_vendor_half():
    assert parsers.nvml_device_id(0x233010DE) == 0x2330


def agent_lines(*lines: dict) -> str:
    """The agent's stdout: one JSON object per line, as agent.Results writes them."""
    return "".join(json.dumps(line) + "\n" for line in lines)


START = {"type": "start", "agent": agent_stream.AGENT_SCHEMA, "mode": "quick", "deadline_s": 480}
CPU_PLAN = {"phase": "cpu", "budget_s": 30, "metrics": ["cpu_gemm_gflops", "cpu_gemm_peak_fraction"], "device": ""}
RAM_PLAN = {"phase": "ram", "budget_s": 30, "metrics": ["ram_triad_gbs"], "device": ""}


def row(metric: str, value: float | None, not_run: str = "", device: str = "") -> dict:
    return {"type": "row", "metric": metric, "device": device, "value": value, "not_run": not_run, "detail": ""}


def test_agent_output_with_nvidia_smi_fallback():
    inventory = {
        "type": "inventory",
        "hostname": "n1",
        "inventory": {"cpu": {"cores": 2}},
        "gpus": [],
        "nvidia_smi_xml": read("nvidia-smi-q-x_a100-sxm4-80gb-mig_535.54.03.xml"),
    }
    text = agent_lines(
        START,
        inventory,
        {"type": "plan", "phases": []},
        row("ram_triad_gbs", 12.5),
        row("disk_seq_read_mibs", None, "not run: fio missing"),
        {"type": "end", "errors": []},
    )
    report = agent_stream.agent_output("noise\n" + text, "node1")
    assert report.gpus[0].pci_device_id == 0x20B2
    assert report.measurements[0].node == "node1"
    assert report.measurements[0].value == 12.5
    assert report.measurements[1].value is None
    assert report.measurements[1].not_run == "not run: fio missing"
    assert report.stopped_in == ""


def test_agent_output_of_other_schema_is_refused():
    with pytest.raises(parsers.ParseError, match="schema"):
        agent_stream.agent_output(agent_lines({**START, "agent": 99}), "n")


def test_agent_output_of_the_one_document_agent_is_refused():
    with pytest.raises(parsers.ParseError, match="no start line"):
        agent_stream.agent_output(json.dumps({"agent": 1, "results": []}), "n")


def test_agent_output_leaves_a_gpu_nvml_could_not_read_out_of_the_inventory():
    gpus = [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "pci_device_id": 0x2330},
        {"index": 1, "error": "NVMLError_GpuIsLost: GPU is lost"},
    ]
    text = agent_lines(
        START,
        {"type": "inventory", "gpus": gpus},
        row("gpu_hbm_gbs", None, "not run: NVML ...", "gpu1"),
        {"type": "end", "errors": []},
    )
    report = agent_stream.agent_output(text, "n1")
    assert [g.index for g in report.gpus] == [0]
    assert report.measurements[0].device == "gpu1"


def test_agent_cut_off_mid_phase_keeps_every_row_and_times_out_the_rest_naming_the_phase():
    text = (
        agent_lines(
            START,
            {"type": "inventory", "hostname": "n1", "inventory": {}, "gpus": []},
            {"type": "plan", "phases": [CPU_PLAN, RAM_PLAN]},
            {"type": "phase", "phase": "cpu", "state": "start"},
            row("cpu_gemm_gflops", 3.5),
        )
        + '{"type": "row", "metric": "cpu_gemm_pe'
    )  # killed in the middle of a line
    report = agent_stream.agent_output(text, "n1")
    got = {m.metric: m for m in report.measurements}
    assert got["cpu_gemm_gflops"].value == 3.5
    assert got["cpu_gemm_peak_fraction"].not_run == "not run: timed out after 480 s (the agent's deadline) in phase cpu"
    assert got["ram_triad_gbs"].not_run == (
        "not run: timed out after 480 s (the agent's deadline) in phase cpu, before ram"
    )
    assert report.stopped_in == "cpu"
    assert report.deadline_s == 480


def test_agent_cut_off_before_its_plan_stopped_in_start_up():
    report = agent_stream.agent_output(agent_lines(START), "n1")
    assert report.stopped_in == agent_stream.STARTUP
    assert report.measurements == ()


def test_nvidia_smi_xml_reads_ecc_mode_volatile_counts_mig_and_compute_mode():
    (a100,) = parsers.nvidia_smi_xml(read("nvidia-smi-q-x_a100-sxm4-40gb-mig_510.47.03.xml"))
    assert (a100.ecc_mode, a100.ecc_uncorrected, a100.ecc_uncorrected_volatile) == ("enabled", 0, None)
    assert (a100.mig_mode, a100.mig_mode_pending) == ("enabled", "enabled")
    assert [(d.gpu_instance_id, d.memory_mib) for d in a100.mig_devices] == [(1, 19968), (2, 19968)]
    assert a100.compute_mode == "default"
    a5000 = parsers.nvidia_smi_xml(read("nvidia-smi-q-x_2x-rtx-a5000_590.44.01.xml"))
    assert {(g.ecc_mode, g.mig_mode, g.sram_threshold_exceeded) for g in a5000} == {("disabled", None, None)}
