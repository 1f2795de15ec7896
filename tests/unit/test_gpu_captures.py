"""The agent's NVML reads and the judge's verdicts, driven through the real nvidia-ml-py
module with the NVML stand-in fed from captured nvidia-smi output of real GPUs."""

from __future__ import annotations

import types
from dataclasses import replace

import pytest

from provision.validate import agent, agent_stream, judge, parsers
from tests.helpers.agent_stream import agent_lines
from tests.standins import nvml_from_captures as nvml


def inventory(stand_in_nvml, model: str | nvml.StandInNvmlLibrary, **changes) -> list[dict]:
    stand_in_nvml(model, **changes)
    gpus, xml, why = agent.gpu_inventory()
    assert (xml, why) == ("", "")
    return gpus


def judged(gpus: list[dict], results: list[dict] | None = None):
    """The agent's document as the controller parses it, then the judge's NodeResult."""
    doc = {"agent": agent.SCHEMA, "hostname": "h", "gpus": gpus, "results": results or [], "inventory": {}}
    report = agent_stream.agent_output(agent_lines(doc), "n")
    (result,) = judge.judge([judge.NodeInput("n", list(report.measurements), list(report.gpus))])
    return result


def verdicts(result) -> dict[str, str]:
    """Finding name -> verdict, for findings other than pass and other than a value the
    driver reports as N/A (first GPU's wins)."""
    out: dict[str, str] = {}
    for f in result.findings:
        if f.verdict != "pass" and not (f.verdict == "not_run" and f.reason.startswith(judge.BENIGN_NOT_RUN)):
            out.setdefault(f.metric, f.verdict)
    return out


# Per captured model: name, PCI device id, framebuffer, SKU label, verdict, what is not a pass.
MODELS = {
    "h100-sxm": ("NVIDIA H100 80GB HBM3", 0x2330, 81559, "H100-SXM", "pass", {}),
    "h200": ("NVIDIA H200", 0x2335, 143771, "H200-SXM", "pass", {}),
    # The lent H200 (a one-GPU VM): NVML gives no NVLink state there, which warns; under the
    # burn its sw_power_cap is active, which is no hardware slowdown and no finding (the burn
    # itself is the other process named).
    "h200-580": ("NVIDIA H200", 0x2335, 143771, "H200-SXM", "warn", {"gpu_nvlink_up": "warn"}),
    "h200-580-burn": (
        "NVIDIA H200",
        0x2335,
        143771,
        "H200-SXM",
        "warn",
        {"gpu_nvlink_up": "warn", "gpu_other_processes": "warn"},
    ),
    "h100-sxm-mig": ("NVIDIA H100 80GB HBM3", 0x2330, 81559, "H100-SXM", "warn", {"gpu_mig": "warn"}),
    "a100-40gb-mig": ("NVIDIA A100-SXM4-40GB", 0x20B0, 40960, "A100-SXM4-40GB", "warn", {"gpu_mig": "warn"}),
    "a100-80gb-mig": ("NVIDIA A100-SXM4-80GB", 0x20B2, 81920, "A100-SXM4-80GB", "warn", {"gpu_mig": "warn"}),
    "rtx-a5000-x2": (
        "NVIDIA RTX A5000",
        0x2231,
        24564,
        "unknown SKU: NVIDIA RTX A5000",
        "warn",
        {"gpu_ecc_mode": "warn", "gpu_other_processes": "warn"},
    ),
    "rtx-pro-6000": (
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        0x2BB4,
        97887,
        "unknown SKU: NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "fail",  # the capture's Gen5 GPU sits in a Gen4 host link
        {"gpu_ecc_mode": "warn", "gpu_other_processes": "warn", "gpu_pcie_gen": "fail"},
    ),
    "a10g": ("NVIDIA A10G", 0x0000, 23028, "unknown SKU: NVIDIA A10G", "warn", {"gpu_other_processes": "warn"}),
    "t4": ("Tesla T4", 0x1EB8, 15360, "unknown SKU: Tesla T4", "warn", {"gpu_other_processes": "warn"}),
}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_agent_reads_every_captured_gpu_through_the_real_pynvml(stand_in_nvml, model):
    name, device_id, memory, _, _, _ = MODELS[model]
    gpus = inventory(stand_in_nvml, model)
    assert [g.get("error") for g in gpus] == [None] * len(gpus)
    assert {(g["name"], g["pci_device_id"], g["memory_mib"]) for g in gpus} == {(name, device_id, memory)}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_judge_gives_each_captured_gpu_its_verdict(stand_in_nvml, model):
    _, _, _, sku, verdict, not_passed = MODELS[model]
    result = judged(inventory(stand_in_nvml, model))
    assert result.sku == sku
    assert verdicts(result) == not_passed
    assert result.verdict == verdict


def test_the_lent_h200_at_its_power_cap_is_read_as_power_capped_and_not_slowed_by_hardware(stand_in_nvml):
    (idle,) = inventory(stand_in_nvml, "h200-580")
    (burn,) = inventory(stand_in_nvml, "h200-580-burn")
    assert "sw_power_cap" not in idle["throttle_active"]
    assert burn["throttle_active"] == ["sw_power_cap"]
    assert not set(burn["throttle_active"]) & set(agent.HW_SLOWDOWN)


# --- memory errors, as NVIDIA's GPU Memory Error Management guide reads them ----------------

U, C = 1, 0  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED / _CORRECTED
VOLATILE, AGGREGATE = 0, 1  # NVML_VOLATILE_ECC / NVML_AGGREGATE_ECC


def test_ecc_mode_is_read_as_enabled_or_disabled(stand_in_nvml):
    a5000 = inventory(stand_in_nvml, "rtx-a5000-x2")
    assert {g["ecc_mode"] for g in a5000} == {"disabled"}
    (h100,) = inventory(stand_in_nvml, "h100-sxm")
    assert h100["ecc_mode"] == "enabled"
    (blackwell,) = inventory(stand_in_nvml, "rtx-pro-6000")
    (f,) = [f for f in judged([blackwell]).findings if f.metric == "gpu_ecc_mode"]
    assert f.verdict == "warn"
    assert "ECC is disabled" in f.reason


def test_volatile_and_aggregate_counts_are_read_apart(stand_in_nvml):
    ecc = {(U, VOLATILE): 2, (C, VOLATILE): 7, (U, AGGREGATE): 5, (C, AGGREGATE): 40}
    (g,) = inventory(stand_in_nvml, "h100-sxm", ecc=ecc)
    assert (g["ecc_uncorrected_volatile"], g["ecc_corrected_volatile"]) == (2, 7)
    assert (g["ecc_uncorrected"], g["ecc_corrected"]) == (5, 40)


def test_aggregate_uncorrectable_count_alone_warns_and_never_fails(stand_in_nvml):
    ecc = {(U, VOLATILE): 0, (C, VOLATILE): 0, (U, AGGREGATE): 5, (C, AGGREGATE): 40}
    result = judged(inventory(stand_in_nvml, "h100-sxm", ecc=ecc))
    assert verdicts(result) == {"gpu_ecc_history": "warn"}
    assert result.verdict == "warn"


def test_volatile_uncorrectable_errors_fail(stand_in_nvml):
    ecc = {(U, VOLATILE): 2, (C, VOLATILE): 0, (U, AGGREGATE): 2, (C, AGGREGATE): 0}
    result = judged(inventory(stand_in_nvml, "h100-sxm", ecc=ecc))
    (f,) = [f for f in result.findings if f.metric == "gpu_ecc_uncorrected"]
    assert (f.verdict, f.value) == ("fail", 2.0)
    assert result.verdict == "fail"


def test_uncorrectable_remapped_rows_are_history_and_warn(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "h200", remapped_rows=(4, 3, 0, 0))
    assert (g["remapped_rows_correctable"], g["remapped_rows_uncorrectable"]) == (4, 3)
    result = judged([g])
    assert verdicts(result) == {"gpu_ecc_history": "warn"}
    (f,) = [f for f in result.findings if f.metric == "gpu_ecc_history"]
    assert "3 rows remapped for uncorrectable errors" in f.reason


def test_pending_remap_warns_to_reset_the_gpu(stand_in_nvml):
    result = judged(inventory(stand_in_nvml, "h100-sxm", remapped_rows=(0, 1, 1, 0)))
    (f,) = [f for f in result.findings if f.metric == "gpu_remap_pending"]
    assert f.verdict == "warn"
    assert "reset the GPU" in f.reason
    assert result.verdict == "warn"


def test_remap_failure_fails(stand_in_nvml):
    result = judged(inventory(stand_in_nvml, "a100-80gb-mig", mig_mode=(0, 0), remapped_rows=(0, 9, 0, 1)))
    assert verdicts(result)["gpu_remap_failure"] == "fail"
    assert result.verdict == "fail"


def test_sram_threshold_flag_is_read_and_fails(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "h100-sxm", sram_threshold_exceeded=1)
    assert g["sram_threshold_exceeded"] is True
    assert verdicts(judged([g])) == {"gpu_sram_threshold": "fail"}


def test_sram_threshold_is_unknown_where_nvml_has_no_such_query(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "t4")
    assert g["sram_threshold_exceeded"] is None


def test_pending_page_retirement_on_an_older_gpu_warns(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "t4", retired_pending=1, processes=())
    assert g["retired_pages_pending"] is True
    assert verdicts(judged([g])) == {"gpu_retired_pages_pending": "warn"}


# --- NVLink, MIG, processes, compute mode ---------------------------------------------------


def test_twelve_of_eighteen_nvlinks_up_fails_an_h100_sxm(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "h100-sxm", nvlinks=(1,) * 12 + (0,) * 6)
    assert (g["nvlink_up"], g["nvlink_links"]) == (12, 18)
    (f,) = [f for f in judged([g]).findings if f.metric == "gpu_nvlink_up"]
    assert (f.verdict, f.value, f.expectation) == ("fail", 12.0, 18.0)
    assert "12 of 18 NVLink links up" in f.reason


def test_all_eighteen_nvlinks_of_the_captured_h200_pass(stand_in_nvml):
    (f,) = [f for f in judged(inventory(stand_in_nvml, "h200")).findings if f.metric == "gpu_nvlink_up"]
    assert (f.verdict, f.value) == ("pass", 18.0)


def test_nvlink_is_not_judged_on_a_board_without_a_table_entry(stand_in_nvml):
    result = judged(inventory(stand_in_nvml, "t4", nvlinks=(0, 0, 0, 0), processes=()))
    assert [f for f in result.findings if f.metric == "gpu_nvlink_up"] == []


def test_mig_devices_are_listed_with_their_memory(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "h100-sxm-mig")
    assert (g["mig_mode"], g["mig_mode_pending"]) == ("enabled", "enabled")
    assert [(d["gpu_instance_id"], d["memory_mib"]) for d in g["mig_devices"]] == [
        (2, 40448),
        (3, 20096),
        (9, 9984),
        (10, 9984),
    ]


class StandInCudaTorch:
    """Test stand-in for torch with CUDA up; records whether a benchmark started."""

    def __init__(self, count: int) -> None:
        self.cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: count)


def test_mig_gpu_is_said_not_to_be_benchmarked_and_warns(stand_in_nvml, monkeypatch):
    gpus = inventory(stand_in_nvml, "a100-40gb-mig")
    benched: list[int] = []
    monkeypatch.setattr(agent, "gpu_phases", lambda *args: benched.append(1) or [])
    res = agent.Results()
    counts, phases = agent._gpu_steps(
        StandInCudaTorch(2), "", agent.MODES["quick"], (gpus, "", agent.NO_GPU), {"gpu"}, res
    )
    assert benched == []
    assert phases == []  # no GPU phase runs on a MIG GPU
    assert counts == {}  # CUDA counts MIG devices: no NVML/CUDA comparison
    assert {r["metric"] for r in res.rows} == set(agent.GPU_METRICS)
    assert all(r["not_run"].startswith(agent.MIG_NOT_RUN) for r in res.rows)
    assert "MIG devices of 19968+19968 MiB" in res.rows[0]["not_run"]
    result = judged(gpus, res.rows)
    assert result.verdict == "warn"
    assert {f.verdict for f in result.findings if f.metric.startswith("gpu_bf16")} == {"not_run"}


def test_another_process_on_the_gpu_warns_naming_it(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "h100-sxm-loaded")
    assert [(p["pid"], p["name"]) for p in g["processes"]] == [
        (11327, "/root/tools/memhog"),
        (11328, "/root/tools/memhog"),
        (11345, "./gpu_burn"),
    ]
    (f,) = [f for f in judged([g]).findings if f.metric == "gpu_other_processes"]
    assert f.verdict == "warn"
    assert "pid 11345 (./gpu_burn, 15690 MiB)" in f.reason


def test_the_agent_does_not_count_itself_as_another_process(stand_in_nvml, monkeypatch):
    monkeypatch.setattr(agent.os, "getpid", lambda: 11345)
    (g,) = inventory(stand_in_nvml, "h100-sxm-loaded")
    assert [p["pid"] for p in g["processes"]] == [11327, 11328]


def test_exclusive_process_compute_mode_is_reported(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "h100-sxm", compute_mode=3)  # NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert g["compute_mode"] == "exclusive_process"
    (f,) = [f for f in judged([g]).findings if f.metric == "gpu_compute_mode"]
    assert f.verdict == "warn"
    assert "one process per GPU" in f.reason


def test_prohibited_compute_mode_fails(stand_in_nvml):
    (g,) = inventory(stand_in_nvml, "h100-sxm", compute_mode=2)  # NVML_COMPUTEMODE_PROHIBITED
    assert verdicts(judged([g])) == {"gpu_compute_mode": "fail"}


def test_one_lost_gpu_keeps_the_other_captured_gpu(stand_in_nvml):
    library = nvml.stand_in_library("rtx-a5000-x2")
    library.capture.gpus[0] = replace(library.capture.gpus[0], lost=True)
    gpus = inventory(stand_in_nvml, library)
    assert gpus[0] == {"index": 0, "error": "NVMLError_GpuIsLost: GPU is lost"}
    assert gpus[1]["bus_id"] == "00000000:C1:00.0"


XML_MODELS = sorted(model for model, (filename, _) in nvml.CAPTURES.items() if filename.endswith(".xml"))
SHARED_FIELDS = (
    "name",
    "pci_device_id",
    "memory_mib",
    "pcie_gen_max",
    "pcie_width_max",
    "ecc_mode",
    "ecc_uncorrected",
    "ecc_uncorrected_volatile",
    "remapped_rows_uncorrectable",
    "remap_pending",
    "mig_mode",
    "compute_mode",
)


@pytest.mark.parametrize("model", XML_MODELS)
def test_nvml_and_the_nvidia_smi_xml_parser_agree_on_each_capture(stand_in_nvml, model):
    """Two readers of one capture: the agent through NVML, the controller's XML parser (the
    path taken where pynvml is missing) must describe the same GPUs."""
    via_nvml = [parsers.gpu_from_nvml(g) for g in inventory(stand_in_nvml, model)]
    via_xml = parsers.nvidia_smi_xml((nvml.FIXTURES / nvml.CAPTURES[model][0]).read_text())

    def described(gpus):
        return [tuple(getattr(g, f) for f in SHARED_FIELDS) for g in gpus]

    assert described(via_nvml) == described(via_xml)
    assert [[d.memory_mib for d in g.mig_devices] for g in via_nvml] == [
        [d.memory_mib for d in g.mig_devices] for g in via_xml
    ]
